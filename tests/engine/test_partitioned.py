"""Partitioned queues (pg_partman): creation, the engine across partitions, maintenance, retention.

The tests need the pg_partman extension on the test server and skip without it, saying how to
install it; the one exception is the missing-extension error, which needs a server without it
created in the database and so runs everywhere. Partitions and rows are read from the catalogs
and tables directly, never through pgbroker's own helpers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from bench.buffers import PlanCapture
from psycopg import sql
from psycopg.types.json import Jsonb

from pgbroker import Broker
from pgbroker.errors import MissingExtension, from_postgres
from tests.support.tables import PARTMAN_SCHEMA, Conn, a_ids, a_rows, jsonb_array, meta, q_ids

Row = tuple[Any, ...]


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
def pbroker(dsn: str, pconn: Conn) -> Iterator[Broker]:
    """A Broker on the test database, with pg_partman created."""
    with Broker(dsn, max_connections=4) as b:
        yield b


# -- helpers ----------------------------------------------------------------------------------


def create_partitioned(
    conn: Conn, name: str, interval: str | None = "10", retention: str | None = "100000", premake: int = 4
) -> None:
    conn.execute(
        "SELECT pgmq.create_partitioned(queue_name => %s, partition_interval => %s, "
        "retention_interval => %s, premake => %s)",
        [name, interval, retention, premake],
    )


def send_many(conn: Conn, name: str, count: int) -> list[int]:
    rows = conn.execute(
        "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])",
        [name, jsonb_array([{"n": i} for i in range(count)])],
    ).fetchall()
    return [int(r[0]) for r in rows]


def read_ids(conn: Conn, name: str, vt: int, qty: int) -> list[int]:
    rows = conn.execute("SELECT msg_id FROM pgmq.read(%s, %s, %s)", [name, vt, qty]).fetchall()
    return [int(r[0]) for r in rows]


def partitions(conn: Conn, table: str) -> dict[str, tuple[str, str]]:
    """Partition name -> (lower, upper) bound text, default partition excluded."""
    rows = conn.execute(
        """
        SELECT c.relname, b[1], b[2]
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                        'FROM \\(''(.*)''\\) TO \\(''(.*)''\\)') AS b
        WHERE i.inhparent = to_regclass('pgmq.' || quote_ident(%s)) AND b IS NOT NULL
        """,
        [table],
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def id_partitions(conn: Conn, table: str) -> list[int]:
    """Lower bounds of the msg_id partitions of a table, ascending."""
    return sorted(int(lo) for lo, _ in partitions(conn, table).values())


def default_partition(conn: Conn, table: str) -> str | None:
    row = conn.execute(
        "SELECT p.partdefid::regclass::text FROM pg_partitioned_table p "
        "WHERE p.partrelid = to_regclass('pgmq.' || quote_ident(%s)) AND p.partdefid <> 0",
        [table],
    ).fetchone()
    return None if row is None else str(row[0])


def default_rows(conn: Conn, table: str) -> int:
    name = default_partition(conn, table)
    assert name is not None
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.SQL(name))).fetchone()
    assert row is not None
    return int(row[0])


def where(conn: Conn, table: str) -> dict[int, str]:
    """msg_id -> the partition (relation name) that holds it."""
    rows = conn.execute(
        sql.SQL("SELECT t.msg_id, c.relname FROM pgmq.{} t JOIN pg_class c ON c.oid = t.tableoid").format(
            sql.Identifier(table)
        )
    ).fetchall()
    return {int(r[0]): str(r[1]) for r in rows}


def partition_key(conn: Conn, table: str) -> str:
    row = conn.execute(
        "SELECT pg_get_partkeydef(to_regclass('pgmq.' || quote_ident(%s)))", [table]
    ).fetchone()
    assert row is not None
    return str(row[0])


def columns(conn: Conn, table: str) -> list[Row]:
    return conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
        "WHERE attrelid = to_regclass('pgmq.' || quote_ident(%s)) AND attnum > 0 AND NOT attisdropped "
        "ORDER BY attnum",
        [table],
    ).fetchall()


def part_config(conn: Conn, schema: str = PARTMAN_SCHEMA) -> dict[str, Row]:
    """parent_table -> (control, partition_interval, premake, retention, template_table)."""
    rows = conn.execute(
        sql.SQL(
            "SELECT parent_table, control, partition_interval, premake, retention, template_table "
            "FROM {}.part_config"
        ).format(sql.Identifier(schema))
    ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def maintain(conn: Conn, queue: str | None = None, lock_timeout_ms: int = 1000) -> list[Row]:
    """(queue, relation, action, detail) rows of pgbroker.run_maintenance."""
    return conn.execute(
        "SELECT queue, relation, action, detail FROM pgbroker.run_maintenance(%s, %s)",
        [queue, lock_timeout_ms],
    ).fetchall()


def actions(rows: list[Row], action: str) -> set[str]:
    return {str(r[1]).removeprefix("pgmq.") for r in rows if r[2] == action}


def sqlstate_of(conn: Conn, query: str, params: list[Any] | None = None) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    return info.value


def index_parents_of_partitions(conn: Conn, table: str) -> dict[str, set[str]]:
    """Partition -> the parent indexes (by name) its own indexes are attached to."""
    rows = conn.execute(
        """
        SELECT c.relname, pi.relname
        FROM pg_inherits t
        JOIN pg_class c ON c.oid = t.inhrelid
        JOIN pg_index ix ON ix.indrelid = c.oid
        JOIN pg_inherits ii ON ii.inhrelid = ix.indexrelid
        JOIN pg_class pi ON pi.oid = ii.inhparent
        WHERE t.inhparent = to_regclass('pgmq.' || quote_ident(%s))
        """,
        [table],
    ).fetchall()
    found: dict[str, set[str]] = {}
    for part, parent_index in rows:
        found.setdefault(part, set()).add(parent_index)
    return found


# -- pg_partman missing -----------------------------------------------------------------------


def test_missing_pg_partman_is_a_clear_error_naming_the_fix(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('plain')")
    before = (meta(conn), conn.execute("SELECT count(*) FROM pg_class").fetchone())
    # pgmq's functions fail as pgmq's do (its message, or the NULL schema it formats), with
    # pgbroker's PB008 in DETAIL; pgbroker's own with PB008. Every one names the fix.
    calls: list[tuple[str, str, str]] = [
        ("SELECT pgmq.create_partitioned('orders')", "P0001", "pg_partman is required for partitioned"),
        ("SELECT pgmq.create_partitioned('orders', '1 day', '7 days')", "P0001", "pg_partman is required"),
        ("SELECT pgmq.convert_archive_partitioned('plain')", "22004", "null values cannot be formatted"),
        ("SELECT * FROM pgbroker.run_maintenance('plain')", "PB008", "pg_partman"),
    ]
    for query, sqlstate, message in calls:
        err = sqlstate_of(conn, query)
        assert err.sqlstate == sqlstate, query
        assert isinstance(from_postgres(err), MissingExtension), query
        assert message in str(err.diag.message_primary)
        assert "pg_partman" in str(from_postgres(err))
        assert err.diag.message_hint is not None
        assert "CREATE EXTENSION pg_partman" in err.diag.message_hint
    assert (meta(conn), conn.execute("SELECT count(*) FROM pg_class").fetchone()) == before
    # Scheduled maintenance of every queue is a no-op where nothing can be partitioned.
    assert maintain(conn) == []


# -- creating ---------------------------------------------------------------------------------


def test_create_partitioned_by_msg_id(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "orders", "10", "30", 2)
    conn.execute("SELECT pgmq.create('plain')")

    assert [(r[0], r[1], r[2]) for r in meta(conn)] == [("orders", True, False), ("plain", False, False)]
    listed = conn.execute("SELECT queue_name, is_partitioned FROM pgmq.list_queues()").fetchall()
    assert ("orders", True) in listed
    assert partition_key(conn, "q_orders") == "RANGE (msg_id)"
    assert partition_key(conn, "a_orders") == "RANGE (msg_id)"
    # The contract's columns, as on a plain queue.
    assert columns(conn, "q_orders") == columns(conn, "q_plain")
    assert columns(conn, "a_orders") == columns(conn, "a_plain")
    assert conn.execute("SELECT pg_get_serial_sequence('pgmq.q_orders', 'msg_id')").fetchone() == (
        "pgmq.q_orders_msg_id_seq",
    )

    # premake 2: partitions for msg_ids 0-9, 10-19, 20-29, and a default partition.
    assert id_partitions(conn, "q_orders") == [0, 10, 20]
    assert id_partitions(conn, "a_orders") == [0, 10, 20]
    assert default_partition(conn, "q_orders") is not None
    # The engine's partial indexes are on the parent, so every partition has them.
    attached = index_parents_of_partitions(conn, "q_orders")
    assert len(attached) == 4
    for part, parents in attached.items():
        assert {"q_orders_ready_idx", "q_orders_vt_idx", "q_orders_pkey"} <= parents, part

    cfg = part_config(conn)
    assert cfg["pgmq.q_orders"][:4] == ("msg_id", "10", 2, None)  # pg_partman never drops queue partitions
    assert cfg["pgmq.a_orders"][:4] == ("msg_id", "10", 2, "30")
    assert conn.execute("SELECT * FROM pgbroker.partition_retention").fetchall() == [("orders", "30")]

    # Idempotent, like create.
    create_partitioned(conn, "orders", "10", "30", 2)
    assert id_partitions(conn, "q_orders") == [0, 10, 20]
    assert len(meta(conn)) == 2


def test_create_partitioned_by_time(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "events", "1 hour", "3 hours", 2)
    assert partition_key(conn, "q_events") == "RANGE (enqueued_at)"
    assert partition_key(conn, "a_events") == "RANGE (archived_at)"
    # The primary key must hold the partition key; msg_id leads it for the engine's lookups.
    keys = conn.execute(
        "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE contype = 'p' AND conrelid IN ('pgmq.q_events'::regclass, 'pgmq.a_events'::regclass) "
        "ORDER BY 1"
    ).fetchall()
    assert keys == [
        ("pgmq.a_events", "PRIMARY KEY (msg_id, archived_at)"),
        ("pgmq.q_events", "PRIMARY KEY (msg_id, enqueued_at)"),
    ]
    now = conn.execute("SELECT now()").fetchone()
    assert now is not None
    bounds = conn.execute(
        "SELECT count(*) FILTER (WHERE lo::timestamptz <= now() AND now() < hi::timestamptz), "
        "       count(*) FILTER (WHERE lo::timestamptz > now()) "
        "FROM unnest(%s::text[], %s::text[]) AS b(lo, hi)",
        [
            [lo for lo, _ in partitions(conn, "q_events").values()],
            [hi for _, hi in partitions(conn, "q_events").values()],
        ],
    ).fetchone()
    assert bounds == (1, 2)  # the current hour, and premake hours ahead
    cfg = part_config(conn)
    assert (cfg["pgmq.q_events"][0], cfg["pgmq.q_events"][3]) == ("enqueued_at", None)
    assert (cfg["pgmq.a_events"][0], cfg["pgmq.a_events"][3]) == ("archived_at", "03:00:00")

    # pg_partman 4's interval names are accepted too.
    create_partitioned(conn, "daily", "daily", "30 days", 1)
    assert part_config(conn)["pgmq.q_daily"][1] == "1 day"


@pytest.mark.parametrize(
    ("interval", "retention", "premake", "mentions"),
    [
        ("0", "100", 4, "partition_interval"),
        ("-10", "100", 4, "partition_interval"),
        ("", "100", 4, "partition_interval"),
        (None, "100", 4, "partition_interval"),
        ("banana", "100", 4, "partition_interval"),
        ("500 milliseconds", "1 day", 4, "partition_interval"),
        ("10", "7 days", 4, "retention_interval"),
        ("1 day", "seven days", 4, "retention_interval"),
        ("1 day", "-1 day", 4, "retention_interval"),
        ("10", "100", 0, "premake"),
    ],
)
def test_create_partitioned_refuses_bad_arguments(
    pconn: Conn, interval: str | None, retention: str | None, premake: int, mentions: str
) -> None:
    conn = pconn
    with pytest.raises(psycopg.Error) as info:
        create_partitioned(conn, "orders", interval, retention, premake)
    # premake is pgmq's check (P0001); the intervals pgbroker's own (pgmq leaves them to pg_partman).
    assert info.value.sqlstate == ("P0001" if mentions == "premake" else "PB007")
    assert from_postgres(info.value).code == "PB007"
    assert mentions in str(info.value.diag.message_primary)
    assert meta(conn) == []
    assert part_config(conn) == {}
    assert conn.execute("SELECT to_regclass('pgmq.q_orders')").fetchone() == (None,)


def test_create_partitioned_refuses_names_and_queues_it_cannot_partition(pconn: Conn) -> None:
    conn = pconn
    err = sqlstate_of(conn, "SELECT pgmq.create_partitioned('a.b')")
    assert err.sqlstate == "PB001"
    assert "period" in str(err.diag.message_primary)

    conn.execute("SELECT pgmq.create('plain')")
    err = sqlstate_of(conn, "SELECT pgmq.create_partitioned('plain')")
    assert err.sqlstate == "PB007"
    assert "not partitioned" in str(err.diag.message_primary)

    create_partitioned(conn, "Orders")
    err = sqlstate_of(conn, "SELECT pgmq.create_partitioned('orders')")
    assert err.sqlstate == "PB004"


def test_mixed_case_name_with_a_hyphen_is_usable_and_dropped_cleanly(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "My-Queue", "10", "20", 2)
    assert send_many(conn, "My-Queue", 15) == list(range(1, 16))
    assert read_ids(conn, "my-queue", 30, 12) == list(range(1, 13))
    assert conn.execute("SELECT pgmq.archive('My-Queue', 11::bigint)").fetchone() == (True,)
    assert where(conn, "a_my-queue") == {11: "a_my-queue_p10"}
    assert conn.execute("SELECT pgmq.drop_queue('My-Queue')").fetchone() == (True,)
    assert part_config(conn) == {}
    assert conn.execute("SELECT to_regclass('pgmq.\"q_my-queue\"')").fetchone() == (None,)


# -- the engine across partitions -------------------------------------------------------------


def test_send_read_archive_pop_across_msg_id_partitions(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "q", "10", "1000", 4)
    ids = send_many(conn, "q", 35)
    assert ids == list(range(1, 36))
    held = where(conn, "q_q")
    assert [held[i] for i in (1, 9, 10, 19, 20, 29, 30, 35)] == [
        "q_q_p0",
        "q_q_p0",
        "q_q_p10",
        "q_q_p10",
        "q_q_p20",
        "q_q_p20",
        "q_q_p30",
        "q_q_p30",
    ]

    # FIFO across partition boundaries, ready messages first.
    assert read_ids(conn, "q", 0, 15) == list(range(1, 16))
    # vt 0: those 15 are due again (timed), and come first by msg_id.
    assert read_ids(conn, "q", 60, 12) == list(range(1, 13))
    rows = conn.execute("SELECT msg_id, read_ct FROM pgmq.q_q WHERE msg_id IN (1, 12, 13)").fetchall()
    assert sorted(rows) == [(1, 2), (12, 2), (13, 1)]
    # Conditional reads filter within every partition.
    conn.execute("UPDATE pgmq.q_q SET message = '{\"pick\": true}' WHERE msg_id IN (22, 31)")
    got = conn.execute("SELECT msg_id FROM pgmq.read('q', 60, 5, '{\"pick\": true}')").fetchall()
    assert got == [(22,), (31,)]

    popped = conn.execute("SELECT msg_id FROM pgmq.pop('q', 3)").fetchall()
    assert popped == [(13,), (14,), (15,)]
    archived = conn.execute("SELECT * FROM pgmq.archive('q', ARRAY[1, 12, 16, 29]::bigint[])").fetchall()
    assert sorted(archived) == [(1,), (12,), (16,), (29,)]
    assert where(conn, "a_q") == {1: "a_q_p0", 12: "a_q_p10", 16: "a_q_p10", 29: "a_q_p20"}
    [row1] = [r for r in a_rows(conn, "q") if r[0] == 1]
    assert row1[1] == 2  # read_ct kept
    deleted = conn.execute("SELECT * FROM pgmq.delete('q', ARRAY[2, 21]::bigint[])").fetchall()
    assert sorted(deleted) == [(2,), (21,)]

    left = [i for i in ids if i not in {1, 2, 12, 13, 14, 15, 16, 21, 29}]
    assert q_ids(conn, "q") == left
    # 3..11 are leased for 60 s, 22 and 31 too; the rest is visible, oldest first.
    visible = [i for i in left if i > 16 and i not in {22, 31}]
    assert read_ids(conn, "q", 30, 100) == visible
    # set_vt reaches any partition.
    conn.execute("SELECT * FROM pgmq.set_vt('q', ARRAY[3, 33]::bigint[], 0)")
    assert read_ids(conn, "q", 30, 10) == [3, 33]

    metrics = conn.execute("SELECT queue_length, default_partition_length FROM pgmq.metrics('q')").fetchone()
    assert metrics == (len(left), 0)
    assert conn.execute("SELECT pgmq.purge_queue('q')").fetchone() == (len(left),)
    assert q_ids(conn, "q") == []


def test_a_read_or_pop_of_a_few_walks_indexes_never_every_partition_s_rows(pconn: Conn) -> None:
    """The routes plan their statements once (generic plans), guessing a tenth of the table for a
    pick's LIMIT $1. Joined to the queue table by msg_id, those guessed thousands made the planner
    hash every row of every partition to lease or delete a few: 0.3-0.4 s a pop of one message in
    a queue of a million in 106 partitions, where a plain queue takes 0.3 ms. The rows are probed
    by primary key instead, and only in the partitions between the least and the greatest msg_id:
    run-time pruning takes a range, not an array's elements (a delete of 10 by its array alone
    touched 623 buffers here, most of the queue's pages)."""
    capture = PlanCapture(pconn)
    assert capture.enable(), "auto_explain needs a superuser session"
    create_partitioned(pconn, "wide", "1000", "100000000", 40)
    pconn.execute(
        "INSERT INTO pgmq.q_wide (vt, message) SELECT now(), jsonb_build_object('n', g)"
        " FROM generate_series(1, 30000) g"
    )
    pconn.execute("ANALYZE pgmq.q_wide")
    row = pconn.execute("SELECT sum(relpages) FROM pg_class WHERE relname LIKE 'q_wide_p%%'").fetchone()
    assert row is not None
    heap_pages = int(row[0])
    assert heap_pages > 300

    for call in (
        "SELECT * FROM pgmq.pop('wide', 1)",
        "SELECT * FROM pgmq.read('wide', 30, 10)",
        "SELECT * FROM pgbroker.read('wide', 30, 10)",
        "SELECT * FROM pgmq.delete('wide', ARRAY(SELECT msg_id FROM pgmq.read('wide', 30, 10)))",
        "SELECT * FROM pgmq.archive('wide', ARRAY(SELECT msg_id FROM pgmq.read('wide', 30, 10)))",
        "SELECT * FROM pgbroker.ack('wide', ARRAY(SELECT receipt FROM pgbroker.read('wide', 30, 10)), false)",
        "SELECT * FROM pgbroker.consume('wide', 30, 10,"
        " ARRAY(SELECT receipt FROM pgbroker.read('wide', 30, 10)), true)",
    ):
        plans = capture.call(call, [])
        assert plans.rows, call
        # The statement that changes the queue (each of these calls runs one on its table).
        main = max(
            (p for p in plans.nested if p.node_types[:1] != ["Function Scan"] and "pgmq.q_wide" in p.text),
            key=lambda p: p.buffers,
        )
        assert "Hash Join" not in main.node_types, f"{call}: a hash join of the whole queue"
        # One index descent or so a partition (41 with the default), not the table's pages.
        assert main.buffers < heap_pages // 2, f"{call}: {main.buffers} buffers, {heap_pages} heap pages"


def test_send_read_archive_pop_across_time_partitions(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "t", "1 hour", "1 day", 4)
    # Messages enqueued in three different hours (inserted directly to place them in time).
    conn.execute(
        "INSERT INTO pgmq.q_t (enqueued_at, vt, message) "
        "SELECT now() - make_interval(hours => h), now() - make_interval(hours => h), "
        "       jsonb_build_object('h', h) "
        "FROM unnest(ARRAY[2, 1, 0]) AS h"
    )
    send_many(conn, "t", 2)
    held = where(conn, "q_t")
    assert len(set(held.values())) == 3
    assert default_rows(conn, "q_t") == 0
    assert read_ids(conn, "t", 0, 2) == [1, 2]
    assert read_ids(conn, "t", 30, 3) == [1, 2, 3]  # 1 and 2 due again, then 3
    assert conn.execute("SELECT msg_id FROM pgmq.pop('t', 1)").fetchall() == [(4,)]
    assert conn.execute("SELECT pgmq.archive('t', 1::bigint)").fetchone() == (True,)
    assert conn.execute("SELECT pgmq.delete('t', 2::bigint)").fetchone() == (True,)
    assert a_ids(conn, "t") == [1]
    assert q_ids(conn, "t") == [3, 5]
    assert default_rows(conn, "a_t") == 0


def test_fenced_acks_through_the_client_on_a_partitioned_queue(pbroker: Broker, pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "jobs", "5", "1000", 4)
    queue = pbroker.queue("jobs")
    sent = queue.send_many([{"i": i} for i in range(12)])
    assert sent == list(range(1, 13))
    msgs = queue.read_many(8, vt=60)
    assert [m.msg_id for m in msgs] == list(range(1, 9))
    queue.ack(msgs[0])
    queue.ack(msgs[5], archive=False)
    queue.nack(msgs[6])
    renewed = queue.extend(msgs[7], vt=120)
    queue.ack(renewed)
    assert where(conn, "a_jobs") == {1: "a_jobs_p0", 8: "a_jobs_p5"}
    again = queue.read_many(3, vt=60)
    assert [m.msg_id for m in again] == [7, 9, 10]
    assert pbroker.metrics("jobs").default_partition_length == 0
    info = [q for q in pbroker.list_queues() if q.queue_name == "jobs"]
    assert info[0].is_partitioned


def test_fifo_groups_notify_and_topics_work_on_a_partitioned_queue(pconn: Conn, dsn: str) -> None:
    conn = pconn
    create_partitioned(conn, "grp", "5", "1000", 4)
    conn.execute("SELECT pgmq.create_fifo_index('grp')")
    headers = [{"x-pgmq-group": "a" if i % 2 else "b"} for i in range(12)]
    conn.execute(
        "SELECT pgmq.send_batch('grp', %s::jsonb[], %s::jsonb[])",
        [jsonb_array(list(range(12))), jsonb_array(headers)],
    )
    assert len(set(where(conn, "q_grp").values())) == 3
    # Only the head of each group is eligible while its earlier messages are in flight.
    got = conn.execute("SELECT msg_id FROM pgmq.read_grouped_head('grp', 30, 10)").fetchall()
    assert sorted(got) == [(1,), (2,)]

    conn.execute("SELECT pgmq.enable_notify_insert('grp', 0)")
    with psycopg.connect(dsn, autocommit=True) as listener:
        channel = conn.execute("SELECT pgbroker.notify_channel('grp')").fetchone()
        assert channel is not None
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(str(channel[0]))))
        conn.execute("SELECT pgmq.bind_topic('orders.*', 'grp')")
        assert conn.execute("SELECT pgmq.send_topic('orders.new', '{\"t\": 1}')").fetchone() == (1,)
        heard = list(listener.notifies(timeout=5, stop_after=1))
        assert [n.channel for n in heard] == [channel[0]]
    assert where(conn, "q_grp")[13] == "q_grp_p10"


# -- maintenance ------------------------------------------------------------------------------


def test_maintenance_creates_partitions_ahead_from_the_msg_id_sequence(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "m", "10", "1000", 2)
    assert id_partitions(conn, "q_m") == [0, 10, 20]
    send_many(conn, "m", 25)
    conn.execute("SELECT pgmq.delete('m', ARRAY(SELECT generate_series(1, 25))::bigint[])")
    # The queue is empty: pg_partman alone would see no msg_id and make nothing.
    done = maintain(conn, "m")
    assert actions(done, "created") == {"q_m_p30", "q_m_p40", "a_m_p30", "a_m_p40"}
    assert id_partitions(conn, "q_m") == [0, 10, 20, 30, 40]
    attached = index_parents_of_partitions(conn, "q_m")
    assert {"q_m_ready_idx", "q_m_vt_idx"} <= attached["q_m_p40"]
    # Nothing left to do: a second run changes nothing.
    assert maintain(conn, "m") == []

    # More messages than partitions made ahead: the overflow lands in the default partition.
    send_many(conn, "m", 30)  # msg_ids 26..55
    assert default_rows(conn, "q_m") == 6
    assert conn.execute("SELECT default_partition_length FROM pgmq.metrics('m')").fetchone() == (6,)
    done = maintain(conn, "m")
    assert ("m", "pgmq.q_m", "moved", "6 rows moved out of the default partition") in done
    assert default_rows(conn, "q_m") == 0
    assert conn.execute("SELECT default_partition_length FROM pgmq.metrics('m')").fetchone() == (0,)
    assert where(conn, "q_m")[55] == "q_m_p50"
    assert id_partitions(conn, "q_m") == [0, 10, 20, 30, 40, 50, 60, 70]
    assert read_ids(conn, "m", 30, 100) == list(range(26, 56))


def test_maintenance_is_not_held_up_by_an_advisory_lock_of_another_session(pconn: Conn, dsn: str) -> None:
    # Any session may take any advisory lock: maintenance once took the queue's turn on one, and a
    # session holding it made every run fail on its lock_timeout; partitions ran out, and sends
    # piled up in the default partition. The turn is now the queue's row (test_security.py).
    create_partitioned(pconn, "held", "10", "1000", 2)
    send_many(pconn, "held", 25)
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtext('pgbroker.queue:held'))")
        made = actions(maintain(pconn, "held"), "created")
    assert made == {"q_held_p30", "q_held_p40", "a_held_p30", "a_held_p40"}


def test_maintenance_creates_time_partitions_ahead(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "tm", "1 hour", "1 day", 2)
    newest = max(partitions(conn, "q_tm").items(), key=lambda kv: kv[1][0])[0]
    conn.execute(sql.SQL("DROP TABLE pgmq.{}").format(sql.Identifier(newest)))
    done = maintain(conn, "tm")
    assert newest in actions(done, "created")
    assert newest in partitions(conn, "q_tm")


def test_retention_drops_only_fully_processed_msg_id_partitions(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "r", "10", "20", 6)
    send_many(conn, "r", 55)  # partitions p0..p50; horizon = 55 - 20 = 35
    conn.execute("SELECT pgmq.archive('r', ARRAY(SELECT generate_series(1, 9))::bigint[])")
    conn.execute("SELECT pgmq.delete('r', ARRAY(SELECT generate_series(10, 14))::bigint[])")
    conn.execute("SELECT pgmq.archive('r', ARRAY(SELECT generate_series(16, 19))::bigint[])")
    conn.execute("SELECT pgmq.delete('r', ARRAY(SELECT generate_series(20, 29))::bigint[])")
    conn.execute("SELECT pgmq.delete('r', ARRAY(SELECT generate_series(30, 39))::bigint[])")
    # msg 15 is in flight: read, not yet acknowledged.
    conn.execute("SELECT pgmq.set_vt('r', 15::bigint, 0)")
    assert read_ids(conn, "r", 300, 1) == [15]

    done = maintain(conn, "r")
    # p30 is fully processed but not yet past retention (its msg_ids reach 39 > 35).
    assert actions(done, "dropped") >= {"q_r_p0", "q_r_p20"}
    assert "q_r_p30" not in actions(done, "dropped")
    assert actions(done, "retained") == {"q_r_p10"}
    assert id_partitions(conn, "q_r")[:4] == [10, 30, 40, 50]
    assert q_ids(conn, "r") == [15, *range(40, 56)]

    # pg_partman's own maintenance never drops queue partitions either.
    conn.execute(sql.SQL("SELECT {}.run_maintenance()").format(sql.Identifier(PARTMAN_SCHEMA)))
    assert 10 in id_partitions(conn, "q_r")

    # The in-flight message is still acknowledged normally; then p10 goes too.
    assert conn.execute("SELECT pgmq.archive('r', 15::bigint)").fetchone() == (True,)
    done = maintain(conn, "r")
    assert "q_r_p10" in actions(done, "dropped")
    assert actions(done, "retained") == set()
    assert 10 not in id_partitions(conn, "q_r")

    # The archive follows pg_partman's ordinary retention: archived msg_ids 1..19 are more
    # than 20 behind... only once newer messages are archived.
    conn.execute("SELECT pgmq.archive('r', ARRAY(SELECT generate_series(40, 55))::bigint[])")
    done = maintain(conn, "r")
    assert {"a_r_p0", "a_r_p10"} <= actions(done, "dropped")
    assert a_ids(conn, "r") == list(range(40, 56))


def test_retention_of_time_partitions_keeps_unprocessed_and_drops_processed(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "rt", "1 hour", "2 hours", 2)
    # Two messages from hours that are past retention (placed there directly).
    old = conn.execute(
        "INSERT INTO pgmq.q_rt (enqueued_at, vt, message) VALUES "
        "(now() - interval '5 hours', now() - interval '5 hours', '{\"age\": 5}'), "
        "(now() - interval '4 hours', now() - interval '4 hours', '{\"age\": 4}') RETURNING msg_id"
    ).fetchall()
    five, four = (int(r[0]) for r in old)
    assert default_rows(conn, "q_rt") == 2
    done = maintain(conn, "rt")
    assert ("rt", "pgmq.q_rt", "moved", "2 rows moved out of the default partition") in done
    held = where(conn, "q_rt")
    assert held[five] != held[four]
    # Partitions made by moving rows are weighed for retention from the next run on.
    done = maintain(conn, "rt")
    assert actions(done, "retained") == {held[five], held[four]}
    assert actions(done, "dropped") == set()

    conn.execute("SELECT pgmq.delete('rt', %s::bigint)", [four])
    done = maintain(conn, "rt")
    assert actions(done, "dropped") == {held[four]}
    assert actions(done, "retained") == {held[five]}
    assert q_ids(conn, "rt") == [five]
    assert read_ids(conn, "rt", 30, 5) == [five]

    # The archive: an old archived row goes with pg_partman's retention.
    conn.execute(
        "INSERT INTO pgmq.a_rt (msg_id, archived_at, vt, message) "
        "VALUES (999, now() - interval '5 hours', now(), '{}')"
    )
    done = maintain(conn, "rt")
    assert ("rt", "pgmq.a_rt", "moved", "1 rows moved out of the default partition") in done
    assert default_rows(conn, "a_rt") == 0
    [old_archive] = {p for i, p in where(conn, "a_rt").items() if i == 999}
    done = maintain(conn, "rt")
    assert ("rt", "pgmq." + old_archive, "dropped", "archive retention (pg_partman)") in done
    assert 999 not in a_ids(conn, "rt")


def test_retention_without_a_horizon_keeps_every_partition(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "k", "10", None, 2)
    send_many(conn, "k", 25)
    conn.execute("SELECT pgmq.delete('k', ARRAY(SELECT generate_series(1, 25))::bigint[])")
    done = maintain(conn, "k")
    assert actions(done, "dropped") == set()
    assert id_partitions(conn, "q_k")[:3] == [0, 10, 20]
    assert part_config(conn)["pgmq.a_k"][3] is None


def test_retention_waits_only_lock_timeout_for_a_busy_queue(pconn: Conn, dsn: str) -> None:
    conn = pconn
    create_partitioned(conn, "busy", "10", "10", 4)
    send_many(conn, "busy", 35)
    conn.execute("SELECT pgmq.delete('busy', ARRAY(SELECT generate_series(1, 19))::bigint[])")
    with psycopg.connect(dsn) as reader:
        # A long transaction that has read the queue holds a lock a partition drop must wait for.
        reader.execute("SELECT count(*) FROM pgmq.q_busy")
        done = maintain(conn, "busy", lock_timeout_ms=100)
        # Making partitions ahead needs the default partition, which the reader holds: it
        # fails after the timeout (to be done at the next run) instead of stalling the queue.
        assert [r[1] for r in done if r[2] == "failed"] == ["pgmq.q_busy"]
        assert actions(done, "deferred") == {"q_busy_p0", "q_busy_p10"}
        assert id_partitions(conn, "q_busy")[:2] == [0, 10]
        reader.rollback()
    assert conn.execute("SELECT current_setting('lock_timeout')").fetchone() == ("0",)
    done = maintain(conn, "busy")
    assert actions(done, "dropped") == {"q_busy_p0", "q_busy_p10"}
    assert {"q_busy_p50", "q_busy_p60"} <= actions(done, "created")


def test_retention_in_part_config_for_a_queue_table_is_taken_over(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "tk", "10", "1000", 2)
    send_many(conn, "tk", 25)
    # Someone configures pg_partman's retention on the queue table, as pgmq does...
    conn.execute(
        sql.SQL("UPDATE {}.part_config SET retention = '5' WHERE parent_table = 'pgmq.q_tk'").format(
            sql.Identifier(PARTMAN_SCHEMA)
        )
    )
    done = maintain(conn, "tk")
    # ...pgbroker moves it to its own safe retention before pg_partman could drop messages.
    assert next(r[2] for r in done if r[1] == "pgmq.q_tk") == "reconfigured"
    assert part_config(conn)["pgmq.q_tk"][3] is None
    assert conn.execute("SELECT retention FROM pgbroker.partition_retention").fetchall() == [("5",)]
    assert q_ids(conn, "tk") == list(range(1, 26))
    assert actions(done, "retained") == {"q_tk_p0", "q_tk_p10"}


def test_maintenance_of_every_queue_and_of_a_plain_queue(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "one", "10", "1000", 1)
    create_partitioned(conn, "two", "10", "1000", 1)
    conn.execute("SELECT pgmq.create('plain')")
    send_many(conn, "one", 15)
    send_many(conn, "two", 5)
    done = maintain(conn)
    assert {r[0] for r in done} == {"one"}
    assert actions(done, "created") == {"q_one_p20", "a_one_p20"}
    err = sqlstate_of(conn, "SELECT * FROM pgbroker.run_maintenance('plain')")
    assert err.sqlstate == "PB007"
    err = sqlstate_of(conn, "SELECT * FROM pgbroker.run_maintenance('nope')")
    assert err.sqlstate == "PB002"


def test_maintenance_runs_beside_senders_and_readers(pconn: Conn, dsn: str) -> None:
    """Partitions are made, spills moved and drained partitions dropped under load, and no send,
    read or ack fails: maintenance locks out writers before attaching, and never deadlocks them."""
    conn = pconn
    create_partitioned(conn, "live", "20", "40", 2)
    # Keep every archived row, so that the end state accounts for every message sent.
    conn.execute(
        sql.SQL("UPDATE {}.part_config SET retention = NULL WHERE parent_table = 'pgmq.a_live'").format(
            sql.Identifier(PARTMAN_SCHEMA)
        )
    )
    stop = threading.Event()
    errors: list[BaseException] = []
    acked: list[int] = []

    def produce() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    send_many(c, "live", 5)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def consume() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    got = c.execute("SELECT msg_id, receipt FROM pgbroker.read('live', 30, 5)").fetchall()
                    if got:
                        done = c.execute(
                            "SELECT * FROM pgbroker.ack('live', %s::text[])", [[r[1] for r in got]]
                        ).fetchall()
                        acked.extend(int(r[0]) for r in done)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=produce), threading.Thread(target=consume)]
    workers += [threading.Thread(target=consume)]
    for w in workers:
        w.start()
    reports: list[Row] = []
    try:
        for _ in range(25):
            reports += maintain(conn, "live", lock_timeout_ms=200)
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert errors == []
    # Under load a lock may not come within the timeout; nothing else may go wrong.
    assert [r for r in reports if r[2] == "failed" and "lock timeout" not in str(r[3])] == []
    assert actions(reports, "created")
    assert actions(reports, "dropped")
    reports = maintain(conn, "live")
    assert default_rows(conn, "q_live") == 0
    sent = conn.execute("SELECT last_value FROM pgmq.q_live_msg_id_seq").fetchone()
    assert sent is not None
    # Nothing lost: every msg_id is either still queued or archived, and acked once.
    assert sorted(q_ids(conn, "live") + a_ids(conn, "live")) == list(range(1, int(sent[0]) + 1))
    assert sorted(acked) == a_ids(conn, "live")


def test_run_maintenance_proc_maintains_every_queue_in_its_own_transaction(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "one", "10", "1000", 1)
    create_partitioned(conn, "two", "10", "5", 1)
    send_many(conn, "one", 15)
    send_many(conn, "two", 19)
    conn.execute("SELECT pgmq.delete('two', ARRAY(SELECT generate_series(1, 9))::bigint[])")
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(str(d.message_primary)))
    conn.execute("CALL pgbroker.run_maintenance_proc()")
    assert "pgbroker maintenance: one pgmq.q_one_p20 created: partition created" in notices
    dropped = "pgbroker maintenance: two pgmq.q_two_p0 dropped: past retention and every message processed"
    assert dropped in notices
    assert id_partitions(conn, "q_one") == [0, 10, 20]
    assert id_partitions(conn, "q_two") == [10, 20]


# -- dropping ---------------------------------------------------------------------------------


def test_drop_queue_removes_the_pg_partman_configuration(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "d1", "10", "100", 2)
    create_partitioned(conn, "d2", "1 day", "7 days", 2)
    create_partitioned(conn, "stay", "10", "100", 2)
    send_many(conn, "d1", 5)
    templates = {v[4] for k, v in part_config(conn).items() if "_d1" in k or "_d2" in k}
    assert len(templates) == 4
    assert conn.execute("SELECT pgmq.drop_queue('d1')").fetchone() == (True,)
    # The deprecated two-argument form goes the same way.
    assert conn.execute("SELECT pgmq.drop_queue('d2', true)").fetchone() == (True,)
    assert set(part_config(conn)) == {"pgmq.q_stay", "pgmq.a_stay"}
    for template in templates:
        assert conn.execute("SELECT to_regclass(%s)", [template]).fetchone() == (None,)
    assert [r[0] for r in meta(conn)] == ["stay"]
    assert conn.execute("SELECT queue_name FROM pgbroker.partition_retention").fetchall() == [("stay",)]
    left = conn.execute(
        "SELECT relname FROM pg_class WHERE relnamespace = 'pgmq'::regnamespace AND relname ~ '_d[12]'"
    ).fetchall()
    assert left == []
    # pg_partman's maintenance of everything has nothing dangling to trip over.
    conn.execute(sql.SQL("SELECT {}.run_maintenance()").format(sql.Identifier(PARTMAN_SCHEMA)))
    assert conn.execute("SELECT pgmq.drop_queue('d1')").fetchone() == (False,)


def test_pg_partman_in_another_schema_is_found(conn: Conn, partman_on_server: None) -> None:
    conn.execute("CREATE SCHEMA tools")
    conn.execute("CREATE EXTENSION pg_partman SCHEMA tools")
    create_partitioned(conn, "elsewhere", "10", "100", 2)
    assert set(part_config(conn, "tools")) == {"pgmq.q_elsewhere", "pgmq.a_elsewhere"}
    send_many(conn, "elsewhere", 25)
    assert actions(maintain(conn, "elsewhere"), "created") >= {"q_elsewhere_p30"}
    assert conn.execute("SELECT pgmq.drop_queue('elsewhere')").fetchone() == (True,)
    assert part_config(conn, "tools") == {}


# -- archives ---------------------------------------------------------------------------------


def test_convert_archive_partitioned_by_msg_id_keeps_the_rows(pconn: Conn) -> None:
    conn = pconn
    conn.execute("SELECT pgmq.create('legacy')")
    send_many(conn, "legacy", 25)
    conn.execute("SELECT pgmq.archive('legacy', ARRAY(SELECT generate_series(1, 20))::bigint[])")
    before = conn.execute("SELECT * FROM pgmq.a_legacy ORDER BY msg_id").fetchall()

    conn.execute("SELECT pgmq.convert_archive_partitioned('legacy', '10', '1000', 2)")
    assert partition_key(conn, "a_legacy") == "RANGE (msg_id)"
    assert conn.execute("SELECT * FROM pgmq.a_legacy ORDER BY msg_id").fetchall() == before
    held = where(conn, "a_legacy")
    assert {held[1], held[10], held[20]} == {"a_legacy_p0", "a_legacy_p10", "a_legacy_p20"}
    assert default_rows(conn, "a_legacy") == 0
    assert id_partitions(conn, "a_legacy") == [0, 10, 20, 30, 40]
    assert conn.execute("SELECT to_regclass('pgmq.a_legacy_old')").fetchone() == (None,)
    assert [(r[0], r[1]) for r in meta(conn)] == [("legacy", False)]  # the queue table stays plain
    assert part_config(conn)["pgmq.a_legacy"][:4] == ("msg_id", "10", 2, "1000")
    index_names = conn.execute(
        "SELECT indexrelid::regclass::text FROM pg_index "
        "WHERE indrelid = 'pgmq.a_legacy'::regclass ORDER BY 1"
    ).fetchall()
    assert index_names == [("pgmq.a_legacy_pkey",), ("pgmq.archived_at_idx_legacy",)]

    conn.execute("SELECT pgmq.archive('legacy', ARRAY[21, 25]::bigint[])")
    assert where(conn, "a_legacy")[25] == "a_legacy_p20"
    # Again: a notice, nothing changes.
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(str(d.message_primary)))
    conn.execute("SELECT pgmq.convert_archive_partitioned('legacy', '10', '1000', 2)")
    assert any("already partitioned" in n for n in notices)
    # The archive is maintained on its own; dropping the queue drops its configuration.
    assert maintain(conn, "legacy") == []
    assert conn.execute("SELECT pgmq.drop_queue('legacy')").fetchone() == (True,)
    assert part_config(conn) == {}


def test_convert_archive_partitioned_by_time(pconn: Conn) -> None:
    conn = pconn
    conn.execute("SELECT pgmq.create('legacy')")
    send_many(conn, "legacy", 5)
    conn.execute("SELECT pgmq.archive('legacy', ARRAY[1, 2, 3]::bigint[])")
    conn.execute("UPDATE pgmq.a_legacy SET archived_at = now() - interval '3 days' WHERE msg_id = 1")
    before = conn.execute("SELECT * FROM pgmq.a_legacy ORDER BY msg_id").fetchall()
    conn.execute("SELECT pgmq.convert_archive_partitioned('legacy', '1 day', '30 days', 3)")
    assert partition_key(conn, "a_legacy") == "RANGE (archived_at)"
    assert conn.execute("SELECT * FROM pgmq.a_legacy ORDER BY msg_id").fetchall() == before
    held = where(conn, "a_legacy")
    assert held[1] != held[2]
    assert held[2] == held[3]
    assert default_rows(conn, "a_legacy") == 0
    assert part_config(conn)["pgmq.a_legacy"][3] == "30 days"


def test_convert_archive_partitioned_refuses_bad_arguments(pconn: Conn) -> None:
    conn = pconn
    # A missing queue is only a notice, as in pgmq.
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(str(d.message_primary)))
    conn.execute("SELECT pgmq.convert_archive_partitioned('nope')")
    assert notices == ["Table a_nopes does not exists"]  # pgmq's notice, its stray 's' included
    assert meta(conn) == []
    conn.execute("SELECT pgmq.create('plain')")
    for query in (
        "SELECT pgmq.convert_archive_partitioned('plain', 'soon')",
        "SELECT pgmq.convert_archive_partitioned('plain', '10', '1 day')",
        "SELECT pgmq.convert_archive_partitioned('plain', '10', '100', 0)",
    ):
        assert sqlstate_of(conn, query).sqlstate == "PB007", query
    kind = conn.execute("SELECT relkind FROM pg_class WHERE oid = 'pgmq.a_plain'::regclass").fetchone()
    assert kind == ("r",)


def test_detach_archive_is_a_deprecated_no_op_that_warns(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('plain')")
    send_many(conn, "plain", 1)
    conn.execute("SELECT pgmq.archive('plain', 1::bigint)")
    seen: list[tuple[str | None, str | None]] = []
    conn.add_notice_handler(lambda d: seen.append((d.severity_nonlocalized, d.message_primary)))
    conn.execute("SELECT pgmq.detach_archive('plain')")
    assert len(seen) == 1
    severity, message = seen[0]
    assert severity == "WARNING"
    assert "deprecated" in str(message)
    assert a_ids(conn, "plain") == [1]
    assert conn.execute("SELECT pgmq.drop_queue('plain')").fetchone() == (True,)
    assert conn.execute("SELECT to_regclass('pgmq.a_plain')").fetchone() == (None,)


def test_metrics_count_rows_in_both_default_partitions(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "mx", "10", "1000", 1)
    send_many(conn, "mx", 27)  # partitions 0-19: msg_ids 20..27 in the default partition
    conn.execute("SELECT pgmq.archive('mx', ARRAY[25, 26, 3]::bigint[])")
    assert default_rows(conn, "q_mx") == 6
    assert default_rows(conn, "a_mx") == 2
    row = conn.execute("SELECT queue_length, default_partition_length FROM pgmq.metrics('mx')").fetchone()
    assert row == (24, 8)
    all_rows = conn.execute("SELECT queue_name, default_partition_length FROM pgmq.metrics_all()").fetchall()
    assert all_rows == [("mx", 8)]
    conn.execute("SELECT pgmq.create('plain')")
    # A queue without default partitions reports NULL, as in pgmq.
    assert conn.execute("SELECT default_partition_length FROM pgmq.metrics('plain')").fetchone() == (None,)
    maintain(conn, "mx")
    assert conn.execute("SELECT default_partition_length FROM pgmq.metrics('mx')").fetchone() == (0,)


def test_jsonb_payloads_survive_default_partition_moves(pconn: Conn) -> None:
    conn = pconn
    create_partitioned(conn, "pl", "10", "1000", 1)
    conn.execute("SELECT pgmq.send('pl', %s, %s)", [Jsonb({"k": [1, 2]}), Jsonb({"x-h": "v"})])
    conn.execute("SELECT pgmq.send_batch('pl', %s::jsonb[])", [jsonb_array(list(range(25)))])
    before = conn.execute("SELECT * FROM pgmq.q_pl ORDER BY msg_id").fetchall()
    maintain(conn, "pl")
    assert conn.execute("SELECT * FROM pgmq.q_pl ORDER BY msg_id").fetchall() == before
    assert default_rows(conn, "q_pl") == 0
