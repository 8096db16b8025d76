"""The engine's two ways into a database agree: upgrading gives exactly the schema that a new
database gets from sql/structure/ and sql/functions/; and a function is changed in its file alone.

A development database (installed before the engine was written once, by the numbered migrations
kept in tests/data/dev_migrations/) is made one migration at a time, with queues made at every
version (so that the upgrade must bring existing queues up to date): plain, unlogged and mixed-case
queues, and from the version that brings them notify triggers, FIFO indexes, topic bindings,
partitioned queues and archives (when the server has pg_partman), policies (which the generated
route functions write in) and least-privilege roles. It is then upgraded to the current version.
Another database is installed new and gets the same queues in the same order. Their catalogs, and
the rows the engine keeps about its queues, must be identical; so must a development database
upgraded in one go, by either driver (sync or asyncio). Release upgrades (sql/upgrades/) are
followed by the same comparison once there are any: a database installed new records every
version, so it is compared with what the upgrades make.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any, cast

import psycopg
import pytest
from psycopg import sql

from pgbroker import _sql as engine
from pgbroker._db.api_keys import list_keys
from pgbroker._db.install import install, install_roles
from pgbroker._db.install_async import install_async
from pgbroker._db.install_rules import InstallResult, latest_version, named
from pgbroker._sql import BASELINE, DEV_MINIMUM, SqlFile
from tests.support.dev_schema import dev_migrations, install_dev
from tests.support.postgres import fresh_database
from tests.support.tables import Conn

SCHEMAS = ("pgmq", "pgbroker")
PARTMAN_SCHEMA = "partman"

# Each query returns rows that describe one kind of catalog object by name, never by oid, in a
# stable order. $1 is the array of schema names.
CATALOG_QUERIES: dict[str, str] = {
    "relations": """
        SELECT n.nspname, c.relname, c.relkind, c.relpersistence, c.reloptions::text,
               -- No ACL means the owner's default one: a REVOKE of the last grant leaves that explicit.
               coalesce(c.relacl,
                        acldefault(CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END::"char", c.relowner))::text,
               pg_get_partkeydef(c.oid), c.relispartition, obj_description(c.oid, 'pg_class')
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY(%(schemas)s)
        ORDER BY 1, 2
    """,
    "columns": """
        SELECT n.nspname, c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, a.attidentity, a.attgenerated, pg_get_expr(d.adbin, d.adrelid),
               co.collname, col_description(c.oid, a.attnum)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0
        WHERE n.nspname = ANY(%(schemas)s) AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY 1, 2, 3
    """,
    "indexes": """
        SELECT n.nspname, c.relname, pg_get_indexdef(i.indexrelid), i.indisprimary, i.indisunique
        FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY(%(schemas)s)
        ORDER BY 1, 2
    """,
    "constraints": """
        SELECT n.nspname, coalesce(r.relname, ''), coalesce(t.typname, ''), con.conname, con.contype,
               pg_get_constraintdef(con.oid), con.condeferrable, con.condeferred
        FROM pg_constraint con
        JOIN pg_namespace n ON n.oid = con.connamespace
        LEFT JOIN pg_class r ON r.oid = con.conrelid
        LEFT JOIN pg_type t ON t.oid = con.contypid
        WHERE n.nspname = ANY(%(schemas)s)
        ORDER BY 1, 2, 3, 4
    """,
    "functions": """
        SELECT n.nspname, p.proname, pg_get_function_identity_arguments(p.oid), p.prokind,
               CASE WHEN p.prokind = 'a' THEN NULL ELSE pg_get_functiondef(p.oid) END,
               -- Grants by grantee: their order says when each was made, which does not matter (an
               -- upgrade grants the roles' entry points again, after a queue grant made earlier).
               (SELECT array_agg(a::text ORDER BY a::text) FROM unnest(p.proacl) a)::text,
               obj_description(p.oid, 'pg_proc')
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = ANY(%(schemas)s)
        ORDER BY 1, 2, 3
    """,
    "types": """
        SELECT n.nspname, t.typname, t.typtype, t.typcategory, format_type(t.typbasetype, t.typtypmod),
               t.typnotnull, t.typdefault,
               (SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder)::text
                FROM pg_enum e WHERE e.enumtypid = t.oid)
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = ANY(%(schemas)s)
        ORDER BY 1, 2
    """,
    "type_attributes": """
        SELECT n.nspname, t.typname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod)
        FROM pg_type t
        JOIN pg_namespace n ON n.oid = t.typnamespace
        JOIN pg_class c ON c.oid = t.typrelid AND c.relkind = 'c'
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        WHERE n.nspname = ANY(%(schemas)s)
        ORDER BY 1, 2, 3
    """,
    "triggers": """
        SELECT n.nspname, c.relname, tg.tgname, pg_get_triggerdef(tg.oid), tg.tgenabled
        FROM pg_trigger tg
        JOIN pg_class c ON c.oid = tg.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY(%(schemas)s) AND NOT tg.tgisinternal
        ORDER BY 1, 2, 3
    """,
    "sequences": """
        SELECT n.nspname, c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement,
               s.seqmax, s.seqmin, s.seqcache, s.seqcycle
        FROM pg_sequence s
        JOIN pg_class c ON c.oid = s.seqrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ANY(%(schemas)s)
        ORDER BY 1, 2
    """,
    "views": """
        SELECT schemaname, viewname, definition FROM pg_views
        WHERE schemaname = ANY(%(schemas)s)
        ORDER BY 1, 2
    """,
    "policies": """
        SELECT schemaname, tablename, policyname, permissive, roles::text, cmd, qual, with_check
        FROM pg_policies WHERE schemaname = ANY(%(schemas)s)
        ORDER BY 1, 2, 3
    """,
    "schemas": """
        SELECT nspname, nspacl::text, obj_description(oid, 'pg_namespace') FROM pg_namespace
        WHERE nspname = ANY(%(schemas)s)
        ORDER BY 1
    """,
    "default_privileges": """
        SELECT n.nspname, d.defaclobjtype, d.defaclacl::text
        FROM pg_default_acl d JOIN pg_namespace n ON n.oid = d.defaclnamespace
        WHERE n.nspname = ANY(%(schemas)s)
        ORDER BY 1, 2
    """,
    "dependent_extensions": """
        SELECT e.extname FROM pg_extension e ORDER BY 1
    """,
    "versions": """
        SELECT version, name, checksum FROM pgbroker.schema_version ORDER BY version
    """,
    "functions_applied": "SELECT checksum FROM pgbroker.schema_functions",
    # Rows the engine keeps about its queues and roles, less what differs by clock alone
    # (timestamps; queue_head, which reads move at random). role_function and queue_scoped_function
    # are written by the structure files and the upgrades themselves.
    "role_functions": """
        SELECT role_kind, function_schema, function_name FROM pgbroker.role_function ORDER BY 1, 2, 3
    """,
    "role_sets": "SELECT prefix FROM pgbroker.role_sets ORDER BY 1",
    "queue_grants": """
        SELECT grantee::text, role_kind, pattern, like_pattern FROM pgbroker.queue_grant ORDER BY 1, 2, 3
    """,
    "queue_scoped_functions": """
        SELECT role_kind, function_schema, function_name FROM pgbroker.queue_scoped_function ORDER BY 1, 2, 3
    """,
    "queues": "SELECT queue_name, is_partitioned, is_unlogged FROM pgmq.meta ORDER BY 1",
    "queue_policies": """
        SELECT queue_name, max_deliveries, backoff, backoff_base_seconds, backoff_max_seconds,
               backoff_jitter, dead_letter_queue, ack_mode, max_depth, archive_retention_seconds,
               archive_max_rows
        FROM pgbroker.queue_policy ORDER BY 1
    """,
    "notify_throttles": """
        SELECT queue_name, throttle_interval_ms FROM pgmq.notify_insert_throttle ORDER BY 1
    """,
    "topic_bindings": "SELECT pattern, queue_name, compiled_regex FROM pgmq.topic_bindings ORDER BY 1, 2",
    "partition_retention": "SELECT queue_name, retention FROM pgbroker.partition_retention ORDER BY 1",
}

# pg_partman's configuration of the queues' tables, when it is created in the database.
PARTMAN_CONFIG = sql.SQL(
    "SELECT parent_table, control, partition_interval, premake, retention, retention_keep_table,"
    " infinite_time_partitions, automatic_maintenance, template_table"
    " FROM {}.part_config WHERE parent_table LIKE 'pgmq.%%' ORDER BY 1"
).format(sql.Identifier(PARTMAN_SCHEMA))

# The functions pgbroker._write_routes generates, one per hot operation, holding every queue.
ROUTE_FUNCTIONS = ("_route_ack", "_route_deliver", "_route_pop", "_route_read", "_route_send")

Snapshot = dict[str, list[tuple[Any, ...]]]


def catalog_snapshot(conn: Conn) -> Snapshot:
    """Every catalog fact about schemas pgmq and pgbroker that a migration could change."""
    params = {"schemas": list(SCHEMAS)}
    snapshot = {kind: conn.execute(query, params).fetchall() for kind, query in CATALOG_QUERIES.items()}
    has_partman = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_partman')")
    if cast(tuple[bool], has_partman.fetchone())[0]:
        snapshot["partman_config"] = conn.execute(PARTMAN_CONFIG).fetchall()
    return snapshot


def assert_same_catalog(upgraded: Snapshot, fresh: Snapshot) -> None:
    assert upgraded.keys() == fresh.keys()
    for kind in upgraded:
        only_upgraded = sorted(set(upgraded[kind]) - set(fresh[kind]), key=repr)
        only_fresh = sorted(set(fresh[kind]) - set(upgraded[kind]), key=repr)
        assert (kind, only_upgraded, only_fresh) == (kind, [], []), "catalogs differ"
        assert upgraded[kind] == fresh[kind], kind


# -- what each version can make ---------------------------------------------------------------


def has_partman_on_server(conn: Conn) -> bool:
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_partman')")
    return bool(cast(tuple[bool], row.fetchone())[0])


def create_partman(conn: Conn) -> None:
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(PARTMAN_SCHEMA)))
    conn.execute(sql.SQL("CREATE EXTENSION pg_partman SCHEMA {}").format(sql.Identifier(PARTMAN_SCHEMA)))


# Queues made after the upgrade to the current version, with every feature: a development version
# number after the last one.
CURRENT = dev_migrations()[-1].version + 1
# The development version that brought queue grants.
QUEUE_SCOPES = 26


def queues_of_version(version: int) -> list[tuple[str, str]]:
    """The plain queues made at development ``version`` (or CURRENT): (pgmq function, queue name)."""
    return [
        ("create", f"plain_v{version}"),
        ("create_unlogged", f"unlogged_v{version}"),
        ("create_non_partitioned", f"Mixed_Case_v{version}"),
    ]


def make_queues(conn: Conn, version: int, *, roles: str | None = None) -> None:
    """Queues and the engine's per-queue objects, with what the schema at ``version`` offers.

    Called in the same order on a database being upgraded (at each version) and on a new one (at
    the latest), so both must end with the same catalog. ``roles``: the prefix of the
    least-privilege roles, made at version 10.
    """
    plain, unlogged, mixed = (name for _, name in queues_of_version(version))
    for function, name in queues_of_version(version):
        conn.execute(sql.SQL("SELECT pgmq.{}(%s)").format(sql.Identifier(function)), [name])
        conn.execute("SELECT pgmq.send(%s, %s::jsonb)", [name, f'{{"v": {version}}}'])
    if version >= 3:
        conn.execute("SELECT pgmq.enable_notify_insert(%s, 100)", [mixed])
    if version >= 4:
        conn.execute("SELECT pgmq.create_fifo_index(%s)", [plain])
    if version >= 5:
        conn.execute("SELECT pgmq.bind_topic(%s, %s)", [f"v{version}.#", plain])
    if version >= 6 and conn.execute("SELECT to_regnamespace(%s)", [PARTMAN_SCHEMA]).fetchone() != (None,):
        partitioned = f"partitioned_v{version}"
        conn.execute("SELECT pgmq.create_partitioned(%s, '10', '100', 2)", [partitioned])
        conn.execute("SELECT pgmq.send_batch(%s, array_fill('{}'::jsonb, ARRAY[25]))", [partitioned])
        conn.execute("SELECT pgmq.convert_archive_partitioned(%s, '10', '100', 2)", [unlogged])
    if version >= 8:
        conn.execute("SELECT pgbroker.set_policy(%s, max_deliveries => 3, max_depth => 1000)", [plain])
        conn.execute(
            "SELECT pgbroker.set_policy(%s, ack_mode => 'delete', dead_letter_queue => %s)", [mixed, plain]
        )
    if version == 10 and roles is not None:
        install_roles(conn, roles)
    if version == QUEUE_SCOPES and roles is not None:
        # A role given one queue (a server's role: the other database made it already).
        scoped = f"{roles}_scoped"
        if conn.execute("SELECT to_regrole(%s)", [scoped]).fetchone() == (None,):
            conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(scoped)))
        conn.execute("SELECT pgbroker.grant_queue_access('consumer', %s, %s)", [scoped, plain])


@contextmanager
def role_prefix(pg_admin_dsn: str, *dsns: str) -> Iterator[str]:
    """A prefix for least-privilege roles, unique to the test; the roles (which belong to the whole
    server) are dropped afterwards, their grants first, in each database that made them."""
    prefix = f"m{uuid.uuid4().hex[:10]}"
    try:
        yield prefix
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            existing = admin.execute(
                "SELECT rolname FROM pg_roles WHERE rolname LIKE %s ORDER BY 1", [f"{prefix}\\_%"]
            ).fetchall()
        roles = [sql.Identifier(name) for (name,) in existing]
        if roles:
            for dsn in dsns:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.SQL(", ").join(roles)))
            with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.SQL(", ").join(roles)))


class RecordingConnection:
    """A connection, as install() uses it, that remembers the statements it ran."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.statements: list[str | sql.Composable] = []

    def transaction(self) -> AbstractContextManager[Any]:
        return self.conn.transaction()

    def execute(self, query: str | sql.Composable, params: Any = None) -> psycopg.Cursor[Any]:
        self.statements.append(query)
        return self.conn.execute(cast(Any, query), params)


def no_setup(conn: Conn) -> None:
    pass


def ran(recorder: RecordingConnection, files: tuple[SqlFile, ...]) -> list[str]:
    """The names of the files whose SQL the recorded install ran, in the order it ran them."""
    by_text = {f.sql: f.name for f in files}
    return [by_text[s] for s in recorder.statements if isinstance(s, str) and s in by_text]


def install_new(dsn: str, setup: Callable[[Conn], None]) -> Conn:
    """Connect to an empty database, run ``setup``, install pgbroker, and check that it came
    from the engine's files: each of them ran, once, and no upgrade did."""
    conn = psycopg.connect(dsn, autocommit=True)
    setup(conn)
    recorder = RecordingConnection(conn)
    assert install(cast(Conn, recorder)) == InstallResult(None, latest_version())
    assert ran(recorder, engine.new_install()) == [f.name for f in engine.new_install()]
    upgrades = (*(u.file for u in engine.upgrades()), engine.dev_upgrade())
    assert ran(recorder, upgrades) == []
    return conn


# -- tests ------------------------------------------------------------------------------------


@pytest.fixture
def other_empty_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A second empty database."""
    with fresh_database(pg_admin_dsn, "template0") as fresh:
        yield fresh


def test_a_development_database_upgraded_gives_the_schema_of_a_new_install(
    pg_admin_dsn: str, empty_dsn: str, other_empty_dsn: str
) -> None:
    versions = [m.version for m in dev_migrations()]
    with ExitStack() as stack:
        prefix = stack.enter_context(role_prefix(pg_admin_dsn, empty_dsn, other_empty_dsn))
        upgraded = stack.enter_context(psycopg.connect(empty_dsn, autocommit=True))
        partman = has_partman_on_server(upgraded)
        if partman:
            create_partman(upgraded)
        for version in versions:
            install_dev(upgraded, version)
            make_queues(upgraded, version, roles=prefix)
        assert install(upgraded) == InstallResult(f"{BASELINE}.dev{versions[-1]}", latest_version())
        make_queues(upgraded, CURRENT)
        upgraded_catalog = catalog_snapshot(upgraded)

        fresh = stack.enter_context(install_new(other_empty_dsn, create_partman if partman else no_setup))
        for version in [*versions, CURRENT]:
            make_queues(fresh, version, roles=prefix)
        fresh_catalog = catalog_snapshot(fresh)

    # The snapshots see what was made: every queue, the routes holding them, the roles' grants.
    made = len(versions) + 1
    assert len(upgraded_catalog["queues"]) == 3 * made + (made - 5 if partman else 0)
    routes = [row for row in upgraded_catalog["functions"] if row[1] in ROUTE_FUNCTIONS]
    assert [row[1] for row in routes] == sorted(ROUTE_FUNCTIONS)
    assert all(f"plain_v{CURRENT}" in row[4] for row in routes)
    assert any(f"{prefix}_consumer=X" in (row[5] or "") for row in upgraded_catalog["functions"])
    assert len(upgraded_catalog["role_sets"]) == 1
    assert [row[2] for row in upgraded_catalog["queue_grants"]] == [f"plain_v{QUEUE_SCOPES}"]
    assert any(f"{prefix}_scoped=X" in (row[5] or "") for row in upgraded_catalog["functions"])
    if partman:
        assert any(row[0].startswith("pgmq.a_unlogged_v") for row in upgraded_catalog["partman_config"])
    assert_same_catalog(upgraded_catalog, fresh_catalog)


def install_by(driver: str, dsn: str) -> InstallResult:
    """install() or install_async() on a new connection to ``dsn``."""
    if driver == "sync":
        with psycopg.connect(dsn, autocommit=True) as conn:
            return install(conn)

    async def run() -> InstallResult:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await install_async(conn)

    return asyncio.run(run())


@pytest.mark.parametrize("driver", ["sync", "asyncio"])
def test_a_development_database_upgraded_in_one_go_gives_the_schema_of_a_new_install(
    empty_dsn: str, other_empty_dsn: str, driver: str
) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as upgraded:
        install_dev(upgraded)
        make_queues(upgraded, DEV_MINIMUM)
    assert install_by(driver, empty_dsn) == InstallResult(f"{BASELINE}.dev{DEV_MINIMUM}", latest_version())
    with psycopg.connect(empty_dsn, autocommit=True) as upgraded:
        make_queues(upgraded, CURRENT)
        upgraded_catalog = catalog_snapshot(upgraded)
    with install_new(other_empty_dsn, no_setup) as fresh:
        make_queues(fresh, DEV_MINIMUM)
        make_queues(fresh, CURRENT)
        fresh_catalog = catalog_snapshot(fresh)
    assert_same_catalog(upgraded_catalog, fresh_catalog)


def test_an_upgraded_stream_has_only_the_read_function_of_this_release(empty_dsn: str) -> None:
    """Each stream has its own read function, made from a template; 0.2.0 changed its arguments
    (every partition of a segment in one call), and CREATE OR REPLACE with new arguments makes a
    second function beside the first: drop_stream, which drops it by name, then failed."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        install_dev(conn)
        conn.execute("SELECT pgbroker.create_stream('clicks', 2)")
        conn.execute("SELECT pgbroker.create_stream_group('clicks', 'g', 'start')")
        conn.execute("SELECT pgbroker.stream_send('clicks', '{\"n\": 1}')")
        install(conn)
        reads = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE proname = 's_clicks_read'"
            " AND pronamespace = 'pgbroker'::regnamespace"
        ).fetchone()
        assert reads == (1,)
        rows = conn.execute("SELECT message FROM pgbroker.stream_read('clicks', 'g', 'c')").fetchall()
        assert rows == [({"n": 1},)]
        assert conn.execute("SELECT pgbroker.drop_stream('clicks')").fetchone() == (True,)


def test_an_api_key_made_before_group_patterns_keeps_every_group(empty_dsn: str) -> None:
    """0.2.0 limits HTTP keys to consumer groups by patterns; a key made before has every group,
    as it had: the consumers that run on it go on after the upgrade."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        install_dev(conn)
        conn.execute(
            "INSERT INTO pgbroker.api_keys (name, hash, queues, scopes)"
            " VALUES ('old', %s, '{clicks}', '{read}')",
            [bytes(32)],
        )
        install(conn)
        [key] = list_keys(conn)
        assert (key.queues, key.groups, key.sees_group("analytics")) == (("clicks",), ("*",), True)


def test_an_upgraded_group_drops_the_retry_queue_it_made_and_keeps_the_one_it_took_over(
    empty_dsn: str,
) -> None:
    """0.2.0 drops a group's retry queue with the group when the group made it, which 0.1.0 did not
    record: the upgrade tells by the queue's creation time (a group made its queue in its own
    transaction)."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        install_dev(conn)
        conn.execute("SELECT pgbroker.create_stream('clicks', 1)")
        conn.execute("SELECT pgmq.create('clicks_old_retry')")
        conn.execute("SELECT pgbroker.create_stream_group('clicks', 'old')")
        conn.execute("SELECT pgbroker.create_stream_group('clicks', 'made')")
        install(conn)
        made = "SELECT group_name, retry_queue_made FROM pgbroker.stream_group ORDER BY 1"
        assert conn.execute(made).fetchall() == [("made", True), ("old", False)]
        conn.execute("SELECT pgbroker.drop_stream('clicks')")
        assert conn.execute("SELECT queue_name FROM pgmq.meta").fetchall() == [("clicks_old_retry",)]


def test_a_development_database_keeps_pg_monitor_reading_payloads_when_it_was_allowed(empty_dsn: str) -> None:
    """Before 0025 pg_monitor read every queue table, and the upgrade takes that back (the catalog
    comparisons above); after it, reading them is an operator's choice, which the upgrade keeps."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        install_dev(conn, dev_migrations()[-1].version)
        conn.execute("SELECT pgmq.create('watched')")
        conn.execute("SELECT pgbroker.grant_pg_monitor_payloads(true)")
        install(conn)
        conn.execute("SELECT pgmq.create('watched_later')")
        for table in ("pgmq.q_watched", "pgmq.a_watched", "pgmq.q_watched_later"):
            row = conn.execute("SELECT has_table_privilege('pg_monitor', %s, 'SELECT')", [table]).fetchone()
            assert row == (True,), table


def test_the_asyncio_installer_installs_the_same_schema(empty_dsn: str, other_empty_dsn: str) -> None:
    assert install_by("asyncio", empty_dsn) == InstallResult(None, latest_version())
    with psycopg.connect(empty_dsn, autocommit=True) as installed:
        make_queues(installed, CURRENT)
        installed_catalog = catalog_snapshot(installed)
    with install_new(other_empty_dsn, no_setup) as fresh:
        make_queues(fresh, CURRENT)
        assert_same_catalog(installed_catalog, catalog_snapshot(fresh))


def test_installing_again_changes_no_catalog_object(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        make_queues(conn, CURRENT)
        before = catalog_snapshot(conn)
        install(conn)
        assert_same_catalog(catalog_snapshot(conn), before)


def test_snapshot_notices_a_changed_function_body(dsn: str) -> None:
    """The comparison is not vacuous: a redefined function shows up as a difference."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        before = catalog_snapshot(conn)
        conn.execute(
            "CREATE OR REPLACE FUNCTION pgmq.format_table_name(queue_name text, prefix text) RETURNS text"
            " LANGUAGE sql AS $$ SELECT prefix || '_' || queue_name $$"
        )
        after = catalog_snapshot(conn)
    assert before["functions"] != after["functions"]
    assert {k: v for k, v in before.items() if k != "functions"} == {
        k: v for k, v in after.items() if k != "functions"
    }


# -- functions: written once, re-applied when they change -------------------------------------

EDITED_FUNCTION = "pgmq.format_table_name(text,text)"
BODY_LINE = (
    "    PERFORM pgbroker._pgmq_check_characters(queue_name);\n    RETURN lower(prefix || '_' || queue_name);"
)
EDIT = (BODY_LINE, BODY_LINE + "  -- edited")


def edit_functions() -> tuple[SqlFile, ...]:
    """The function files with one line of one function's body changed, as a developer would."""
    files = engine.functions()
    assert sum(f.sql.count(EDIT[0]) for f in files) == 1
    return tuple(SqlFile(f.name, f.sql.replace(*EDIT)) for f in files)


def definition(conn: Conn, signature: str) -> tuple[str, bool, list[str] | None]:
    """A function's definition, whether it is SECURITY DEFINER, and its settings."""
    row = conn.execute(
        "SELECT pg_get_functiondef(%s::regprocedure), prosecdef, proconfig FROM pg_proc"
        " WHERE oid = %s::regprocedure",
        [signature, signature],
    ).fetchone()
    assert row is not None
    return cast(tuple[str, bool, list[str] | None], row)


def test_installing_again_runs_no_function_file_when_none_changed(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        recorder = RecordingConnection(conn)
        assert install(cast(Conn, recorder)) == InstallResult(latest_version(), latest_version())
        assert ran(recorder, engine.functions()) == []


def test_an_edited_function_reaches_an_installed_database_on_the_next_install(
    pg_admin_dsn: str, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with role_prefix(pg_admin_dsn, dsn) as prefix, psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgmq.create('jobs')")
        install_roles(conn, prefix)
        send = "pgmq.send(text,jsonb,integer)"
        entry_point = definition(conn, send)
        assert entry_point[1], "grant_roles makes a role's entry points SECURITY DEFINER"
        assert EDIT[1] not in definition(conn, EDITED_FUNCTION)[0]
        routes_before = catalog_snapshot(conn)["functions"]

        edited_functions = edit_functions()
        monkeypatch.setattr(engine, "functions", lambda: edited_functions)
        recorder = RecordingConnection(conn)
        assert install(cast(Conn, recorder)) == InstallResult(latest_version(), latest_version())

        # Every function file ran again, and the edit is installed: no upgrade was written for it.
        assert ran(recorder, edited_functions) == [f.name for f in edited_functions]
        assert EDIT[1] in definition(conn, EDITED_FUNCTION)[0]
        # What CREATE OR REPLACE resets is restored: the roles' entry points, the routes.
        assert definition(conn, send) == entry_point
        routes_after = catalog_snapshot(conn)["functions"]
        assert [r for r in routes_after if r[1] in ROUTE_FUNCTIONS] == [
            r for r in routes_before if r[1] in ROUTE_FUNCTIONS
        ]
        assert conn.execute("SELECT pgmq.send('jobs', '1')").fetchone() == (1,)
        # Once applied, the edited files are not run again.
        recorder = RecordingConnection(conn)
        install(cast(Conn, recorder))
        assert ran(recorder, edited_functions) == []


def test_an_edited_stream_template_reaches_the_streams_there_are(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each stream has functions of its own, written from templates in 92_streams.sql: the function
    files write them again, so they follow a change of the template as the routes do."""
    stream_insert = "            RETURNING l.id;$F$,"
    edit = (stream_insert, "            RETURNING l.id;  -- edited$F$,")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgbroker.create_stream('events')")
        assert edit[1].strip() not in definition(conn, "pgbroker.s_events_send(jsonb[],jsonb[],text[])")[0]
        files = engine.functions()
        assert sum(f.sql.count(stream_insert) for f in files) == 1
        edited = tuple(SqlFile(f.name, f.sql.replace(*edit)) for f in files)
        monkeypatch.setattr(engine, "functions", lambda: edited)
        install(conn)
        assert "-- edited" in definition(conn, "pgbroker.s_events_send(jsonb[],jsonb[],text[])")[0]
        assert "-- edited" in definition(conn, "pgbroker._stream_send_to(text,jsonb[],jsonb[],text[])")[0]
        assert conn.execute("SELECT pgbroker.stream_send('events', '1')").fetchone() == (1,)


# The tables a transaction of this backend holds a lock on, each as its table (an index or TOAST
# table as the table it belongs to, a partition as its root), of the engine's schemas and
# pg_partman's, that existed before it: (schema, table).
LOCKED_TABLES = """
    SELECT DISTINCT t.relnamespace::regnamespace::text, t.relname
    FROM pg_locks l
    JOIN pg_class c ON c.oid = l.relation
    CROSS JOIN LATERAL (SELECT coalesce((SELECT i.indrelid FROM pg_index i WHERE i.indexrelid = c.oid),
                                        (SELECT o.oid FROM pg_class o WHERE o.reltoastrelid = c.oid),
                                        c.oid) AS owner) o
    JOIN pg_class t ON t.oid = coalesce(pg_partition_root(o.owner), o.owner)
    WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation'
      AND t.relnamespace::regnamespace::text = ANY(%s) AND t.oid < %s::oid
    ORDER BY 1, 2
"""


@pytest.mark.parametrize("upgrade", ["development database", "functions only"])
def test_an_upgrade_locks_no_table_its_lock_phase_did_not_take_first(empty_dsn: str, upgrade: str) -> None:
    """The upgrade takes the tables it locks at once, before it changes anything, so that it never
    waits for a worker while holding a table that worker asks for next (a deadlock); it does not
    take every queue's tables, a lock each, which filled a server's lock table
    (tests/db/test_install_lock_table.py). So every table it holds a lock on when done must be one
    of those it took first: not a queue's, a partitioned queue's, pg_partman's or a stream's."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        if has_partman_on_server(conn):
            create_partman(conn)
        install_dev(conn)
        make_queues(conn, DEV_MINIMUM)
        conn.execute("SELECT pgbroker.create_stream('events', 2)")
        if upgrade == "functions only":
            install(conn)
            conn.execute("UPDATE pgbroker.schema_functions SET checksum = 'of an older package'")
        newest = conn.execute("SELECT max(oid::bigint) + 1 FROM pg_class").fetchone()
        newest_before = cast(tuple[int], newest)[0]
        dev = upgrade == "development database"
        with conn.transaction(force_rollback=True):
            taken_first = set(conn.execute(named("install_lock_set"), [dev]).fetchall())
            install(conn)
            held = set(conn.execute(LOCKED_TABLES, [[*SCHEMAS, PARTMAN_SCHEMA], newest_before]).fetchall())
    assert ("pgbroker", "queue_head") in held
    assert held - taken_first == set()
