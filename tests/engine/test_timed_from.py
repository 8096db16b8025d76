"""Where reads start looking for due messages (queue_head.timed_from, migration 0013).

Acked messages leave dead entries in the timed index until VACUUM; reads scan it from timed_from
instead of from the oldest entry, so they stop walking those entries. The bound must never pass a
message that is or will become due: not one leased by a transaction still open while the bound
advances, not one set_vt moves into the past, and, whatever a writer does, a sweep below the
bound finds a due message within seconds.
"""

from __future__ import annotations

import json
import time

import psycopg
import pytest
from bench.buffers import PlanCapture
from psycopg import sql

from tests.support.tables import Conn, advance_head

MARGIN = 1.0  # seconds: the candidate's margin in pgbroker._advance_timed


@pytest.fixture
def q(conn: Conn) -> str:
    conn.execute("SELECT pgmq.create('timed')")
    # The dead entries under test are there until VACUUM: an autovacuum run in the middle of a test
    # (20,000 deletes call for one) would clean them away and leave nothing to skip.
    conn.execute("ALTER TABLE pgmq.q_timed SET (autovacuum_enabled = off)")
    return "timed"


def _lease_and_ack(conn: Conn, q: str, n: int, vt: int) -> None:
    """Send n messages, read them all with a lease of vt seconds and ack (delete) them."""
    table = sql.Identifier(f"q_{q}")
    conn.execute(
        sql.SQL("INSERT INTO pgmq.{} (vt, message) SELECT now(), '{{}}' FROM generate_series(1, %s)").format(
            table
        ),
        [n],
    )
    while True:
        receipts = [r[0] for r in conn.execute("SELECT receipt FROM pgbroker.read(%s, %s, 1000)", [q, vt])]
        if not receipts:
            return
        conn.execute("SELECT count(*) FROM pgbroker.ack(%s, %s::text[], false)", [q, receipts])


def _read_buffers(conn: Conn, q: str) -> int:
    """Buffers of the statement that picks and leases a read of 10, bounds left as they are."""
    capture = PlanCapture(conn)
    assert capture.enable(), "auto_explain needs a superuser session"
    # In one transaction that is rolled back: a read's own advance cannot move the bounds there.
    with conn.transaction(force_rollback=True):
        capture.call("SELECT * FROM pgbroker.read(%s, 30, 10)", [q])  # warm the caches
        plans = capture.call("SELECT * FROM pgbroker.read(%s, 30, 10)", [q])
        # The lease statement itself: a read's occasional advance runs statements of its own.
        return max(p.buffers for p in plans.nested if "leased AS" in p.text)


def _send(conn: Conn, q: str, n: int) -> list[int]:
    msgs = [json.dumps({"n": i}) for i in range(n)]
    return [r[0] for r in conn.execute("SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])", [q, msgs])]


def test_reads_skip_the_dead_timed_entries_of_acked_messages(conn: Conn, dsn: str, q: str) -> None:
    _lease_and_ack(conn, q, 20_000, vt=1)
    _send(conn, q, 20)
    time.sleep(1 + MARGIN + 0.2)  # every acked lease has ended and is older than the margin
    head = advance_head(dsn, q)
    assert head["timed_from"] is not None
    bounded = _read_buffers(conn, q)
    # No bound, and no candidate that a read's own advance could complete.
    forget = "UPDATE pgbroker.queue_head SET timed_from = NULL, timed_next = NULL WHERE queue_name = %s"
    conn.execute(forget, [q])
    unbounded = _read_buffers(conn, q)
    # 20,000 dead entries are some 60 index pages: walked without the bound, skipped with it.
    assert unbounded - bounded >= 40, (bounded, unbounded, head)
    assert bounded <= 150, (bounded, unbounded)


def test_an_expired_lease_is_read_again_after_the_bound_moves(conn: Conn, dsn: str, q: str) -> None:
    [msg_id] = _send(conn, q, 1)
    conn.execute("SELECT * FROM pgbroker.read(%s, 1, 1)", [q])
    time.sleep(1 + MARGIN + 0.2)
    advance_head(dsn, q)
    time.sleep(MARGIN + 0.2)
    head = advance_head(dsn, q)
    assert head["timed_from"] is not None
    rows = conn.execute("SELECT msg_id, read_ct FROM pgbroker.read(%s, 30, 5)", [q]).fetchall()
    assert rows == [(msg_id, 2)]


def test_a_lease_written_by_a_transaction_open_during_advances_is_not_passed(dsn: str, q: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as setup:
        [msg_id] = _send(setup, q, 1)
    advance_head(dsn, q, times=1)
    with psycopg.connect(dsn) as writer:
        # A read advances the bounds now and then, holding the queue's advance lock to its end; in
        # REPEATABLE READ it never does, so the advances below are the other session's.
        writer.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        # vt 0: the lease ends at once, so the message is due, at a vt the advances below pass.
        writer.execute("SELECT * FROM pgbroker.read(%s, 0, 1)", [q]).fetchall()
        time.sleep(MARGIN + 0.2)
        advance_head(dsn, q, times=4)  # records a candidate past the lease; step 2 must wait for writer
        time.sleep(MARGIN + 0.2)
        advance_head(dsn, q, times=2)
        writer.commit()
    advance_head(dsn, q, times=3)
    with psycopg.connect(dsn, autocommit=True) as reader:
        rows = reader.execute("SELECT msg_id, read_ct FROM pgbroker.read(%s, 30, 5)", [q]).fetchall()
    assert rows == [(msg_id, 2)]


def test_set_vt_into_the_past_lowers_the_bound(conn: Conn, dsn: str, q: str) -> None:
    [msg_id] = _send(conn, q, 1)
    conn.execute("SELECT * FROM pgbroker.read(%s, 3600, 1)", [q])  # leased for an hour
    time.sleep(MARGIN + 0.2)
    advance_head(dsn, q)
    time.sleep(MARGIN + 0.2)
    before = advance_head(dsn, q)["timed_from"]
    assert before is not None
    conn.execute("SELECT * FROM pgmq.set_vt(%s, %s, now() - interval '1 day')", [q, msg_id])
    assert advance_head(dsn, q, times=1)["timed_from"] < before
    rows = conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, 5)", [q]).fetchall()
    assert rows == [(msg_id,)]


def test_the_sweep_finds_a_due_message_below_the_bound(conn: Conn, dsn: str, q: str) -> None:
    [msg_id] = _send(conn, q, 1)
    conn.execute("SELECT * FROM pgbroker.read(%s, 0, 1)", [q])  # due again at once
    # A bound past the message, as a writer the rules miss would leave it, with the sweep not due.
    stray = (
        "UPDATE pgbroker.queue_head"
        " SET timed_from = clock_timestamp() + interval '1 minute', timed_swept_at = {}"
    )
    advance_head(dsn, q, times=1)
    conn.execute(sql.SQL(stray).format(sql.SQL("clock_timestamp()")))
    assert conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, 5)", [q]).fetchall() == []
    conn.execute(sql.SQL(stray).format(sql.SQL("NULL")))  # the sweep is due
    advance_head(dsn, q, times=1)
    assert conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, 5)", [q]).fetchall() == [(msg_id,)]


@pytest.mark.parametrize("function", ["read", "read_grouped"])
def test_a_lease_ending_in_the_past_is_read_again_at_once(
    conn: Conn, dsn: str, q: str, function: str
) -> None:
    """pgmq's reads take a negative vt (pgmq's terms, 0018) and lease into the past, below
    timed_from: they lower the bound first, so the next read finds the message at once rather
    than after the next sweep."""
    [first, second] = _send(conn, q, 2)
    advance_head(dsn, q)
    time.sleep(MARGIN + 0.2)
    head = advance_head(dsn, q)
    assert head["timed_from"] is not None
    read = sql.SQL("SELECT msg_id, read_ct FROM pgmq.{}(%s, -100, 1)").format(sql.Identifier(function))
    assert conn.execute(read, [q]).fetchall() == [(first, 1)]
    rows = conn.execute("SELECT msg_id, read_ct FROM pgmq.read(%s, 30, 5)", [q]).fetchall()
    assert rows == [(first, 2), (second, 1)]
