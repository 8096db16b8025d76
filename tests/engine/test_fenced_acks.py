"""Fenced acknowledgement: a receipt acks, nacks or extends only the delivery it was issued for.

Every stale case checks that the call changed nothing: the queue row (read_ct, vt) and the
archive are exactly as before.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgbroker import Broker, InvalidArgument, Message, Queue, Receipt, StaleReceipt
from tests.support.tables import Conn, a_ids, a_rows, q_ids, q_rows, visible_ids


@pytest.fixture
def conn(module_conn: Conn) -> Conn:
    """In this module every test shares one database and works on its own queue."""
    return module_conn


@pytest.fixture
def broker(module_broker: Broker) -> Broker:
    return module_broker


@pytest.fixture
def queue(module_broker: Broker) -> Queue:
    """A freshly created queue with a name no other test uses."""
    return module_broker.create_queue(f"q{uuid.uuid4().hex[:16]}")


@pytest.fixture
def q(queue: Queue) -> str:
    """The name of ``queue``, for the tests that work through SQL."""
    return queue.name


def lease(queue: Queue) -> Message:
    msg = queue.read(vt=300)
    assert msg is not None
    assert msg.receipt is not None
    return msg


def snapshot(conn: Conn, name: str) -> tuple[Any, ...]:
    return (q_rows(conn, name), a_rows(conn, name))


def assert_stale_changes_nothing(
    conn: Conn, name: str, call: Callable[[], object], reason: str | None = None
) -> StaleReceipt:
    before = snapshot(conn, name)
    with pytest.raises(StaleReceipt, match=reason) as info:
        call()
    assert snapshot(conn, name) == before
    assert info.value.sqlstate == "PB003"
    assert info.value.hint
    return info.value


# -- acks that hold ---------------------------------------------------------------------------


def test_ack_archives_the_message_by_default(queue: Queue, conn: Conn) -> None:
    other = queue.send("other")
    msg_id = queue.send_many(["x"])[0]
    queue.read()  # leases 'other'
    msg = lease(queue)
    assert msg.msg_id == msg_id
    queue.ack(msg)
    assert q_ids(conn, queue.name) == [other]
    [(archived_id, read_ct, message, archived_at)] = a_rows(conn, queue.name)
    assert (archived_id, read_ct, message) == (msg_id, 1, "x")
    assert archived_at is not None


def test_ack_without_archive_deletes_the_message(queue: Queue, conn: Conn) -> None:
    queue.send("x")
    queue.ack(lease(queue), archive=False)
    assert q_rows(conn, queue.name) == []
    assert a_rows(conn, queue.name) == []


def test_ack_accepts_the_receipt_object_and_its_text(queue: Queue, conn: Conn) -> None:
    queue.send_many(["a", "b"])
    first, second = queue.read_many(2)
    assert first.receipt is not None
    assert second.receipt is not None
    queue.ack(first.receipt)
    queue.ack(str(second.receipt))
    assert q_rows(conn, queue.name) == []
    assert a_ids(conn, queue.name) == [first.msg_id, second.msg_id]


def test_receipt_carries_msg_id_read_ct_and_the_lease_in_microseconds(queue: Queue, conn: Conn) -> None:
    queue.send("x")
    msg = lease(queue)
    assert msg.receipt is not None
    [(msg_id, read_ct, vt, _m, _h)] = q_rows(conn, queue.name)
    stored = conn.execute("SELECT (extract(epoch FROM %s::timestamptz) * 1000000)::bigint", [vt]).fetchone()
    assert stored is not None
    assert msg.receipt == Receipt(msg_id, read_ct, stored[0])
    assert msg.vt == vt


# -- stale receipts ---------------------------------------------------------------------------


def test_stale_receipt_cannot_ack_twice(queue: Queue, conn: Conn) -> None:
    queue.send("x")
    msg = lease(queue)
    queue.ack(msg)
    error = assert_stale_changes_nothing(conn, queue.name, lambda: queue.ack(msg), "no longer in the queue")
    assert str(msg.msg_id) in error.message
    assert len(a_rows(conn, queue.name)) == 1


def test_stale_receipt_cannot_ack_after_the_lease_expired(queue: Queue, conn: Conn) -> None:
    queue.send("x")
    msg = queue.read(vt=1)
    assert msg is not None
    time.sleep(1.2)
    assert_stale_changes_nothing(conn, queue.name, lambda: queue.ack(msg), "lease expired")
    assert_stale_changes_nothing(conn, queue.name, lambda: queue.nack(msg), "lease expired")
    assert_stale_changes_nothing(conn, queue.name, lambda: queue.extend(msg, vt=60), "lease expired")
    assert [row[1] for row in q_rows(conn, queue.name)] == [1]
    assert a_rows(conn, queue.name) == []


def test_stale_receipt_cannot_ack_after_another_consumer_read_the_message(
    queue: Queue, module_dsn: str, conn: Conn
) -> None:
    queue.send("x")
    mine = queue.read(vt=1)
    assert mine is not None
    time.sleep(1.2)
    with Broker(module_dsn) as other_broker:
        theirs = other_broker.queue(queue.name).read(vt=300)
        assert theirs is not None
        assert (theirs.msg_id, theirs.read_ct) == (mine.msg_id, 2)
        assert_stale_changes_nothing(conn, queue.name, lambda: queue.ack(mine), "delivered again")
        assert_stale_changes_nothing(conn, queue.name, lambda: queue.nack(mine), "delivered again")
        assert_stale_changes_nothing(conn, queue.name, lambda: queue.extend(mine, vt=600), "delivered again")
        other_broker.queue(queue.name).ack(theirs)
    assert a_ids(conn, queue.name) == [mine.msg_id]


def test_stale_receipt_cannot_ack_after_a_nack(queue: Queue, conn: Conn) -> None:
    queue.send("x")
    msg = lease(queue)
    queue.nack(msg)
    assert visible_ids(conn, queue.name) == [msg.msg_id]
    assert_stale_changes_nothing(conn, queue.name, lambda: queue.ack(msg), "lease was changed")
    assert_stale_changes_nothing(conn, queue.name, lambda: queue.nack(msg))
    assert_stale_changes_nothing(conn, queue.name, lambda: queue.extend(msg, vt=60))
    [(_id, read_ct, _vt, _m, _h)] = q_rows(conn, queue.name)
    assert read_ct == 1


def test_nack_with_delay_hides_the_message_and_spends_the_receipt(queue: Queue, conn: Conn) -> None:
    queue.send("x")
    msg = lease(queue)
    queue.nack(msg, delay=3600)
    assert visible_ids(conn, queue.name) == []
    assert queue.read() is None
    assert_stale_changes_nothing(conn, queue.name, lambda: queue.ack(msg))


def test_extend_issues_a_new_receipt_and_spends_the_old_one(queue: Queue, conn: Conn) -> None:
    queue.send("x")
    msg = lease(queue)
    renewed = queue.extend(msg, vt=600)
    assert renewed != msg.receipt
    assert msg.receipt is not None
    assert (renewed.msg_id, renewed.read_ct) == (msg.receipt.msg_id, msg.receipt.read_ct)
    assert renewed.lease > msg.receipt.lease
    assert_stale_changes_nothing(conn, queue.name, lambda: queue.ack(msg), "lease was changed")
    assert_stale_changes_nothing(conn, queue.name, lambda: queue.extend(msg, vt=900))
    assert_stale_changes_nothing(conn, queue.name, lambda: queue.nack(msg))
    queue.ack(renewed)
    assert a_ids(conn, queue.name) == [msg.msg_id]


def test_extend_moves_the_lease_end(queue: Queue, conn: Conn) -> None:
    queue.send("x")
    msg = lease(queue)
    renewed = queue.extend(msg, vt=3600)
    [(_id, _ct, vt, _m, _h)] = q_rows(conn, queue.name)
    stored = conn.execute("SELECT (extract(epoch FROM %s::timestamptz) * 1000000)::bigint", [vt]).fetchone()
    assert stored == (renewed.lease,)
    assert msg.receipt is not None
    assert renewed.lease - msg.receipt.lease > 3000 * 1_000_000


def test_stale_receipt_after_set_vt_by_msg_id(queue: Queue, conn: Conn) -> None:
    queue.send("x")
    msg = lease(queue)
    queue.set_vt(msg.msg_id, 600)
    assert_stale_changes_nothing(conn, queue.name, lambda: queue.ack(msg), "lease was changed")


def test_receipt_from_a_pop_or_set_vt_result_is_refused(queue: Queue) -> None:
    msg_id = queue.send("x")
    changed = queue.set_vt(msg_id, 0)
    assert changed is not None
    assert changed.receipt is None
    with pytest.raises(InvalidArgument, match="carries no receipt"):
        queue.ack(changed)
    popped = queue.pop()
    assert popped is not None
    assert popped.receipt is None
    with pytest.raises(InvalidArgument, match="carries no receipt"):
        queue.nack(popped)


# -- many -------------------------------------------------------------------------------------


def test_ack_many_acks_only_the_messages_whose_receipts_hold(queue: Queue, conn: Conn) -> None:
    ids = queue.send_many(["a", "b", "c", "d"])
    msgs = queue.read_many(4, vt=300)
    queue.nack(msgs[1])
    queue.ack(msgs[3], archive=False)
    acked = queue.ack_many(msgs)
    assert acked == [ids[0], ids[2]]
    assert q_ids(conn, queue.name) == [ids[1]]
    assert a_ids(conn, queue.name) == [ids[0], ids[2]]
    assert queue.ack_many(msgs) == []
    assert queue.ack_many([]) == []


def test_ack_many_without_archive_deletes(queue: Queue, conn: Conn) -> None:
    ids = queue.send_many(["a", "b"])
    assert queue.ack_many(queue.read_many(2), archive=False) == ids
    assert q_rows(conn, queue.name) == []
    assert a_rows(conn, queue.name) == []


def test_nack_many_releases_only_the_messages_whose_receipts_hold(queue: Queue, conn: Conn) -> None:
    ids = queue.send_many(["a", "b", "c"])
    msgs = queue.read_many(3, vt=300)
    renewed = queue.extend(msgs[0], vt=300)
    released = queue.nack_many(msgs)
    assert released == ids[1:]
    assert visible_ids(conn, queue.name) == ids[1:]
    queue.ack(renewed)
    assert a_ids(conn, queue.name) == [ids[0]]


def test_extend_many_renews_only_the_receipts_that_hold(queue: Queue, conn: Conn) -> None:
    ids = queue.send_many(["a", "b", "c"])
    msgs = queue.read_many(3, vt=300)
    queue.nack(msgs[2])
    renewed = queue.extend_many(msgs, vt=900)
    assert sorted(renewed) == ids[:2]
    assert all(renewed[i].msg_id == i for i in renewed)
    assert queue.ack_many(msgs) == []
    assert queue.ack_many(list(renewed.values())) == ids[:2]


def test_duplicate_receipts_in_one_ack_many_ack_once(queue: Queue, conn: Conn) -> None:
    queue.send("x")
    msg = lease(queue)
    assert queue.ack_many([msg, msg, msg]) == [msg.msg_id]
    assert a_ids(conn, queue.name) == [msg.msg_id]


# -- malformed and foreign receipts -----------------------------------------------------------


@pytest.mark.parametrize("token", ["", "x", "1:2", "1:2:3:4", "a:b:c", "-1:1:1", "1:1:1.5", "1 :1:1"])
def test_malformed_receipt_is_an_invalid_argument(queue: Queue, conn: Conn, token: str) -> None:
    queue.send("x")
    lease(queue)
    before = snapshot(conn, queue.name)
    for call in (
        lambda: queue.ack(token),
        lambda: queue.nack(token),
        lambda: queue.extend(token, vt=10),
        lambda: queue.ack_many([token]),
    ):
        with pytest.raises(InvalidArgument, match="malformed receipt"):
            call()
    assert snapshot(conn, queue.name) == before


@pytest.mark.parametrize(
    "token",
    [
        "9999999999999999999:1:1",  # msg_id beyond bigint
        "1:9999999999:1",  # read_ct beyond integer
        "1:1:9999999999999999999",  # lease beyond bigint
    ],
)
def test_receipt_with_out_of_range_numbers_is_an_invalid_argument(
    queue: Queue, conn: Conn, token: str
) -> None:
    queue.send("x")
    lease(queue)
    before = snapshot(conn, queue.name)
    with pytest.raises(InvalidArgument, match="receipt"):
        queue.ack(token)
    with pytest.raises(InvalidArgument, match="receipt"):
        queue.ack_many([token])
    assert snapshot(conn, queue.name) == before


def test_well_formed_receipt_with_a_far_future_lease_is_refused_with_a_typed_error(
    queue: Queue, conn: Conn
) -> None:
    """The largest bigint lease is a valid timestamptz (year 294247): stale, or refused as invalid."""
    queue.send("x")
    msg = lease(queue)
    token = f"{msg.msg_id}:1:{2**63 - 1}"
    before = snapshot(conn, queue.name)
    with pytest.raises((StaleReceipt, InvalidArgument)):
        queue.ack(token)
    try:
        acked = queue.ack_many([token])
    except InvalidArgument:
        acked = []
    assert acked == []
    assert snapshot(conn, queue.name) == before


def test_receipt_from_another_queue_never_acks_a_message_there(
    broker: Broker, queue: Queue, conn: Conn
) -> None:
    first = broker.create_queue(f"{queue.name}_1")
    second = broker.create_queue(f"{queue.name}_2")
    first.send("in first")
    second.send("in second")
    mine = first.read(vt=300)
    theirs = second.read(vt=300)
    assert mine is not None
    assert theirs is not None
    assert mine.msg_id == theirs.msg_id  # same msg_id, so only the lease tells them apart
    before = (snapshot(conn, first.name), snapshot(conn, second.name))
    with pytest.raises(StaleReceipt):
        second.ack(mine)
    with pytest.raises(StaleReceipt):
        second.nack(mine)
    with pytest.raises(StaleReceipt):
        second.extend(mine, vt=10)
    assert second.ack_many([mine]) == []
    assert (snapshot(conn, first.name), snapshot(conn, second.name)) == before
    first.ack(mine)
    second.ack(theirs)


# -- the same through SQL ---------------------------------------------------------------------


def sql_read(conn: Conn, q: str, vt: int = 300, qty: int = 1) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT msg_id, read_ct, receipt FROM pgbroker.read(queue_name => %s, vt => %s, qty => %s)",
        [q, vt, qty],
    ).fetchall()


def test_sql_read_returns_message_records_with_a_receipt(conn: Conn, q: str) -> None:
    conn.execute("SELECT pgmq.send(%s, '1')", [q])
    cur = conn.execute("SELECT * FROM pgbroker.read(queue_name => %s, vt => 300, qty => 5)", [q])
    assert cur.description is not None
    assert [c.name for c in cur.description] == [
        "msg_id",
        "read_ct",
        "enqueued_at",
        "last_read_at",
        "vt",
        "message",
        "headers",
        "receipt",
    ]
    [row] = cur.fetchall()
    assert Receipt.parse(row[7]) == Receipt(row[0], row[1], Receipt.parse(row[7]).lease)


def test_sql_ack_archives_by_default_and_refuses_a_second_ack(conn: Conn, q: str) -> None:
    conn.execute("SELECT pgmq.send(%s, '1')", [q])
    [(msg_id, _ct, receipt)] = sql_read(conn, q)
    row = conn.execute("SELECT pgbroker.ack(queue_name => %s, receipt => %s)", [q, receipt]).fetchone()
    assert row == (msg_id,)
    assert a_ids(conn, q) == [msg_id]
    with pytest.raises(psycopg.Error, match="stale receipt") as info:
        conn.execute("SELECT pgbroker.ack(queue_name => %s, receipt => %s)", [q, receipt])
    assert info.value.sqlstate == "PB003"
    assert a_ids(conn, q) == [msg_id]


def test_sql_ack_with_archive_false_deletes(conn: Conn, q: str) -> None:
    conn.execute("SELECT pgmq.send(%s, '1')", [q])
    [(_id, _ct, receipt)] = sql_read(conn, q)
    conn.execute("SELECT pgbroker.ack(queue_name => %s, receipt => %s, archive => false)", [q, receipt])
    assert q_rows(conn, q) == []
    assert a_rows(conn, q) == []


def test_sql_many_forms_return_only_the_ids_whose_receipts_hold(conn: Conn, q: str) -> None:
    ids = [
        r[0] for r in conn.execute("SELECT * FROM pgmq.send_batch(%s, '{1,2,3,4}'::jsonb[])", [q]).fetchall()
    ]
    rows = sql_read(conn, q, qty=4)
    receipts = [r[2] for r in rows]
    conn.execute("SELECT pgbroker.nack(queue_name => %s, receipt => %s, delay => 0)", [q, receipts[0]])

    extended = conn.execute(
        "SELECT msg_id, receipt FROM pgbroker.extend(queue_name => %s, receipts => %s::text[], vt => 600)",
        [q, receipts[:2]],
    ).fetchall()
    assert [r[0] for r in extended] == [ids[1]]
    nacked = conn.execute(
        "SELECT * FROM pgbroker.nack(queue_name => %s, receipts => %s::text[], delay => 0)", [q, receipts[:3]]
    ).fetchall()
    assert [r[0] for r in nacked] == [ids[2]]
    acked = conn.execute(
        "SELECT * FROM pgbroker.ack(queue_name => %s, receipts => %s::text[], archive => true)",
        [q, [*receipts, extended[0][1]]],
    ).fetchall()
    assert [r[0] for r in acked] == [ids[1], ids[3]]
    assert a_ids(conn, q) == [ids[1], ids[3]]
    assert q_ids(conn, q) == [ids[0], ids[2]]


def test_sql_extend_single_returns_a_new_receipt_and_nack_single_returns_the_id(conn: Conn, q: str) -> None:
    conn.execute("SELECT pgmq.send(%s, '1')", [q])
    [(msg_id, _ct, receipt)] = sql_read(conn, q)
    row = conn.execute(
        "SELECT pgbroker.extend(queue_name => %s, receipt => %s, vt => 60)", [q, receipt]
    ).fetchone()
    assert row is not None
    renewed = row[0]
    assert renewed != receipt
    assert Receipt.parse(renewed).msg_id == msg_id
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT pgbroker.nack(queue_name => %s, receipt => %s)", [q, receipt])
    assert info.value.sqlstate == "PB003"
    assert conn.execute("SELECT pgbroker.nack(%s, %s)", [q, renewed]).fetchone() == (msg_id,)


@pytest.mark.parametrize("token", [None, "", "1:2", "x:1:1", "1:1:1 ", "9999999999999999999:1:1"])
def test_sql_malformed_receipt_raises_invalid_argument(conn: Conn, q: str, token: str | None) -> None:
    for query in (
        "SELECT pgbroker.ack(%s, %s::text)",
        "SELECT * FROM pgbroker.ack(%s, ARRAY[%s::text])",
        "SELECT pgbroker.nack(%s, %s::text)",
        "SELECT pgbroker.extend(%s, %s::text, 10)",
    ):
        with pytest.raises(psycopg.Error) as info:
            conn.execute(query, [q, token])
        assert info.value.sqlstate == "PB007", query
