"""The engine's two sources agree: upgrading through the migrations gives exactly the schema that a
new database gets from sql/schema/.

A database is installed one migration at a time, with queues made at every version (so that each
later migration must bring existing queues up to date): plain, unlogged and mixed-case queues, and
from the version that brings them notify triggers, FIFO indexes, topic bindings, partitioned
queues and archives (when the server has pg_partman), policies (which the generated route functions
write in) and least-privilege roles. Another database is installed new, from the schema files, and
gets the same queues in the same order. Their catalogs, and the rows the engine keeps about its
queues, must be identical; so must a database upgraded from an older version in one go, by either
driver (sync or asyncio). The tests follow ``pgbroker.sql.migrations()``, so each new migration is
checked without editing them.
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

from pgbroker.install import InstallResult, install, install_async, install_roles, latest_version
from pgbroker.sql import migrations, schema
from tests.integration.helpers import Conn
from tests.support.postgres import fresh_database

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
               p.proacl::text, obj_description(p.oid, 'pg_proc')
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
    "migrations": """
        SELECT version, name, checksum FROM pgbroker.schema_migrations ORDER BY version
    """,
    # Rows the engine keeps about its queues and roles, less what differs by clock alone
    # (timestamps; queue_head, which reads move at random). role_function is written by the
    # schema and the migrations themselves.
    "role_functions": """
        SELECT role_kind, function_schema, function_name FROM pgbroker.role_function ORDER BY 1, 2, 3
    """,
    "role_sets": "SELECT prefix FROM pgbroker.role_sets ORDER BY 1",
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


def queues_of_version(version: int) -> list[tuple[str, str]]:
    """The plain queues made at ``version``: (pgmq function, queue name)."""
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


@contextmanager
def role_prefix(pg_admin_dsn: str, *dsns: str) -> Iterator[str]:
    """A prefix for least-privilege roles, unique to the test; the roles (which belong to the whole
    server) are dropped afterwards, their grants first, in each database that made them."""
    prefix = f"m{uuid.uuid4().hex[:10]}"
    try:
        yield prefix
    finally:
        roles = [sql.Identifier(f"{prefix}_{kind}") for kind in ("producer", "consumer", "monitor")]
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            existing = admin.execute(
                "SELECT count(*) FROM pg_roles WHERE rolname LIKE %s", [f"{prefix}\\_%"]
            ).fetchone()
        if existing != (0,):
            for dsn in dsns:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.SQL(", ").join(roles)))
            with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.SQL(", ").join(roles)))


class RecordingConnection:
    """A connection, as install() uses it, that remembers the statements it ran."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.statements: list[str] = []

    def transaction(self) -> AbstractContextManager[Any]:
        return self.conn.transaction()

    def execute(self, query: str, params: Any = None) -> psycopg.Cursor[Any]:
        self.statements.append(query)
        return self.conn.execute(cast(Any, query), params)


def no_setup(conn: Conn) -> None:
    pass


def install_new(dsn: str, setup: Callable[[Conn], None]) -> Conn:
    """Connect to an empty database, run ``setup``, install pgbroker, and check that it came
    from the schema files: each of them ran, and no migration did."""
    conn = psycopg.connect(dsn, autocommit=True)
    setup(conn)
    recorder = RecordingConnection(conn)
    assert install(cast(Conn, recorder)) == InstallResult(0, latest_version())
    assert [f.sql for f in schema()] == [s for s in recorder.statements if s in {f.sql for f in schema()}]
    assert not {m.sql for m in migrations()} & set(recorder.statements)
    return conn


# -- tests ------------------------------------------------------------------------------------


@pytest.fixture
def other_empty_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A second empty database."""
    with fresh_database(pg_admin_dsn, "template0") as fresh:
        yield fresh


def test_upgrading_one_migration_at_a_time_gives_the_schema_of_a_new_install(
    pg_admin_dsn: str, empty_dsn: str, other_empty_dsn: str
) -> None:
    versions = [m.version for m in migrations()]
    with ExitStack() as stack:
        prefix = stack.enter_context(role_prefix(pg_admin_dsn, empty_dsn, other_empty_dsn))
        upgraded = stack.enter_context(psycopg.connect(empty_dsn, autocommit=True))
        partman = has_partman_on_server(upgraded)
        if partman:
            create_partman(upgraded)
        for version in versions:
            install(upgraded, target=version)
            make_queues(upgraded, version, roles=prefix)
        upgraded_catalog = catalog_snapshot(upgraded)

        fresh = stack.enter_context(install_new(other_empty_dsn, create_partman if partman else no_setup))
        for version in versions:
            make_queues(fresh, version, roles=prefix)
        fresh_catalog = catalog_snapshot(fresh)

    # The snapshots see what was made: every queue, the routes holding them, the roles' grants.
    assert len(upgraded_catalog["queues"]) == 3 * len(versions) + (len(versions) - 5 if partman else 0)
    routes = [row for row in upgraded_catalog["functions"] if row[1] in ROUTE_FUNCTIONS]
    assert [row[1] for row in routes] == sorted(ROUTE_FUNCTIONS)
    assert all(f"plain_v{versions[-1]}" in row[4] for row in routes)
    assert any(f"{prefix}_consumer=X" in (row[5] or "") for row in upgraded_catalog["functions"])
    assert len(upgraded_catalog["role_sets"]) == 1
    if partman:
        assert any(row[0].startswith("pgmq.a_unlogged_v") for row in upgraded_catalog["partman_config"])
    assert_same_catalog(upgraded_catalog, fresh_catalog)


@pytest.mark.parametrize("start", [1, latest_version() - 2])
def test_upgrading_an_older_install_in_one_go_gives_the_schema_of_a_new_install(
    empty_dsn: str, other_empty_dsn: str, start: int
) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as upgraded:
        install(upgraded, target=start)
        make_queues(upgraded, start)
        assert install(upgraded).previous_version == start
        make_queues(upgraded, latest_version())
        upgraded_catalog = catalog_snapshot(upgraded)
    with install_new(other_empty_dsn, no_setup) as fresh:
        make_queues(fresh, start)
        make_queues(fresh, latest_version())
        fresh_catalog = catalog_snapshot(fresh)
    assert_same_catalog(upgraded_catalog, fresh_catalog)


@pytest.mark.parametrize("start", [0, latest_version() - 2])
def test_the_asyncio_installer_installs_and_upgrades_to_the_same_schema(
    empty_dsn: str, other_empty_dsn: str, start: int
) -> None:
    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as conn:
            if start:
                await install_async(conn, target=start)
            assert await install_async(conn) == InstallResult(start, latest_version())

    asyncio.run(run())
    with psycopg.connect(empty_dsn, autocommit=True) as installed:
        make_queues(installed, latest_version())
        installed_catalog = catalog_snapshot(installed)
    with install_new(other_empty_dsn, no_setup) as fresh:
        make_queues(fresh, latest_version())
        assert_same_catalog(installed_catalog, catalog_snapshot(fresh))


def test_installing_again_changes_no_catalog_object(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        make_queues(conn, latest_version())
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
