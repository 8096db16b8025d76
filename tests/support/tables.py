"""Small helpers the engine's tests share: reading queue tables and catalog facts directly.

They read the tables pgbroker writes, never through pgbroker's own functions, so that a test
checks the engine's effect rather than trusting the engine to report it.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg import sql

Conn = psycopg.Connection[Any]

# The schema the partitioned-queue tests create pg_partman in (tests/engine/conftest.py).
PARTMAN_SCHEMA = "partman"


def q_rows(conn: Conn, queue: str) -> list[tuple[Any, ...]]:
    """(msg_id, read_ct, vt, message, headers) of every row of pgmq.q_<queue>, by msg_id."""
    query = sql.SQL("SELECT msg_id, read_ct, vt, message, headers FROM pgmq.{} ORDER BY msg_id").format(
        sql.Identifier(f"q_{queue.lower()}")
    )
    return conn.execute(query).fetchall()


def a_rows(conn: Conn, queue: str) -> list[tuple[Any, ...]]:
    """(msg_id, read_ct, message, archived_at) of every row of pgmq.a_<queue>, by msg_id."""
    query = sql.SQL("SELECT msg_id, read_ct, message, archived_at FROM pgmq.{} ORDER BY msg_id").format(
        sql.Identifier(f"a_{queue.lower()}")
    )
    return conn.execute(query).fetchall()


def q_ids(conn: Conn, queue: str) -> list[int]:
    return [row[0] for row in q_rows(conn, queue)]


def a_ids(conn: Conn, queue: str) -> list[int]:
    return [row[0] for row in a_rows(conn, queue)]


def visible_ids(conn: Conn, queue: str) -> list[int]:
    """msg_ids whose vt has passed, by msg_id."""
    query = sql.SQL("SELECT msg_id FROM pgmq.{} WHERE vt <= clock_timestamp() ORDER BY msg_id").format(
        sql.Identifier(f"q_{queue.lower()}")
    )
    return [row[0] for row in conn.execute(query).fetchall()]


def meta(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT queue_name, is_partitioned, is_unlogged, created_at FROM pgmq.meta ORDER BY queue_name"
    ).fetchall()


def pgmq_relations(conn: Conn) -> list[str]:
    """Every relation (table, index, sequence) in schema pgmq, by name."""
    return [
        row[0]
        for row in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'pgmq'::regnamespace AND relkind <> 'c'"
            " ORDER BY relname"
        ).fetchall()
    ]


def database_state(conn: Conn) -> tuple[Any, ...]:
    """Everything a failed call must leave unchanged: meta, relations, and every queue's rows."""
    queues = [row[0] for row in meta(conn)]
    contents = {name: (q_rows(conn, name), a_rows(conn, name)) for name in queues}
    return (meta(conn), pgmq_relations(conn), contents)


def describe(conn: Conn, cur: psycopg.Cursor[Any]) -> list[tuple[str, str]]:
    """(name, type name) of each result column of an executed cursor, in order."""
    assert cur.description is not None
    oids = [col.type_code for col in cur.description]
    found = conn.execute(
        "SELECT t.oid, format_type(t.oid, NULL) FROM unnest(%s::oid[]) AS t(oid)", [oids]
    ).fetchall()
    names = dict(found)
    return [(col.name, names[col.type_code]) for col in cur.description]


def jsonb_array(values: list[Any]) -> list[str]:
    """Values as JSON texts, for a parameter cast to jsonb[]."""
    return [json.dumps(v) for v in values]


def advance_head(dsn: str, queue: str, times: int = 3) -> dict[str, Any]:
    """Advance queue's read bounds ``times`` times (pgbroker._advance_head, each call in a
    transaction of its own, on a connection of its own); return its bounds, the newest row of
    pgbroker.queue_head."""
    with psycopg.connect(dsn, autocommit=True) as other:
        for _ in range(times):
            other.execute("SELECT pgbroker._advance_head(%s, %s)", [queue, f"q_{queue.lower()}"])
        cur = other.execute("SELECT * FROM pgbroker._queue_bounds(%s)", [queue])
        row = cur.fetchone()
        assert row is not None
        assert row[0] is not None, f"queue {queue!r} has no queue_head row"
        assert cur.description is not None
        return dict(zip([c.name for c in cur.description], row, strict=True))
