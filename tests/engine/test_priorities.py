"""Priorities (32_priorities.sql): header x-pgbroker-priority, higher first, absent = 0, pgmq's order
within a priority; through pgmq.send/send_batch with headers, pgbroker.read, pop, the clients.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgbroker import Broker, Queue
from pgbroker.errors import InvalidArgument
from tests.support.tables import Conn, jsonb_array

P = "x-pgbroker-priority"


def _send(conn: Conn, queue: str, n: int, priority: Any = None) -> int:
    headers = None if priority is None else Jsonb({P: priority})
    row = conn.execute("SELECT pgmq.send(%s, %s, %s::jsonb)", [queue, Jsonb({"n": n}), headers]).fetchone()
    assert row is not None
    return int(row[0])


def _read_ns(conn: Conn, sql: str, *args: Any) -> list[int]:
    return [r[0]["n"] for r in conn.execute(sql, args).fetchall()]


def test_a_read_returns_higher_priorities_first_and_pgmq_order_within_one(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('p')")
    # n: the order they must come out in is by (priority desc, send order).
    sends = [(1, None), (2, 5), (3, -1), (4, 0), (5, 5), (6, "9"), (7, None)]
    for n, priority in sends:
        _send(conn, "p", n, priority)
    assert _read_ns(conn, "SELECT message FROM pgmq.read('p', 30, 3)") == [6, 2, 5]
    assert _read_ns(conn, "SELECT message FROM pgbroker.read('p', 30, 10)") == [1, 4, 7, 3]


def test_send_batch_with_headers_and_pop_follow_priorities(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('p')")
    conn.execute(
        "SELECT pgmq.send_batch('p', %s::jsonb[], %s::jsonb[])",
        [jsonb_array([{"n": i} for i in range(6)]), jsonb_array([{P: i % 3} for i in range(6)])],
    )
    assert _read_ns(conn, "SELECT message FROM pgmq.pop('p', 4)") == [2, 5, 1, 4]


def test_a_redelivery_keeps_its_priority(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('p')")
    high = _send(conn, "p", 1, 10)
    _send(conn, "p", 2)
    assert _read_ns(conn, "SELECT message FROM pgmq.read('p', 30, 1)") == [1]
    conn.execute("SELECT pgmq.set_vt('p', %s, 0)", [high])  # due again now
    assert _read_ns(conn, "SELECT message FROM pgmq.read('p', 30, 2)") == [1, 2]


def test_a_queue_without_priorities_keeps_its_plain_statements(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('plain')")
    _send(conn, "plain", 1)
    conn.execute("SELECT pgmq.send('plain', '{}', '{\"x-pgmq-group\": \"g\"}'::jsonb)")
    policy = conn.execute("SELECT priorities FROM pgbroker.policy('plain')").fetchone()
    assert policy == (False,)
    indexes = conn.execute(
        "SELECT indexname FROM pg_indexes WHERE tablename = 'q_plain' ORDER BY 1"
    ).fetchall()
    assert [i[0] for i in indexes] == ["q_plain_pkey", "q_plain_ready_idx", "q_plain_vt_idx"]
    route = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = '_route_read'").fetchone()
    assert route is not None
    assert "_priority" not in route[0]


def test_the_first_prioritized_send_builds_the_index_and_switches_the_routes(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('p')")
    _send(conn, "p", 1)
    _send(conn, "p", 2, 3)
    assert conn.execute("SELECT priorities FROM pgbroker.policy('p')").fetchone() == (True,)
    assert conn.execute("SELECT to_regclass('pgmq.q_p_priority_idx') IS NOT NULL").fetchone() == (True,)
    route = conn.execute("SELECT prosrc FROM pg_proc WHERE proname = '_route_read'").fetchone()
    assert route is not None
    assert "pgbroker._priority(headers) DESC" in route[0]
    # Turned off: the index goes, reads are in pgmq's order again.
    conn.execute("SELECT pgbroker.set_policy('p', priorities => false)")
    assert conn.execute("SELECT to_regclass('pgmq.q_p_priority_idx') IS NULL").fetchone() == (True,)
    assert _read_ns(conn, "SELECT message FROM pgmq.read('p', 30, 2)") == [1, 2]


@pytest.mark.parametrize("bad", [1.5, "high", True, [1], 10**10, ""])
def test_a_priority_that_is_not_an_integer_is_refused_and_nothing_is_sent(conn: Conn, bad: Any) -> None:
    conn.execute("SELECT pgmq.create('p')")
    with pytest.raises(psycopg.Error) as caught:
        _send(conn, "p", 1, bad)
    assert caught.value.sqlstate == "PB007"
    assert "x-pgbroker-priority must be an integer" in str(caught.value)
    assert conn.execute("SELECT count(*) FROM pgmq.q_p").fetchone() == (0,)


def test_a_null_job_header_is_no_header(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('p')")
    nulls = {P: None, "x-pgbroker-dedup-key": None, "x-pgbroker-concurrency-key": None}
    conn.execute("SELECT pgmq.send('p', '{}', %s::jsonb)", [Jsonb(nulls)])
    conn.execute("SELECT pgmq.send('p', '{}', %s::jsonb)", [Jsonb(nulls)])
    assert conn.execute("SELECT count(*) FROM pgmq.q_p").fetchone() == (2,)
    assert conn.execute("SELECT priorities FROM pgbroker.policy('p')").fetchone() == (False,)


def test_the_clients_send_priorities(broker: Broker, queue: Queue) -> None:
    queue.send({"n": 1})
    queue.send({"n": 2}, priority=7)
    queue.send({"n": 3}, priority=7, headers={"trace": "x"})
    found = queue.read_many(3)
    assert [m.message["n"] for m in found] == [2, 3, 1]
    assert found[1].headers == {"trace": "x", P: 7}
    with pytest.raises(InvalidArgument):
        queue.send({}, priority=2**40)


def test_priorities_hold_under_four_concurrent_consumers(dsn: str, conn: Conn) -> None:
    """400 messages at priorities 0..3 in shuffled order; 4 consumers read batches of 5 at once,
    each read in its own transaction. Without timed messages a read locks exactly the rows it
    leases, so when a read R takes priority p, every waiting message of a higher priority was
    taken by R or by a read running at the same time. A violation is a higher-priority message
    taken by a read that began after R had returned: it was waiting, unlocked, throughout R."""
    conn.execute("SELECT pgmq.create('p')")
    priorities = [i % 4 for i in range(400)]
    random.Random(7).shuffle(priorities)
    conn.execute(
        "SELECT pgmq.send_batch('p', %s::jsonb[], %s::jsonb[])",
        [jsonb_array([{"n": i} for i in range(400)]), jsonb_array([{P: p} for p in priorities])],
    )
    reads: list[tuple[float, float, list[int]]] = []  # (began, returned, priorities taken)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while True:
                    began = time.monotonic()
                    got = [int(h[P]) for (h,) in c.execute("SELECT headers FROM pgmq.read('p', 300, 5)")]
                    returned = time.monotonic()
                    if not got:
                        return
                    assert got == sorted(got, reverse=True), f"a batch out of priority order: {got}"
                    with lock:
                        reads.append((began, returned, got))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sum(len(got) for _, _, got in reads) == 400
    violations = [
        (low, high)
        for _, returned, got in reads
        for began, _, later in reads
        if began > returned
        for low, high in [(min(got), max(later))]
        if high > low
    ]
    assert not violations, f"{len(violations)} reads took a lower priority while a higher one waited"
    assert len({round(b, 3) for b, _, _ in reads}) > 1
