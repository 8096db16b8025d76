"""Upgrading through every migration gives exactly the schema of a fresh install.

A database is installed one migration at a time, with queues created at every version (so that
each later migration must bring existing queues up to date); another gets a fresh install and
then the same queues. Their catalogs must be identical. The test follows
``pgbroker.sql.migrations()``, so each new migration is checked without editing it.
"""

from __future__ import annotations

from typing import Any

import psycopg

from pgbroker.install import install
from pgbroker.sql import migrations
from tests.integration.helpers import Conn

SCHEMAS = ("pgmq", "pgbroker")

# Each query returns rows that describe one kind of catalog object by name, never by oid, in a
# stable order. $1 is the array of schema names.
CATALOG_QUERIES: dict[str, str] = {
    "relations": """
        SELECT n.nspname, c.relname, c.relkind, c.relpersistence, c.reloptions::text,
               c.relacl::text, pg_get_partkeydef(c.oid), c.relispartition, obj_description(c.oid, 'pg_class')
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
}


def catalog_snapshot(conn: Conn) -> dict[str, list[tuple[Any, ...]]]:
    """Every catalog fact about schemas pgmq and pgbroker that a migration could change."""
    params = {"schemas": list(SCHEMAS)}
    return {kind: conn.execute(query, params).fetchall() for kind, query in CATALOG_QUERIES.items()}


def assert_same_catalog(
    upgraded: dict[str, list[tuple[Any, ...]]], fresh: dict[str, list[tuple[Any, ...]]]
) -> None:
    for kind in CATALOG_QUERIES:
        only_upgraded = sorted(set(upgraded[kind]) - set(fresh[kind]), key=repr)
        only_fresh = sorted(set(fresh[kind]) - set(upgraded[kind]), key=repr)
        assert (kind, only_upgraded, only_fresh) == (kind, [], []), "catalogs differ"
        assert upgraded[kind] == fresh[kind], kind


def queues_of_version(version: int) -> list[tuple[str, str]]:
    """The queues made at ``version``: (pgmq function, queue name)."""
    return [
        ("create", f"plain_v{version}"),
        ("create_unlogged", f"unlogged_v{version}"),
        ("create_non_partitioned", f"Mixed_Case_v{version}"),
    ]


def make_queues(conn: Conn, version: int) -> None:
    for function, name in queues_of_version(version):
        conn.execute(f"SELECT pgmq.{function}(%s)", [name])
        conn.execute("SELECT pgmq.send(%s, %s::jsonb)", [name, f'{{"v": {version}}}'])


def test_upgrading_one_migration_at_a_time_gives_the_schema_of_a_fresh_install(
    empty_dsn: str, dsn: str
) -> None:
    versions = [m.version for m in migrations()]
    with psycopg.connect(empty_dsn, autocommit=True) as upgraded:
        for version in versions:
            install(upgraded, target=version)
            make_queues(upgraded, version)
        upgraded_catalog = catalog_snapshot(upgraded)
    with psycopg.connect(dsn, autocommit=True) as fresh:  # installed at the latest version at once
        for version in versions:
            make_queues(fresh, version)
        fresh_catalog = catalog_snapshot(fresh)
    assert len(upgraded_catalog["relations"]) > 10 * len(versions)  # the snapshot sees the queues
    assert_same_catalog(upgraded_catalog, fresh_catalog)


def test_installing_again_changes_no_catalog_object(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        make_queues(conn, 1)
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
