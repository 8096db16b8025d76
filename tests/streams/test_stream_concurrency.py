"""Streams under real concurrency, in separate processes: producers whose transactions commit out
of order, consumers sharing a group, a consumer SIGKILLed with a batch in hand, fan-out to
several groups. The ``sent`` and ``handled`` tables (tests/streams/processes.py) are the record."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from tests.streams import processes

pytestmark = pytest.mark.slow

Conn = psycopg.Connection[Any]
ctx = multiprocessing.get_context("spawn")


def start(target: Any, *args: Any) -> Any:
    p = ctx.Process(target=target, args=args, daemon=True)
    p.start()
    return p


def setup(conn: Conn, partitions: int, groups: list[str]) -> None:
    conn.execute(processes.TABLES)
    conn.execute("SELECT pgbroker.create_stream('events', %s)", (partitions,))
    for g in groups:
        conn.execute("SELECT pgbroker.create_stream_group('events', %s, 'start')", (g,))


def join_all(procs: list[Any], timeout: float) -> None:
    end = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, end - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, f"{len(alive)} processes did not finish in time"


def handled(conn: Conn, group: str) -> Counter[int]:
    return Counter(r[0] for r in conn.execute("SELECT id FROM handled WHERE group_name = %s", (group,)))


def sent(conn: Conn) -> set[int]:
    return {r[0] for r in conn.execute("SELECT id FROM sent")}


def test_out_of_order_commits_are_all_delivered_to_a_group_of_three(dsn: str, conn: Conn) -> None:
    setup(conn, 6, ["g"])
    producers, transactions, per = 8, 40, 10
    expected = producers * transactions * per
    deadline = time.monotonic() + 120
    procs = [start(processes.produce, dsn, "events", n, transactions, per, 3.0) for n in range(producers)]
    procs += [start(processes.consume, dsn, "events", "g", f"c{n}", expected, deadline, 5) for n in range(3)]
    join_all(procs, 150)
    got = handled(conn, "g")
    assert set(got) == sent(conn)
    assert len(got) == expected
    assert max(got.values()) == 1  # each ack is atomic with its record: exactly once here
    # Order per key: within a key, ids handled in increasing order.
    rows = conn.execute(
        "SELECT l.key, h.id FROM handled h JOIN pgbroker.s_events l ON l.id = h.id ORDER BY h.seq"
    ).fetchall()
    last: dict[str, int] = {}
    for key, msg_id in rows:
        assert msg_id > last.get(key, 0), f"key {key}: {msg_id} after {last[key]}"
        last[key] = msg_id


def test_a_killed_consumers_partitions_move_and_its_batch_is_delivered_again(dsn: str, conn: Conn) -> None:
    setup(conn, 4, ["g"])
    ids = [
        r[0]
        for r in conn.execute(
            "SELECT pgbroker.stream_send_many('events', array_fill('{}'::jsonb, ARRAY[400]))"
        )
    ]
    victim = start(processes.take_a_batch_and_hang, dsn, "events", "g", "victim", 2)
    while not conn.execute("SELECT count(*) FROM delivered").fetchone()[0]:  # type: ignore[index]
        time.sleep(0.05)
    owned = conn.execute("SELECT count(*) FROM pgbroker.stream_cursor WHERE owner = 'victim'").fetchone()[0]  # type: ignore[index]
    assert owned == 4
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    deadline = time.monotonic() + 60
    procs = [start(processes.consume, dsn, "events", "g", f"c{n}", len(ids), deadline, 2) for n in range(2)]
    join_all(procs, 90)
    got = handled(conn, "g")
    assert sorted(got) == ids
    assert max(got.values()) == 1
    in_hand = {r[0] for r in conn.execute("SELECT id FROM delivered WHERE consumer = 'victim'")}
    assert in_hand
    assert in_hand <= set(got)
    owners = {r[0] for r in conn.execute("SELECT DISTINCT owner FROM pgbroker.stream_cursor")}
    assert "victim" not in owners


def test_fan_out_each_group_sees_every_message_once(dsn: str, conn: Conn) -> None:
    groups = ["audit", "billing", "search"]
    setup(conn, 4, groups)
    producers, transactions, per = 4, 25, 10
    expected = producers * transactions * per
    deadline = time.monotonic() + 120
    procs = [start(processes.produce, dsn, "events", n, transactions, per, 1.0) for n in range(producers)]
    procs += [
        start(processes.consume, dsn, "events", g, f"{g}-{n}", expected, deadline, 5)
        for g in groups
        for n in range(2)
    ]
    join_all(procs, 150)
    everything = sent(conn)
    for g in groups:
        got = handled(conn, g)
        assert set(got) == everything, g
        assert max(got.values()) == 1, g
    # Fan-out without copies: one row per message in the log.
    assert conn.execute("SELECT count(*) FROM pgbroker.s_events").fetchone() == (expected,)


def test_a_killed_workers_partitions_are_served_by_the_other_long_before_its_lease(
    dsn: str, conn: Conn
) -> None:
    setup(conn, 4, ["g"])
    lease = 300  # reassignment by the lease would fail the bound below
    workers = {name: start(processes.stream_worker, dsn, "events", "g", name, lease) for name in ("a", "b")}
    owners: list[Any] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        consumers = conn.execute("SELECT count(*) FROM pgbroker.stream_consumer").fetchone()
        owners = conn.execute("SELECT owner FROM pgbroker.stream_cursor ORDER BY partition").fetchall()
        if consumers == (2,) and None not in {o for (o,) in owners}:
            break
        time.sleep(0.05)
    assert consumers == (2,), "the two workers did not start"
    assert None not in {o for (o,) in owners}, "the two workers did not start"
    victim_name = owners[0][0]
    survivor_name = "b" if victim_name == "a" else "a"
    victim = workers[victim_name]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    killed_at = time.monotonic()
    sends = conn.execute("SELECT pgbroker.stream_send_many('events', array_fill('{}'::jsonb, ARRAY[40]))")
    ids = [r[0] for r in sends]
    while set(handled(conn, "g")) != set(ids):
        assert time.monotonic() - killed_at < 120, "the killed worker's partitions were not served again"
        time.sleep(0.05)
    took = time.monotonic() - killed_at
    print(f"all partitions served again {took:.2f} s after the SIGKILL (lease {lease} s)")
    by_survivor = conn.execute("SELECT id FROM handled WHERE consumer = %s", (survivor_name,))
    assert {r[0] for r in by_survivor} >= set(ids)
    workers[survivor_name].kill()
    workers[survivor_name].join()
