"""Deduplication (34_dedup.sql): header x-pgbroker-dedup-key, the dedup window and the 'queued'
mode, racing senders, and the keys' trimming.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from pgbroker import Broker, Queue
from tests.support.tables import Conn, jsonb_array

K = "x-pgbroker-dedup-key"


def _send(conn: Conn, queue: str, key: str | None, n: int = 0) -> int:
    headers = None if key is None else Jsonb({K: key})
    row = conn.execute("SELECT pgmq.send(%s, %s, %s::jsonb)", [queue, Jsonb({"n": n}), headers]).fetchone()
    assert row is not None
    return int(row[0])


def _count(conn: Conn, queue: str) -> int:
    count = sql.SQL("SELECT count(*) FROM pgmq.{}").format(sql.Identifier(f"q_{queue}"))
    row = conn.execute(count).fetchone()
    assert row is not None
    return int(row[0])


def test_a_key_sent_again_within_the_window_returns_the_first_msg_id(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('d')")
    first = _send(conn, "d", "order-1", 1)
    assert _send(conn, "d", "order-1", 2) == first
    other = _send(conn, "d", "order-2", 3)
    assert other != first
    assert _send(conn, "d", None) not in (first, other)  # no key: always stored
    assert _count(conn, "d") == 3
    # In the window even once consumed (SQS FIFO's rule).
    conn.execute("SELECT pgmq.delete('d', %s::bigint)", [first])
    assert _send(conn, "d", "order-1", 4) == first
    assert _count(conn, "d") == 2


def test_keys_are_per_queue(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('d')")
    conn.execute("SELECT pgmq.create('e')")
    assert _send(conn, "d", "k") == _send(conn, "d", "k")
    assert _count(conn, "e") == 0
    _send(conn, "e", "k")
    assert _count(conn, "e") == 1


def test_a_key_is_free_again_after_the_window(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('d')")
    conn.execute("SELECT pgbroker.set_policy('d', dedup_window_seconds => 1)")
    first = _send(conn, "d", "k")
    conn.execute("UPDATE pgbroker.dedup_keys SET sent_at = sent_at - interval '2 seconds'")
    second = _send(conn, "d", "k")
    assert second != first
    assert _send(conn, "d", "k") == second
    assert _count(conn, "d") == 2


def test_queued_mode_refuses_a_key_only_while_its_message_is_in_the_queue(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('d')")
    conn.execute("SELECT pgbroker.set_policy('d', dedup_mode => 'queued')")
    first = _send(conn, "d", "job-7")
    assert _send(conn, "d", "job-7") == first
    conn.execute("SELECT * FROM pgmq.read('d', 30, 1)")  # in flight: still in the queue
    assert _send(conn, "d", "job-7") == first
    conn.execute("SELECT pgmq.archive('d', %s::bigint)", [first])
    second = _send(conn, "d", "job-7")
    assert second != first
    assert _count(conn, "d") == 1


def test_a_batch_repeating_a_key_stores_it_once(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('d')")
    ids = conn.execute(
        "SELECT pgmq.send_batch('d', %s::jsonb[], %s::jsonb[])",
        [jsonb_array([{"n": i} for i in range(4)]), jsonb_array([{K: "a"}, {K: "b"}, {K: "a"}, {}])],
    ).fetchall()
    assert [r[0] for r in ids][2] == ids[0][0]
    assert len({r[0] for r in ids}) == 3
    assert _count(conn, "d") == 3


def test_a_rolled_back_send_frees_its_key(dsn: str, conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('d')")
    with psycopg.connect(dsn) as other:
        _send(other, "d", "k")
        other.rollback()
    _send(conn, "d", "k")
    assert _count(conn, "d") == 1


def test_two_senders_racing_on_one_key_store_one_message(dsn: str, conn: Conn) -> None:
    """Two real sessions send the same key in open transactions: the second blocks on the first's
    claim until it commits, then returns the first's msg_id. Repeated to give the race chances."""
    conn.execute("SELECT pgmq.create('d')")
    for round_ in range(20):
        key = f"race-{round_}"
        barrier = threading.Barrier(2)
        results: list[int] = []
        errors: list[BaseException] = []

        def sender(
            n: int,
            key: str = key,
            barrier: threading.Barrier = barrier,
            results: list[int] = results,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                with psycopg.connect(dsn) as c:
                    barrier.wait()
                    msg_id = _send(c, "d", key, n)
                    c.execute("SELECT pg_sleep(0.01 * %s)", [n])  # commit apart, either order
                    c.commit()
                    results.append(msg_id)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=sender, args=(n,)) for n in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert len(results) == 2
        assert results[0] == results[1], f"round {round_}: two messages for one key {results}"
    assert _count(conn, "d") == 20


def test_a_sender_waiting_on_a_key_that_rolls_back_stores_it(dsn: str, conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('d')")
    with psycopg.connect(dsn) as first:
        _send(first, "d", "k", 1)
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(_send_in_own_session(dsn, "k")))
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive(), "the second sender must wait for the first one's claim"
        first.rollback()
    waiter.join()
    row = conn.execute("SELECT msg_id, message FROM pgmq.q_d").fetchall()
    assert row == [(got[0], {"n": 2})]


def _send_in_own_session(dsn: str, key: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as c:
        return _send(c, "d", key, 2)


def test_trim_removes_only_keys_whose_time_is_over(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('d')")
    conn.execute("SELECT pgmq.create('u')")
    conn.execute("SELECT pgbroker.set_policy('u', dedup_mode => 'queued')")
    _send(conn, "d", "old")
    _send(conn, "d", "new")
    conn.execute("UPDATE pgbroker.dedup_keys SET sent_at = now() - interval '1 hour' WHERE dedup_key = 'old'")
    gone = _send(conn, "u", "done")
    _send(conn, "u", "waiting")
    conn.execute("SELECT pgmq.delete('u', %s::bigint)", [gone])
    assert conn.execute("SELECT pgbroker.trim_dedup_keys()").fetchone() == (2,)
    keys = conn.execute("SELECT queue_name, dedup_key FROM pgbroker.dedup_keys ORDER BY 1, 2").fetchall()
    assert keys == [("d", "new"), ("u", "waiting")]


@pytest.mark.parametrize("bad", ["", 42, True, "x" * 513])
def test_a_bad_dedup_key_is_refused(conn: Conn, bad: Any) -> None:
    conn.execute("SELECT pgmq.create('d')")
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT pgmq.send('d', '{}', %s::jsonb)", [Jsonb({K: bad})])
    assert caught.value.sqlstate == "PB007"
    assert _count(conn, "d") == 0


def test_the_clients_send_dedup_keys(queue: Queue) -> None:
    first = queue.send({"n": 1}, dedup_key="invoice-9")
    assert queue.send({"n": 2}, dedup_key="invoice-9") == first
    policy = queue.set_policy(dedup_window_seconds=60, dedup_mode="queued")
    assert (policy.dedup_window_seconds, policy.dedup_mode) == (60, "queued")
    assert len(queue.peek()) == 1


def test_a_replayed_dead_letter_is_sent_again_whatever_its_dedup_key(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('d')")
    conn.execute("SELECT pgmq.create('d_dlq')")
    conn.execute("SELECT pgbroker.set_policy('d', max_deliveries => 1, dead_letter_queue => 'd_dlq')")
    first = _send(conn, "d", "k")
    [(receipt,)] = conn.execute("SELECT receipt FROM pgbroker.read('d', 30, 1)").fetchall()
    conn.execute("SELECT pgbroker.fail('d', %s, 'boom')", [receipt])
    assert _count(conn, "d") == 0
    [(_, again)] = conn.execute("SELECT * FROM pgbroker.replay_dead_letters('d')").fetchall()
    assert again != first
    assert conn.execute("SELECT headers FROM pgmq.q_d").fetchall() == [(None,)]


def test_the_clients_and_maintain_forget_expired_keys(dsn: str, broker: Broker, conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('d')")
    for key in ("a", "b", "c"):
        _send(conn, "d", key)
    conn.execute("UPDATE pgbroker.dedup_keys SET sent_at = now() - interval '1 hour' WHERE dedup_key <> 'c'")
    assert broker.queue("d").trim_dedup_keys(batch_size=1) == 1
    assert broker.trim_dedup_keys() == 1
    assert broker.trim_dedup_keys() == 0
    _send(conn, "d", "e")
    conn.execute("UPDATE pgbroker.dedup_keys SET sent_at = now() - interval '1 hour' WHERE dedup_key = 'e'")
    done = subprocess.run(
        [sys.executable, "-m", "pgbroker", "maintain", "--dsn", dsn],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "forgot 1 expired dedup key" in done.stdout
    assert conn.execute("SELECT dedup_key FROM pgbroker.dedup_keys").fetchall() == [("c",)]


def _idempotent(conn: Conn, key: str, *messages: Any, window: int = 86400) -> list[int]:
    rows = conn.execute(
        "SELECT * FROM pgbroker.send_idempotent('d', %s, %s::jsonb[], NULL, 0, %s)",
        [key, [Jsonb(m) for m in messages], window],
    ).fetchall()
    return [int(r[0]) for r in rows]


def test_an_idempotent_send_answers_its_key_again_and_refuses_it_for_another_request(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('d')")
    first = _idempotent(conn, "req-1", {"n": 1}, {"n": 2})
    assert _idempotent(conn, "req-1", {"n": 1}, {"n": 2}) == first
    with pytest.raises(psycopg.Error, match="idempotency key 'req-1' was used for another request") as raised:
        _idempotent(conn, "req-1", {"n": 1})
    assert raised.value.sqlstate == "PB009"
    conn.rollback()
    assert _count(conn, "d") == 2


def test_an_idempotency_key_is_its_scopes_own(conn: Conn) -> None:
    """Two senders with scopes of their own (the HTTP API's API keys) may name requests alike: one's
    key neither answers the other's send with its msg_ids nor refuses it."""
    conn.execute("SELECT pgmq.create('d')")

    def send(scope: str | None, *messages: Any) -> list[int]:
        rows = conn.execute(
            "SELECT * FROM pgbroker.send_idempotent('d', 'order-7', %s::jsonb[], scope => %s)",
            [[Jsonb(m) for m in messages], scope],
        ).fetchall()
        return [int(r[0]) for r in rows]

    mine = send("a", {"n": 1})
    theirs = send("b", {"n": 1})  # the same request in another scope: sent, not answered
    unscoped = send(None, {"n": 2})  # another request in no scope: sent, not refused
    assert len({*mine, *theirs, *unscoped}) == 3
    assert send("b", {"n": 1}) == theirs
    with pytest.raises(psycopg.Error, match="idempotency scope must be at most 255 characters") as raised:
        send("s" * 256, {"n": 3})
    assert raised.value.sqlstate == "PB007"
    conn.rollback()
    assert _count(conn, "d") == 3


def test_two_idempotent_senders_racing_on_one_key_store_one_batch(dsn: str, conn: Conn) -> None:
    """The second waits for the first's transaction, then answers its msg_ids."""
    conn.execute("SELECT pgmq.create('d')")
    conn.commit()
    for round_ in range(10):
        barrier = threading.Barrier(2)
        results: list[list[int]] = []

        def sender(
            n: int,
            key: str = f"race-{round_}",
            barrier: threading.Barrier = barrier,
            results: list[list[int]] = results,
        ) -> None:
            with psycopg.connect(dsn) as c:
                barrier.wait()
                ids = _idempotent(c, key, {"n": 1})
                c.execute("SELECT pg_sleep(0.01 * %s)", [n])  # commit apart, either order
                c.commit()
                results.append(ids)

        threads = [threading.Thread(target=sender, args=(n,)) for n in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 2
        assert results[0] == results[1]
    assert _count(conn, "d") == 10


def test_an_idempotency_key_is_free_after_its_window_and_trimmed(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('d')")
    first = _idempotent(conn, "req-1", {"n": 1}, window=1)
    conn.commit()
    conn.execute("SELECT pg_sleep(1.1)")
    assert _idempotent(conn, "req-1", {"n": 2}, window=1) != first  # a new request now
    conn.commit()
    conn.execute("SELECT pg_sleep(1.1)")
    row = conn.execute("SELECT pgbroker.trim_dedup_keys('d')").fetchone()
    assert row == (1,)
    assert conn.execute("SELECT count(*) FROM pgbroker.idempotency_keys").fetchone() == (0,)


def test_a_stream_send_with_an_idempotency_key_appends_once_and_its_key_is_trimmed(conn: Conn) -> None:
    conn.execute("SELECT pgbroker.create_stream('clicks')")

    def send(*messages: Any) -> list[int]:
        rows = conn.execute(
            "SELECT * FROM pgbroker.stream_send_idempotent('clicks', 'b-1', %s::jsonb[], NULL, NULL, 1)",
            [[Jsonb(m) for m in messages]],
        ).fetchall()
        return [int(r[0]) for r in rows]

    first = send({"n": 1}, {"n": 2})
    assert send({"n": 1}, {"n": 2}) == first
    with pytest.raises(psycopg.Error, match="idempotency key 'b-1' was used for another request"):
        send({"n": 3})
    conn.rollback()
    conn.commit()
    conn.execute("SELECT pg_sleep(1.1)")
    conn.execute("SELECT pgbroker.maintain_stream('clicks')")
    assert conn.execute("SELECT count(*) FROM pgbroker.stream_idempotency_keys").fetchone() == (0,)
