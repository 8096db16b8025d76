"""A stream consumer that reads inside an explicit transaction and leaves it open (idle in
transaction: a client that forgot its commit, or a debugger stopped in a handler) holds what its
read locked: its partitions' cursor rows, so those partitions wait for it. It must not hold up the
other consumers of its group beyond that: each of their reads answers at once, and they take the
partitions that are free."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

Conn = psycopg.Connection[Any]

# A read that waits longer than this is waiting for the idle transaction, not working (a read
# here takes milliseconds; the group's turn waits 100 ms at most).
ANSWERED_WITHIN = 5.0


def timed_read(conn: Conn, consumer: str, lease: int) -> tuple[float, list[tuple[Any, ...]]]:
    started = time.monotonic()
    rows = conn.execute(
        "SELECT partition, id FROM pgbroker.stream_read('events', 'g', %s, 100, %s)", [consumer, lease]
    ).fetchall()
    return time.monotonic() - started, rows


def test_a_reader_idle_in_transaction_holds_up_no_other_consumer_of_its_group(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgbroker.create_stream('events', 4)")
        conn.execute("SELECT pgbroker.create_stream_group('events', 'g', 'start')")
        conn.execute("SELECT pgbroker.stream_send_many('events', array_fill('{}'::jsonb, ARRAY[400]))")
    with psycopg.connect(dsn) as idle, psycopg.connect(dsn, autocommit=True) as other:
        # Alone in the group, it takes every partition, then its transaction stays open.
        _, first = timed_read(idle, "idle", 1)
        assert {partition for partition, _ in first} == {0, 1, 2, 3}
        # Never wait for the test's sake: a read that hangs fails here instead.
        other.execute("SET statement_timeout = '20s'")

        # A newcomer asks for its share of partitions the idle reader owns: it gets none yet,
        # and says so at once.
        waited, rows = timed_read(other, "other", 30)
        assert waited < ANSWERED_WITHIN
        assert rows == []
        # The idle reader's lease runs out: its partitions are free by the rules, but its open
        # transaction still holds their cursor rows, which the newcomer passes over.
        time.sleep(1.5)
        waited, rows = timed_read(other, "other", 30)
        assert waited < ANSWERED_WITHIN
        assert rows == []
        idle.rollback()

        # Once the transaction ends, the newcomer takes them all and reads from the start.
        waited, rows = timed_read(other, "other", 30)
    assert waited < ANSWERED_WITHIN
    assert {partition for partition, _ in rows} == {0, 1, 2, 3}
    assert len(rows) == 100


@pytest.mark.slow
def test_a_reader_idle_in_transaction_long_past_its_lease_holds_up_no_other_consumer(dsn: str) -> None:
    """A consumer a lease and a minute past its expiry is forgotten by the next reader that renews
    its own lease; the idle reader's row, locked by its open transaction, is left to a later read."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgbroker.create_stream('events', 4)")
        conn.execute("SELECT pgbroker.create_stream_group('events', 'g', 'start')")
        conn.execute("SELECT pgbroker.stream_send_many('events', array_fill('{}'::jsonb, ARRAY[400]))")
    with psycopg.connect(dsn) as idle, psycopg.connect(dsn, autocommit=True) as other:
        # Its row committed by a first read, then renewed (locked) by a read left open.
        idle.autocommit = True
        timed_read(idle, "idle", 1)
        idle.autocommit = False
        time.sleep(0.6)  # past half its lease: the next read renews it
        timed_read(idle, "idle", 1)
        other.execute("SET statement_timeout = '20s'")
        time.sleep(1 + 1 + 60 + 1)  # its lease, the reader's lease and a minute: long gone
        waited, rows = timed_read(other, "other", 1)
        assert waited < ANSWERED_WITHIN
        assert rows == []
        idle.rollback()
        time.sleep(0.6)  # past half the reader's lease: it renews, and forgets the one long gone
        waited, rows = timed_read(other, "other", 1)
        assert waited < ANSWERED_WITHIN
        assert len(rows) == 100
    with psycopg.connect(dsn, autocommit=True) as conn:
        consumers = conn.execute("SELECT consumer FROM pgbroker.stream_consumer ORDER BY 1").fetchall()
    assert consumers == [("other",)]


def test_a_reader_idle_in_transaction_holds_up_no_group_of_its_stream(dsn: str) -> None:
    """Each read may advance the stream's safe id (how far every group may read), one reader at a
    time, holding the stream's row to its commit: a reader left idle in transaction must not keep
    the new messages from every other group."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgbroker.create_stream('events', 4)")
        conn.execute("SELECT pgbroker.create_stream_group('events', 'g', 'start')")
        conn.execute("SELECT pgbroker.create_stream_group('events', 'h', 'start')")
        conn.execute("SELECT pgbroker.stream_send_many('events', array_fill('{}'::jsonb, ARRAY[40]))")
    with psycopg.connect(dsn) as idle, psycopg.connect(dsn, autocommit=True) as other:
        read = idle.execute("SELECT count(*) FROM pgbroker.stream_read('events', 'h', 'idle', 100, 30)")
        assert read.fetchone() == (40,)
        other.execute("SET statement_timeout = '20s'")
        other.execute("SELECT pgbroker.stream_send_many('events', array_fill('{}'::jsonb, ARRAY[60]))")

        waited, rows = timed_read(other, "other", 30)

        assert waited < ANSWERED_WITHIN
        assert len(rows) == 100
