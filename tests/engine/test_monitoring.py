"""What the dashboard reads beyond one scrape (96_monitoring.sql): failure counters and messages
in flight per queue, the stats history sampled once per interval however many servers sample,
thinned for a chart and pruned past its retention, and the queue workers' heartbeat rows."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgbroker import Broker, Queue
from tests.support.tables import Conn


@pytest.fixture
def conn(module_conn: Conn) -> Conn:
    return module_conn


@pytest.fixture
def new_queue(module_broker: Broker) -> Callable[[], Queue]:
    return lambda: module_broker.create_queue(f"q{uuid.uuid4().hex[:16]}")


@pytest.fixture
def queue(new_queue: Callable[[], Queue]) -> Queue:
    return new_queue()


def activity(conn: Conn, queue: Queue) -> tuple[Any, ...]:
    row = conn.execute("SELECT * FROM pgbroker.queue_activity(%s)", (queue.name,)).fetchone()
    assert row is not None
    return tuple(row)


def expire(conn: Conn, queue: Queue, where: str = "true", read_ct: str = "read_ct") -> None:
    """End leases and back-offs now (rather than sleeping through them)."""
    conn.execute(
        sql.SQL("UPDATE pgmq.{} SET vt = now() - interval '1 s', read_ct = {} WHERE {}").format(
            sql.Identifier(f"q_{queue.name}"), sql.SQL(read_ct), sql.SQL(where)
        )
    )


def test_failures_and_messages_in_flight_are_counted(
    conn: Conn, queue: Queue, new_queue: Callable[[], Queue]
) -> None:
    queue.set_policy(max_deliveries=2, backoff="fixed", backoff_base_seconds=60)
    queue.send_many([1, 2, 3, 4])
    assert activity(conn, queue) == (0, 0, 0)
    first, second, third = queue.read_many(3)
    assert activity(conn, queue) == (3, 0, 0)
    queue.fail(first, error="x")  # retried: in flight still, waiting out its back-off
    queue.fail_many([second, third], error="y")
    assert activity(conn, queue) == (3, 3, 0)
    expire(conn, queue, where=f"msg_id = {first.msg_id}")
    again = queue.read()
    assert again is not None
    assert queue.fail(again, error="z") == "dead_lettered"
    assert activity(conn, queue) == (2, 3, 1)
    # A read past max_deliveries dead-letters too, and counts.
    expire(conn, queue, read_ct="2")
    queue.read_many(10)
    assert activity(conn, queue)[2] == 4
    assert activity(conn, new_queue()) == (0, 0, 0)


def test_the_history_is_sampled_once_per_interval_and_pruned(conn: Conn, queue: Queue) -> None:
    conn.execute("DELETE FROM pgbroker.queue_history")
    queue.send_many([1, 2])
    queue.read()

    def sample(interval: str = "1 hour", retention: str = "1 day") -> int:
        row = conn.execute(
            "SELECT pgbroker.sample_queue_history(%s::interval, %s::interval)", (interval, retention)
        ).fetchone()
        assert row is not None
        recorded: int = row[0]
        return recorded

    assert sample() >= 1
    assert sample() == 0  # another server sampled within the interval: nothing more
    [(length, in_flight, sent, retried)] = conn.execute(
        "SELECT queue_length, in_flight, total_sent, total_retried FROM pgbroker.queue_history"
        " WHERE queue_name = %s",
        (queue.name,),
    ).fetchall()
    assert (length, in_flight, sent, retried) == (2, 1, 2, 0)
    conn.execute("UPDATE pgbroker.queue_history SET sampled_at = sampled_at - interval '2 days'")
    assert sample() >= 1
    # The old sample is gone, past the retention; the new one stays.
    assert conn.execute(
        "SELECT count(*) FROM pgbroker.queue_history WHERE queue_name = %s", (queue.name,)
    ).fetchone() == (1,)
    with pytest.raises(psycopg.Error, match="retention must be > 0"):
        sample(retention="0 s")


def test_the_history_is_thinned_to_the_points_asked_for(conn: Conn, queue: Queue) -> None:
    conn.execute("DELETE FROM pgbroker.queue_history WHERE queue_name = %s", (queue.name,))
    conn.execute(
        "INSERT INTO pgbroker.queue_history"
        " SELECT %s, now() - make_interval(secs => n * 10), n, 0, NULL, 1000 - n, 0, 0, 0"
        " FROM generate_series(0, 359) n",  # an hour of samples every 10 s
        (queue.name,),
    )
    rows = conn.execute(
        "SELECT sampled_at, queue_length FROM pgbroker.queue_history(now() - interval '1 hour', 60)"
        " WHERE queue_name = %s",
        (queue.name,),
    ).fetchall()
    assert 55 <= len(rows) <= 61
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)  # oldest first
    assert rows[-1][1] == 0  # the latest sample is kept
    with pytest.raises(psycopg.Error, match="points"):
        conn.execute("SELECT * FROM pgbroker.queue_history(now(), 0)")


def test_a_worker_registers_beats_and_goes_and_a_dead_one_is_forgotten(conn: Conn, queue: Queue) -> None:
    conn.execute("DELETE FROM pgbroker.queue_workers")
    alive, dead = uuid.uuid4(), uuid.uuid4()
    beat = "SELECT pgbroker.worker_heartbeat(%s, %s, 'host-a', 42, 8, %s, %s, 1, 0)"
    conn.execute(beat, (queue.name, alive, 3, 10))
    conn.execute(beat, (queue.name, dead, 1, 0))
    conn.execute(beat, (queue.name, alive, 5, 20))  # renewed
    rows = conn.execute(
        "SELECT worker_id, host, pid, concurrency, in_flight, completed, heartbeat_age_sec < 60"
        " FROM pgbroker.queue_workers() WHERE queue_name = %s ORDER BY in_flight",
        (queue.name,),
    ).fetchall()
    assert rows == [(dead, "host-a", 42, 8, 1, 0, True), (alive, "host-a", 42, 8, 5, 20, True)]
    conn.execute(
        "UPDATE pgbroker.queue_workers SET heartbeat_at = now() - interval '2 minutes' WHERE worker_id = %s",
        (dead,),
    )
    listed = conn.execute("SELECT worker_id FROM pgbroker.queue_workers()").fetchall()
    assert listed == [(alive,)]  # stale: not listed
    conn.execute(beat, (queue.name, alive, 0, 21))  # any beat forgets the stale rows
    assert conn.execute("SELECT worker_id FROM pgbroker.queue_workers").fetchall() == [(alive,)]
    conn.execute("SELECT pgbroker.worker_stopped(%s, %s)", (queue.name, alive))
    assert conn.execute("SELECT count(*) FROM pgbroker.queue_workers").fetchone() == (0,)


def test_workers_are_listed_under_the_queue_s_stored_name_whatever_spelling_they_beat_with(
    conn: Conn, queue: Queue
) -> None:
    # Queue names fold; the beat stored the caller's spelling, so one queue's workers showed under
    # two names in /v1/workers and the dashboard, and a stop under another spelling left the row.
    conn.execute("DELETE FROM pgbroker.queue_workers")
    first, second = uuid.uuid4(), uuid.uuid4()
    beat = "SELECT pgbroker.worker_heartbeat(%s, %s, 'host-a', 42, 8, 0, %s, 0, 0)"
    conn.execute(beat, (queue.name.upper(), first, 1))
    conn.execute(beat, (queue.name.title(), second, 1))
    conn.execute(beat, (queue.name.swapcase().title(), first, 2))  # renewed under a third spelling
    rows = conn.execute("SELECT queue_name, worker_id, completed FROM pgbroker.queue_workers()").fetchall()
    assert sorted(rows, key=str) == sorted([(queue.name, first, 2), (queue.name, second, 1)], key=str)
    conn.execute("SELECT pgbroker.worker_stopped(%s, %s)", (queue.name.upper(), second))
    listed = conn.execute("SELECT worker_id FROM pgbroker.queue_workers()").fetchall()
    assert listed == [(first,)]


def test_a_heartbeat_names_a_queue_that_exists_and_a_host_of_a_hostname_s_length(
    conn: Conn, queue: Queue
) -> None:
    """A consumer's beats make rows that the workers panel lists: none for a queue that does not
    exist, and none with a host past 255 characters (a hostname is at most 253), which would
    fill the table at will; each refused call changes nothing."""
    conn.execute("DELETE FROM pgbroker.queue_workers")
    beat = "SELECT pgbroker.worker_heartbeat(%s, %s, %s, 42, 8, 0, 0, 0, 0)"
    with pytest.raises(psycopg.Error, match='queue "nope" does not exist') as err:
        conn.execute(beat, ("nope", uuid.uuid4(), "host-a"))
    assert err.value.sqlstate == "PB002"
    with pytest.raises(psycopg.Error, match="host") as err:
        conn.execute(beat, (queue.name, uuid.uuid4(), "h" * 256))
    assert err.value.sqlstate == "PB007"
    assert conn.execute("SELECT count(*) FROM pgbroker.queue_workers").fetchone() == (0,)
    conn.execute(beat, (queue.name, uuid.uuid4(), "h" * 255))
    assert conn.execute("SELECT count(*) FROM pgbroker.queue_workers").fetchone() == (1,)
