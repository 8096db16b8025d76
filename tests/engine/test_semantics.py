"""Queue semantics: ordering, visibility, leases, concurrency and transactions."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from pgbroker import Broker, Queue, QueueNameConflict
from tests.support.tables import Conn, meta, q_ids, q_rows, visible_ids

Q = "jobs"


def read_ids(conn: Conn, qty: int, vt: int = 60) -> list[tuple[int, int]]:
    """(msg_id, read_ct) of the messages one pgmq.read returns."""
    rows = conn.execute("SELECT msg_id, read_ct FROM pgmq.read(%s, %s, %s)", [Q, vt, qty]).fetchall()
    return [(int(r[0]), int(r[1])) for r in rows]


def test_messages_are_read_in_msg_id_order(queue: Queue) -> None:
    ids = [queue.send({"n": n}) for n in range(10)]
    got = [m.msg_id for m in queue.read_many(4)] + [m.msg_id for m in queue.read_many(10)]
    assert got == ids


def test_batch_send_returns_ids_in_message_order(queue: Queue) -> None:
    ids = queue.send_many([{"n": n} for n in range(20)])
    assert ids == sorted(ids)
    assert len(set(ids)) == 20
    assert [(m.msg_id, m.message) for m in queue.read_many(20)] == [(i, {"n": n}) for n, i in enumerate(ids)]


def test_batch_send_with_delay_returns_ids_in_message_order(queue: Queue) -> None:
    ids = queue.send_many(["a", "b", "c"], headers=[{"i": 0}, None, {"i": 2}], delay=0)
    assert ids == sorted(ids)
    assert [(m.msg_id, m.message, m.headers) for m in queue.read_many(3)] == [
        (ids[0], "a", {"i": 0}),
        (ids[1], "b", None),
        (ids[2], "c", {"i": 2}),
    ]


def test_delayed_message_stays_invisible_until_due(queue: Queue) -> None:
    ready = queue.send("now")
    delayed = queue.send("later", delay=2)
    assert [m.msg_id for m in queue.read_many(10)] == [ready]
    time.sleep(2.2)
    [msg] = queue.read_many(10)
    assert (msg.msg_id, msg.read_ct, msg.message) == (delayed, 1, "later")


def test_expired_lease_makes_the_message_visible_again_with_read_ct_incremented(queue: Queue) -> None:
    msg_id = queue.send("x")
    first = queue.read(vt=2)
    assert first is not None
    assert (first.msg_id, first.read_ct) == (msg_id, 1)
    assert queue.read() is None
    time.sleep(2.2)
    again = queue.read(vt=60)
    assert again is not None
    assert (again.msg_id, again.read_ct) == (msg_id, 2)
    assert queue.read() is None


def test_redelivered_messages_come_before_newer_ready_ones(queue: Queue) -> None:
    old = queue.send("old")
    assert queue.read(vt=1) is not None
    newer = queue.send_many(["new1", "new2"])
    time.sleep(1.2)
    got = queue.read_many(2, vt=60)
    assert [(m.msg_id, m.read_ct) for m in got] == [(old, 2), (newer[0], 1)]
    assert [m.msg_id for m in queue.read_many(5)] == [newer[1]]


def test_nacked_message_is_delivered_before_newer_ready_ones(queue: Queue) -> None:
    first, second, third = queue.send_many(["a", "b", "c"])
    held = queue.read_many(2)
    queue.nack(held[0])
    got = queue.read_many(2)
    assert [(m.msg_id, m.read_ct) for m in got] == [(first, 2), (third, 1)]
    assert second == held[1].msg_id


def test_concurrent_readers_never_receive_the_same_message_within_its_lease(dsn: str, queue: Queue) -> None:
    total = 600
    queue.send_many(list(range(total)))
    readers = 4
    seen: list[list[int]] = [[] for _ in range(readers)]
    barrier = threading.Barrier(readers)
    errors: list[BaseException] = []

    def consume(slot: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                barrier.wait()
                while True:
                    got = read_ids(conn, qty=3, vt=300)
                    if not got:
                        return
                    seen[slot].extend(msg_id for msg_id, _ in got)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(slot,)) for slot in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    counts = Counter(msg_id for ids in seen for msg_id in ids)
    assert [msg_id for msg_id, n in counts.items() if n > 1] == []
    assert len(counts) == total
    assert sum(1 for ids in seen if ids) >= 2  # the readers really did run side by side


def test_concurrent_readers_in_rounds_share_redeliveries_without_duplicates(dsn: str, queue: Queue) -> None:
    """Each round every message is read exactly once, then all are nacked; over many rounds."""
    ids = queue.send_many(list(range(60)))
    readers = 3
    with Broker(dsn, max_connections=readers + 1) as broker:
        shared = broker.queue(Q)
        for round_no in range(1, 6):
            taken: list[list[Any]] = [[] for _ in range(readers)]
            barrier = threading.Barrier(readers)

            def consume(
                slot: int, taken: list[list[Any]] = taken, barrier: threading.Barrier = barrier
            ) -> None:
                barrier.wait()
                while got := shared.read_many(4, vt=300):
                    taken[slot].extend(got)

            threads = [threading.Thread(target=consume, args=(slot,)) for slot in range(readers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            messages = [m for part in taken for m in part]
            assert sorted(m.msg_id for m in messages) == ids
            assert {m.read_ct for m in messages} == {round_no}
            assert sorted(shared.nack_many(messages)) == ids


def test_uncommitted_send_is_invisible_and_a_rolled_back_one_leaves_nothing(dsn: str, queue: Queue) -> None:
    with psycopg.connect(dsn) as writer, psycopg.connect(dsn, autocommit=True) as reader:
        writer.execute("SELECT pgmq.send(%s, '{\"a\": 1}')", [Q])
        assert read_ids(reader, 10) == []
        assert q_ids(reader, Q) == []
        writer.rollback()
        assert read_ids(reader, 10) == []
        assert q_rows(reader, Q) == []


def test_committed_send_becomes_visible_to_other_connections(dsn: str, queue: Queue) -> None:
    with psycopg.connect(dsn) as writer, psycopg.connect(dsn, autocommit=True) as reader:
        row = writer.execute("SELECT pgmq.send(%s, '{\"a\": 1}')", [Q]).fetchone()
        assert row is not None
        assert read_ids(reader, 10) == []
        writer.commit()
        assert read_ids(reader, 10) == [(row[0], 1)]


def test_rolled_back_read_leaves_the_message_visible_with_read_ct_unchanged(dsn: str, queue: Queue) -> None:
    msg_id = queue.send("x")
    with psycopg.connect(dsn) as first, psycopg.connect(dsn, autocommit=True) as other:
        assert read_ids(first, 1) == [(msg_id, 1)]
        assert read_ids(other, 1) == []  # locked by the open read, then leased
        first.rollback()
        [(row_id, read_ct, _vt, _m, _h)] = q_rows(other, Q)
        assert (row_id, read_ct) == (msg_id, 0)
        assert visible_ids(other, Q) == [msg_id]
        assert read_ids(other, 1) == [(msg_id, 1)]


def test_transaction_send_commits_with_the_callers_own_insert(
    broker: Broker, queue: Queue, conn: Conn
) -> None:
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    with broker.transaction() as tx:
        tx.connection.execute("INSERT INTO orders VALUES (1)")
        msg_id = tx.queue(Q).send({"order": 1})
        assert visible_ids(conn, Q) == []  # not committed yet
    assert conn.execute("SELECT id FROM orders").fetchall() == [(1,)]
    assert q_ids(conn, Q) == [msg_id]


class Boom(Exception):
    pass


def test_transaction_send_rolls_back_with_the_callers_own_insert(
    broker: Broker, queue: Queue, conn: Conn
) -> None:
    conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")

    def order_then_fail() -> None:
        with broker.transaction() as tx:
            tx.connection.execute("INSERT INTO orders VALUES (1)")
            tx.queue(Q).send({"order": 1})
            raise Boom

    with pytest.raises(Boom):
        order_then_fail()
    assert conn.execute("SELECT id FROM orders").fetchall() == []
    assert q_rows(conn, Q) == []
    assert queue.read() is None


def test_transaction_ack_rolls_back_with_the_caller(broker: Broker, queue: Queue, conn: Conn) -> None:
    queue.send("x")
    msg = queue.read(vt=300)
    assert msg is not None

    def ack_then_fail() -> None:
        with broker.transaction() as tx:
            tx.queue(Q).ack(msg)
            raise Boom

    with pytest.raises(Boom):
        ack_then_fail()
    assert q_ids(conn, Q) == [msg.msg_id]
    queue.ack(msg)  # the receipt still holds
    assert q_ids(conn, Q) == []


def _race(dsn: str, names: list[str]) -> list[BaseException | None]:
    """Create the queues ``names`` at the same moment, one thread and connection each."""
    outcomes: list[BaseException | None] = [None] * len(names)
    barrier = threading.Barrier(len(names))

    def create(slot: int) -> None:
        with Broker(dsn, max_connections=1) as own:
            barrier.wait()
            try:
                own.create_queue(names[slot])
            except BaseException as exc:  # inspected by the main thread
                outcomes[slot] = exc

    threads = [threading.Thread(target=create, args=(slot,)) for slot in range(len(names))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_concurrent_creates_of_one_queue_all_succeed_and_create_it_once(dsn: str, conn: Conn) -> None:
    assert _race(dsn, ["race"] * 5) == [None] * 5
    assert [row[0] for row in meta(conn)] == ["race"]


def test_concurrent_creates_of_names_differing_in_case_create_one_queue(dsn: str, conn: Conn) -> None:
    names = ["race", "Race", "RACE", "rAcE"]
    outcomes = _race(dsn, names)
    [(winner,)] = [(row[0],) for row in meta(conn)]
    assert winner in names
    for name, outcome in zip(names, outcomes, strict=True):
        if name == winner:
            assert outcome is None
        else:
            assert isinstance(outcome, QueueNameConflict), outcome


def test_read_with_a_conditional_leases_only_matching_messages(queue: Queue) -> None:
    ids = queue.send_many([{"kind": "a"}, {"kind": "b", "n": 1}, {"kind": "b", "n": 2}])
    got = queue.read_many(5, conditional={"kind": "b"})
    assert [m.msg_id for m in got] == ids[1:]
    assert [m.msg_id for m in queue.read_many(5)] == ids[:1]
