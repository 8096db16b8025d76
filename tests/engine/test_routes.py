"""Routes (migration 0014): the hot statements of every queue as static SQL in generated functions.

A route must only ever be a faster way to the same statement: the same calls on a routed queue
and on one that takes the dynamic path give the same rows and the same errors, in the same order.
Routes follow every change of the queues and their policies in the same transaction, and a
rollback takes the change back.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support.postgres import fresh_database
from tests.support.tables import Conn, a_rows, q_rows

Outcome = tuple[str, Any]


@pytest.fixture
def other_dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    """A second fresh database, for running the same calls side by side."""
    with fresh_database(pg_admin_dsn, template_db) as fresh:
        yield fresh


def _routed(conn: Conn, queue: str) -> bool:
    """Whether the send route names queue's table."""
    row = conn.execute("SELECT prosrc FROM pg_proc WHERE oid = 'pgbroker._route_send'::regproc").fetchone()
    assert row is not None
    return f"pgmq.q_{queue.lower()} " in row[0]


def _run(conn: Conn, query: str, params: list[Any]) -> tuple[str, Any]:
    """The rows a call returned, or its error's code and message."""
    try:
        return ("rows", conn.execute(query, params).fetchall())
    except psycopg.Error as exc:
        return ("error", (exc.sqlstate, exc.diag.message_primary))


def _ids(row: tuple[Any, ...]) -> Any:
    return row[0]


def _message(row: tuple[Any, ...]) -> Any:
    # msg_id, read_ct, message, headers: everything but the times (and receipts, which carry one)
    return (row[0], row[1], row[5], row[6])


def _scenario(conn: Conn, q: str) -> list[Outcome]:
    """Every hot call, good and bad, on queue q; what each returned, then the tables."""
    out: list[Outcome] = []

    def call(query: str, params: list[Any], keep: Callable[[tuple[Any, ...]], Any] = _ids) -> list[Any]:
        kind, result = _run(conn, query, params)
        out.append((kind, [keep(r) for r in result] if kind == "rows" else result))
        return result if kind == "rows" else []

    def receipts(query: str, params: list[Any]) -> list[str]:
        # A receipt carries its lease's end time: compared by the rest of the delivery.
        return [r[7] for r in call(query, params, _message)]

    m = json.dumps
    call("SELECT * FROM pgmq.send(%s, %s::jsonb)", [q, m({"n": 1})])
    call("SELECT * FROM pgmq.send(%s, %s::jsonb, %s::jsonb)", [q, m({"n": 2}), m({"h": 2})])
    call("SELECT * FROM pgmq.send(%s, %s::jsonb, 0)", [q, m({"n": 3})])
    call("SELECT * FROM pgmq.send(%s, %s::jsonb, 3600)", [q, m({"delayed": True})])
    batch = [m({"n": i, "kind": "even" if i % 2 == 0 else "odd"}) for i in range(4, 12)]
    call("SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])", [q, batch])
    call("SELECT * FROM pgmq.send_batch(%s, %s::jsonb[], %s::jsonb[])", [q, batch[:2], [m({"h": 1})]])
    call("SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])", [q, []])
    call("SELECT * FROM pgmq.send(%s, %s::jsonb)", [q.upper(), m({"case": "upper"})])
    call("SELECT * FROM pgmq.send(%s, %s::jsonb)", ["no_such_queue", m({})])
    call("SELECT * FROM pgmq.send(%s, %s::jsonb)", ["bad;name", m({})])
    call("SELECT * FROM pgmq.send(%s, %s::jsonb)", [q, m({"big": "x" * 2_000_000})])

    call("SELECT * FROM pgmq.read(%s, 30, 2)", [q], _message)
    call("SELECT * FROM pgmq.read(%s, 30, 2, %s::jsonb)", [q, m({"kind": "odd"})], _message)
    call("SELECT * FROM pgmq.read(%s, -1, 2)", [q])
    call("SELECT * FROM pgmq.read(%s, 30, NULL)", [q])
    call("SELECT * FROM pgmq.read(%s, 30, 1)", ["no_such_queue"])

    stale = receipts("SELECT * FROM pgbroker.read(%s, 0, 1)", [q])
    held = receipts("SELECT * FROM pgbroker.read(%s, 30, 2)", [q])
    call("SELECT * FROM pgbroker.ack(%s, %s::text[], true)", [q, held[:1]])
    call("SELECT * FROM pgbroker.ack(%s, %s::text[], NULL)", [q, held[1:]])
    call("SELECT * FROM pgbroker.ack(%s, %s::text[], false)", [q, ["not-a-receipt"]])
    call("SELECT * FROM pgbroker.ack(%s, %s::text[], false)", ["no_such_queue", held[1:]])
    call("SELECT * FROM pgbroker.ack(%s, %s::text[], false)", [q, held[1:] + stale])

    batch_receipts = receipts("SELECT * FROM pgbroker.consume(%s, 30, 2)", [q])
    batch_receipts = receipts("SELECT * FROM pgbroker.consume(%s, 30, 2, %s::text[])", [q, batch_receipts])
    receipts("SELECT * FROM pgbroker.consume(%s, 30, 2, %s::text[], false)", [q, batch_receipts])
    call("SELECT * FROM pgbroker.consume(%s, -1, 2, %s::text[])", ["no_such_queue", ["bad"]])
    call("SELECT * FROM pgbroker.consume(%s, -1, 2, %s::text[])", [q, ["bad"]])
    call("SELECT * FROM pgbroker.consume(%s, 30, 2, %s::text[])", [q, ["bad"]])

    # pgmq's unfenced removals by msg_id (_route_remove): archive and delete, the single forms and
    # the batch ones, a msg_id that is gone, a missing queue.
    removable = call("SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])", [q, batch[:5]])
    removable = [r[0] for r in removable]
    call("SELECT pgmq.archive(%s, %s::bigint)", [q, removable[0]], lambda r: r)
    call("SELECT * FROM pgmq.archive(%s, %s::bigint[])", [q, removable[1:3]])
    call("SELECT pgmq.delete(%s, %s::bigint)", [q, removable[3]], lambda r: r)
    call("SELECT * FROM pgmq.delete(%s, %s::bigint[])", [q, [removable[4], removable[0]]])
    call("SELECT pgmq.delete(%s, %s::bigint)", [q, removable[0]], lambda r: r)
    call("SELECT pgmq.archive(%s, %s::bigint)", [q.upper(), removable[3]], lambda r: r)
    call("SELECT pgmq.delete(%s, 1::bigint)", ["no_such_queue"])
    call("SELECT * FROM pgmq.archive(%s, ARRAY[1]::bigint[])", ["no_such_queue"])

    call("SELECT * FROM pgmq.pop(%s, 2)", [q], _message)
    call("SELECT * FROM pgmq.pop(%s, -1)", [q])
    call("SELECT * FROM pgmq.pop(%s)", ["no_such_queue"])

    # Policies are written into the routes: a depth limit and a delivery limit.
    conn.execute("SELECT pgbroker.set_policy(%s, max_depth => 4)", [q])
    call("SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])", [q, batch])
    conn.execute("SELECT pgbroker.set_policy(%s, max_depth => NULL, max_deliveries => 1)", [q])
    receipts("SELECT * FROM pgbroker.read(%s, 0, 3)", [q])
    receipts("SELECT * FROM pgbroker.consume(%s, 0, 3)", [q])
    conn.execute("SELECT pgbroker.set_policy(%s, max_deliveries => NULL, ack_mode => 'delete')", [q])
    last = receipts("SELECT * FROM pgbroker.consume(%s, 30, 1)", [q])
    receipts("SELECT * FROM pgbroker.consume(%s, 30, 1, %s::text[])", [q, last])

    out.append(("queue", [(r[0], r[1], r[3], r[4]) for r in q_rows(conn, q)]))
    out.append(("archive", [(r[0], r[1], r[2]) for r in a_rows(conn, q)]))
    return out


def test_routed_and_dynamic_paths_agree(dsn: str, other_dsn: str) -> None:
    with (
        psycopg.connect(dsn, autocommit=True) as routed,
        psycopg.connect(other_dsn, autocommit=True) as dynamic,
    ):
        dynamic.execute("SET pgbroker.route_limit = 0")
        for conn in (routed, dynamic):
            conn.execute("SELECT pgmq.create('jobs')")
        assert _routed(routed, "jobs")
        assert not _routed(dynamic, "jobs")
        got_routed = _scenario(routed, "jobs")
        got_dynamic = _scenario(dynamic, "jobs")
        assert _routed(routed, "jobs")
        assert not _routed(dynamic, "jobs")
    assert got_routed == got_dynamic
    # The scenario is not vacuous: it saw rows and errors of each kind.
    kinds = [kind for kind, _ in got_routed]
    assert kinds.count("error") >= 15
    assert kinds.count("rows") >= 15


def test_routes_follow_queues_in_their_transaction(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SELECT pgmq.create('early')")
            assert _routed(conn, "early")
            conn.execute("SELECT * FROM pgmq.send('early', '{}')")
        with conn.transaction(force_rollback=True):
            conn.execute("SELECT pgmq.create('undone')")
            assert _routed(conn, "undone")
        assert not _routed(conn, "undone")
        assert _routed(conn, "early")
        conn.execute("SELECT pgmq.drop_queue('early')")
        assert not _routed(conn, "early")
        with pytest.raises(psycopg.errors.UndefinedTable) as missing:  # pgmq's failure, 42P01
            conn.execute("SELECT * FROM pgmq.send('early', '{}')")
        assert missing.value.diag.message_detail == 'pgbroker PB002: queue "early" does not exist'


def test_queues_past_the_route_limit_take_the_dynamic_path(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET pgbroker.route_limit = 2")
        for name in ("first", "second", "third"):
            conn.execute("SELECT pgmq.create(%s)", [name])
        # The oldest queues are routed.
        assert [_routed(conn, n) for n in ("first", "second", "third")] == [True, True, False]
        for name in ("first", "third"):
            sent = conn.execute("SELECT * FROM pgmq.send_batch(%s, ARRAY['{}', '{}']::jsonb[])", [name])
            ids = [r[0] for r in sent]
            read = conn.execute("SELECT msg_id, receipt FROM pgbroker.read(%s, 30, 5)", [name]).fetchall()
            assert [r[0] for r in read] == ids
            ack = "SELECT * FROM pgbroker.ack(%s, %s::text[], false)"
            acked = conn.execute(ack, [name, [r[1] for r in read]])
            assert [r[0] for r in acked] == ids


def test_queues_created_at_once_are_all_routed(dsn: str) -> None:
    names = [f"together_{i}" for i in range(6)]
    errors: list[BaseException] = []

    def create(name: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT pgmq.create(%s)", [name])
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert all(_routed(conn, n) for n in names)


def test_a_routed_statement_reads_only_its_own_queue(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in ("alpha", "beta", "gamma"):
            conn.execute("SELECT pgmq.create(%s)", [name])
            conn.execute("SELECT * FROM pgmq.send(%s, %s::jsonb)", [name, json.dumps({"q": name})])
        for name in ("gamma", "alpha", "beta"):
            rows = conn.execute("SELECT message FROM pgmq.pop(%s)", [name]).fetchall()
            assert rows == [({"q": name},)]
        counts = [
            conn.execute(sql.SQL("SELECT count(*) FROM pgmq.{}").format(sql.Identifier(f"q_{n}"))).fetchone()
            for n in ("alpha", "beta", "gamma")
        ]
        assert counts == [(0,), (0,), (0,)]


@pytest.mark.parametrize(
    "call",
    [
        "SELECT count(*) FROM pgmq.pop('jobs', 1)",
        "SELECT count(*) FROM pgmq.read('jobs', 30, 1)",
        "SELECT count(*) FROM pgbroker.read('jobs', 30, 1)",
    ],
)
def test_a_routed_read_looks_the_queue_s_bounds_up_once(dsn: str, call: str) -> None:
    """Both scans of a read (the ready messages from ready_from, the timed ones from timed_from)
    start from one look-up of the queue's bounds, made by the route: the timed scan looked them
    up again in the statement (an InitPlan calling pgbroker._queue_bounds), a third of a one-message
    pop's own time with its helper's call. The advance a read makes now and then looks them up
    too, once or twice: the count allows for those."""
    reads = 60
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT pgmq.create('jobs')")
        conn.execute("SELECT pgmq.send_batch('jobs', array_fill('{}'::jsonb, ARRAY[%s]))", [reads])
        conn.commit()
        conn.execute("SET LOCAL track_functions = 'all'")
        for _ in range(reads):
            conn.execute(call)
        calls: dict[str, int] = dict(
            conn.execute(
                "SELECT funcname, calls FROM pg_stat_xact_user_functions"
                " WHERE schemaname = 'pgbroker' AND funcname IN ('_queue_bounds', '_advance_head')"
            ).fetchall()
        )
    advances = calls.get("_advance_head", 0)
    assert reads <= calls["_queue_bounds"] <= reads + 2 * advances


@pytest.mark.parametrize(
    ("call", "per_send"),
    [
        ("SELECT pgmq.send('jobs', %s::jsonb)", 1),
        ("SELECT pgmq.send_batch('jobs', array_fill(%s::jsonb, ARRAY[10]))", 10),
    ],
)
def test_a_plain_send_calls_nothing_for_its_checks(dsn: str, call: str, per_send: int) -> None:
    """Messages without headers to a routed queue, within the default size in the caller's own
    rights, pass every check of a send: the route goes straight to its INSERT. Each check was a
    nested PL/pgSQL call (the size limit's two, and a batch's sizes a query), about a tenth of such
    a send's rate. The size test left in the route is an SQL function, inlined: a call of it would
    be counted here."""
    sends = 20
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT pgmq.create('jobs')")
        conn.commit()
        conn.execute("SET LOCAL track_functions = 'all'")
        for n in range(sends):
            conn.execute(call, [json.dumps({"n": n})])
        calls: dict[str, int] = dict(
            conn.execute(
                "SELECT funcname, calls FROM pg_stat_xact_user_functions WHERE schemaname = 'pgbroker'"
            ).fetchall()
        )
        stored = conn.execute("SELECT count(*) FROM pgmq.q_jobs").fetchone()
    # Planning the route may run a constant's function once in the session: not a call a send.
    assert {name: n for name, n in calls.items() if n >= sends} == {"_authorize": sends, "_route_send": sends}
    assert stored == (sends * per_send,)
