"""Query-plan tests of the job features: a read with priorities, a read under a per-key concurrency
limit and a read of a paused queue touch a number of buffers that does not grow with the backlog.

Two queues are built with INSERT ... SELECT: one with 1,000,000 waiting messages and one with
100,000, both spread over 5 priorities and 10 concurrency keys in their headers. Each whole call
(pgmq.read, every statement it runs included) is measured through auto_explain
(bench.buffers.PlanCapture), on both queues, and the big one may cost only a little more.
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from bench.buffers import CallPlans, PlanCapture, StatementPlan
from psycopg import sql

from tests.support.postgres import dsn_for_db

pytestmark = pytest.mark.slow

BIG = ("feat_big", 1_000_000)
SMALL = ("feat_small", 100_000)
BATCH = 10
#: Buffers a whole read call of 10 may touch (the lease of the ten rows included).
READ_BOUND = 250
#: Buffers the per-key read statement may touch: a descent per key to find the keys, one per key
#: with room to take its messages, and the lease of ten rows.
KEYED_BOUND = 400

Conn = psycopg.Connection[tuple[Any, ...]]


def _build(conn: Conn, name: str, size: int) -> None:
    table = sql.Identifier(f"q_{name}")
    conn.execute("SELECT pgmq.create(%s)", [name])
    conn.execute(
        sql.SQL(
            "INSERT INTO pgmq.{} (vt, message, headers) SELECT now(), jsonb_build_object('n', g),"
            " jsonb_build_object('x-pgbroker-priority', g %% 5, 'x-pgbroker-concurrency-key', 'k' || g %% 10)"
            " FROM generate_series(1, %s) g"
        ).format(table),
        [size],
    )
    conn.execute("SELECT pgbroker.set_policy(%s, priorities => true)", [name])
    conn.execute(sql.SQL("VACUUM ANALYZE pgmq.{}").format(table))


@pytest.fixture(scope="module")
def plan_dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    name = f"featplans_{uuid.uuid4().hex}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template_db)
            )
        )
    try:
        dsn = dsn_for_db(pg_admin_dsn, name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for queue, size in (BIG, SMALL):
                _build(conn, queue, size)
        yield dsn
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def plan_conn(plan_dsn: str) -> Iterator[Conn]:
    with psycopg.connect(plan_dsn, autocommit=True) as conn:
        yield conn


def _reads(conn: Conn, queue: str, reads: int = 5) -> list[CallPlans]:
    capture = PlanCapture(conn)
    assert capture.enable(), "auto_explain needs a superuser session"
    capture.call("SELECT * FROM pgmq.read(%s, 3600, %s)", [queue, BATCH])  # warm the caches
    return [capture.call("SELECT * FROM pgmq.read(%s, 3600, %s)", [queue, BATCH]) for _ in range(reads)]


def _read_statement(call: CallPlans) -> StatementPlan:
    """The statement that found, locked and leased the rows: the call's largest, leaving out the
    calls of other functions and the bounds' advance that one read in sixteen makes."""
    own = [
        p
        for p in call.nested
        if p.node_types[:1] != ["Function Scan"] and "pgbroker._advance_head" not in p.text
    ]
    return max(own, key=lambda p: p.buffers)


def _median(calls: list[CallPlans]) -> int:
    return int(statistics.median(c.top.buffers for c in calls))


def _assert_flat(big: int, small: int, what: str, bound: int = READ_BOUND) -> None:
    print(f"{what}: {big} buffers with {BIG[1]:,} waiting, {small} with {SMALL[1]:,}")
    assert big <= bound, f"{what}: a read of {BATCH} touched {big} buffers with {BIG[1]:,} waiting"
    assert big <= small * 1.5 + 10, (
        f"{what}: {big} buffers with {BIG[1]:,} waiting, {small} with {SMALL[1]:,}"
    )


def test_prioritized_reads_walk_the_priority_index_and_stay_flat(plan_conn: Conn) -> None:
    big, small = _reads(plan_conn, BIG[0]), _reads(plan_conn, SMALL[0])
    for call in big:
        assert len(call.rows) == BATCH
        assert all(row[6]["x-pgbroker-priority"] == 4 for row in call.rows), "the top priority goes first"
        assert f"q_{BIG[0]}_priority_idx" in _read_statement(call).indexes
        assert "Seq Scan" not in _read_statement(call).node_types
    _assert_flat(_median(big), _median(small), "priorities")


def test_reads_under_a_per_key_limit_stay_flat(plan_conn: Conn) -> None:
    """10 keys, 3 in flight per key: the first reads fill the room (30 leased for an hour), and
    later reads find every key full; both kinds must not walk the backlog of any key."""
    # Keys with room: those the other tests of this module left nothing in flight for.
    free = plan_conn.execute(
        sql.SQL(
            "SELECT 10 - count(DISTINCT headers->>'x-pgbroker-concurrency-key')"
            " FROM pgmq.{} WHERE read_ct > 0"
        ).format(sql.Identifier(f"q_{BIG[0]}"))
    ).fetchone()
    assert free is not None
    for queue, _ in (BIG, SMALL):
        plan_conn.execute("SELECT pgbroker.set_policy(%s, max_in_flight_per_key => 3)", [queue])
    try:
        big, small = _reads(plan_conn, BIG[0]), _reads(plan_conn, SMALL[0])
        taken = [len(c.rows) for c in big]
        assert taken[0] == BATCH, taken
        assert BATCH + sum(taken) == 3 * free[0], f"{taken}: each of {free[0]} keys gives 3, one read warmed"
        assert taken[-1] == 0, "every key is full by now"
        # The statement that finds, locks and leases: the call's largest (the count of what is in
        # flight walks the 30 leased rows only).
        assert all(f"q_{BIG[0]}_ckey_idx" in _read_statement(c).indexes for c in big)
        assert all("Seq Scan" not in _read_statement(c).node_types for c in big)
        keyed_big = max(_read_statement(c).buffers for c in big)
        keyed_small = max(_read_statement(c).buffers for c in small)
        _assert_flat(keyed_big, keyed_small, "per-key limit", KEYED_BOUND)
    finally:
        for queue, _ in (BIG, SMALL):
            plan_conn.execute("SELECT pgbroker.set_policy(%s, max_in_flight_per_key => 0)", [queue])


def test_a_paused_queue_reads_nothing_and_touches_no_queue_buffers(plan_conn: Conn) -> None:
    plan_conn.execute("SELECT pgbroker.pause(%s)", [BIG[0]])
    try:
        calls = _reads(plan_conn, BIG[0])
        assert all(c.rows == [] for c in calls)
        # One read in sixteen advances the queue's bounds first (before the route looks at the
        # read mode), which looks at the queue; the others must not touch it at all.
        plain = [c for c in calls if not any("_advance_head" in p.text for p in c.nested)]
        assert plain, "every read advanced the bounds (one in sixteen does): run it again"
        assert all(f"q_{BIG[0]}" not in p.text for c in plain for p in c.nested)
        print(f"paused: {_median(calls)} buffers per read")
        assert _median(calls) <= 20, f"a read of a paused queue touched {_median(calls)} buffers"
    finally:
        plan_conn.execute("SELECT pgbroker.resume(%s)", [BIG[0]])
