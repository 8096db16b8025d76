"""The official pgmq Python clients against a pgbroker database: ``pgmq.PGMQueue`` (psycopg)
and ``pgmq.AsyncPGMQueue`` (asyncpg: another driver, another wire protocol path, since asyncpg
prepares every statement and binds JSON as text).

Every public method of each client is called here and its results checked; the clients are used
as shipped, with only their ``CREATE EXTENSION pgmq`` step switched off (``init_extension=False``).
Each test is written once and runs with both clients (the ``client`` fixture; the async one is
driven from this sync code, see ``tests/compat/conftest.py``); what only one client has is tested
for that one. ``test_every_public_client_method_is_exercised`` enumerates the clients' methods, so
a method added by a new client release fails that test until it is exercised here.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from pgmq import AsyncPGMQueue, Message, PGMQueue, QueueMetrics, QueueRecord, async_transaction, transaction
from pgmq.notify_listener import AsyncNotificationListener, SyncNotificationListener
from psycopg import sql

from tests.compat.clients import AsyncFlavour, Flavour, make_async_client, public_methods

Q = "jobs"


def sql_one(dsn: str, query: str, params: Any = None) -> Any:
    """One value, read straight from the database (not through the client)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def queue_ids(dsn: str, table: str = f"q_{Q}") -> list[int]:
    """msg_ids of a queue or archive table, read straight from the database."""
    query = sql.SQL("SELECT msg_id FROM pgmq.{} ORDER BY msg_id").format(sql.Identifier(table))
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(query).fetchall()
    return [int(r[0]) for r in rows]


def as_messages(value: Any) -> list[Message]:
    assert isinstance(value, list)
    assert all(isinstance(m, Message) for m in value)
    return value


def one_message(value: Any) -> Message:
    assert isinstance(value, Message), value
    return value


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a server error, from either driver (both name it ``sqlstate``)."""
    code = getattr(exc, "sqlstate", None)
    return str(code) if code is not None else None


class _Abort(Exception):
    pass


# -- queue management -------------------------------------------------------------------------


def test_create_list_validate_and_drop_queues(client: PGMQueue, flavour: Flavour, dsn: str) -> None:
    client.create_queue(Q)
    client.create_queue(Q)  # idempotent
    client.create_queue("fast", unlogged=True)
    with pytest.warns(UserWarning, match="QueueRecord"):
        queues = client.list_queues()
    assert all(isinstance(q, QueueRecord) for q in queues)
    assert [(q.queue_name, q.is_partitioned, q.is_unlogged) for q in queues] == [
        ("fast", False, True),
        (Q, False, False),
    ]
    assert all(isinstance(q.created_at, datetime) for q in queues)
    assert sql_one(dsn, "SELECT relpersistence FROM pg_class WHERE oid = 'pgmq.q_fast'::regclass") == "u"

    assert client.validate_queue_name("a" * 47) is True
    with pytest.raises(flavour.raise_exception) as too_long:
        client.validate_queue_name("a" * 48)
    assert sqlstate(too_long.value) == "P0001"

    assert client.drop_queue("fast") is True
    assert client.drop_queue("fast") is False  # not an error
    with pytest.warns(UserWarning, match="QueueRecord"):
        assert [q.queue_name for q in client.list_queues()] == [Q]


def test_create_partitioned_queue(client: PGMQueue, dsn: str, require_pg_partman: None) -> None:
    client.create_partitioned_queue("parts")  # by msg_id, 10000 a partition
    client.create_partitioned_queue("daily", partition_interval="1 day", retention_interval="7 days")
    with pytest.warns(UserWarning, match="QueueRecord"):
        flags = {q.queue_name: q.is_partitioned for q in client.list_queues()}
    assert flags == {"parts": True, "daily": True}
    assert sql_one(dsn, "SELECT relkind FROM pg_class WHERE oid = 'pgmq.q_parts'::regclass") == "p"
    ids = client.send_batch("parts", [{"n": 1}, {"n": 2}])
    assert ids == [1, 2]
    assert client.send("daily", {"n": 1}) == 1
    assert [m.msg_id for m in client.read_batch("parts", vt=30, batch_size=5)] == [1, 2]
    assert client.archive("parts", 1) is True
    assert client.metrics("parts").queue_length == 1
    assert client.drop_queue("parts") is True


def test_convert_archive_partitioned(client: PGMQueue, dsn: str, require_pg_partman: None) -> None:
    client.create_queue(Q)
    ids = client.send_batch(Q, [{"n": n} for n in range(3)])
    assert client.archive_batch(Q, ids[:2]) == ids[:2]
    client.convert_archive_partitioned(Q, partition_interval=1000, retention_interval=100000)
    assert sql_one(dsn, "SELECT relkind FROM pg_class WHERE oid = 'pgmq.a_jobs'::regclass") == "p"
    assert client.archive(Q, ids[2]) is True
    assert queue_ids(dsn, "a_jobs") == ids


def test_detach_archive_is_a_deprecated_no_op(client: PGMQueue, dsn: str) -> None:
    client.create_queue(Q)
    msg_id = client.send(Q, {"n": 1})
    client.archive(Q, msg_id)
    client.detach_archive(Q)
    assert queue_ids(dsn, "a_jobs") == [msg_id]


# -- sending ----------------------------------------------------------------------------------


def test_send_plain_with_headers_and_with_delays(client: PGMQueue, dsn: str) -> None:
    client.create_queue(Q)
    plain = client.send(Q, {"kind": "plain"})
    headed = client.send(Q, {"kind": "headers"}, headers={"trace": "abc"})
    delayed = client.send(Q, {"kind": "delay int"}, delay=3600)
    ready = client.send(Q, {"kind": "delay 0"}, delay=0)
    past = client.send(Q, {"kind": "delay past"}, delay=datetime.now(UTC) - timedelta(hours=1))
    future = client.send(Q, {"kind": "delay future"}, delay=datetime.now(UTC) + timedelta(hours=1))
    both = client.send(Q, {"kind": "headers+delay"}, headers={"h": 1}, delay=3600)
    both_ts = client.send(Q, {"kind": "headers+ts"}, headers={"h": 2}, delay=datetime.now(UTC) - timedelta(1))
    alias = client.send(Q, {"kind": "tz alias"}, tz=3600)  # the client's old name for delay
    assert [plain, headed, delayed, ready, past, future, both, both_ts, alias] == list(range(1, 10))

    visible = client.read_batch(Q, vt=30, batch_size=20)
    assert [m.msg_id for m in visible] == [plain, headed, ready, past, both_ts]
    assert [(m.message, m.headers) for m in visible] == [
        ({"kind": "plain"}, None),
        ({"kind": "headers"}, {"trace": "abc"}),
        ({"kind": "delay 0"}, None),
        ({"kind": "delay past"}, None),
        ({"kind": "headers+ts"}, {"h": 2}),
    ]
    hidden = {delayed: 3600, future: 3600, both: 3600, alias: 3600}
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT msg_id, headers FROM pgmq.q_jobs WHERE read_ct = 0 AND vt > clock_timestamp()"
        ).fetchall()
    assert sorted(r[0] for r in rows) == sorted(hidden)
    assert {r[0]: r[1] for r in rows}[both] == {"h": 1}


def test_send_batch_forms(client: PGMQueue, dsn: str) -> None:
    client.create_queue(Q)
    msgs = [{"n": 1}, {"n": 2}, {"n": 3}]
    assert client.send_batch(Q, msgs) == [1, 2, 3]
    assert client.send_batch(Q, msgs, headers=[{"h": 1}, {"h": 2}, {"h": 3}]) == [4, 5, 6]
    assert client.send_batch(Q, msgs, delay=3600) == [7, 8, 9]
    assert client.send_batch(Q, msgs, delay=datetime.now(UTC) + timedelta(hours=1)) == [10, 11, 12]
    assert client.send_batch(Q, msgs, headers=[{}, {}, {}], delay=0) == [13, 14, 15]
    assert client.send_batch(Q, msgs, headers=[{}, {}, {}], delay=datetime.now(UTC) - timedelta(1)) == [
        16,
        17,
        18,
    ]
    assert client.send_batch(Q, []) == []  # the client does not call the server
    with pytest.raises(ValueError, match="headers"):
        client.send_batch(Q, msgs, headers=[{}])
    got = client.read_batch(Q, vt=30, batch_size=100)
    assert [m.msg_id for m in got] == [1, 2, 3, 4, 5, 6, 13, 14, 15, 16, 17, 18]
    assert [m.message for m in got[:3]] == msgs
    assert [m.headers for m in got[3:6]] == [{"h": 1}, {"h": 2}, {"h": 3}]
    assert len(queue_ids(dsn)) == 18


# -- reading ----------------------------------------------------------------------------------


def test_read_single_batch_and_conditional(client: PGMQueue) -> None:
    client.create_queue(Q)
    assert client.read(Q) is None
    assert client.read(Q, qty=3) == []
    client.send_batch(Q, [{"kind": "a", "n": 1}, {"kind": "b", "n": 2}, {"kind": "a", "n": 3}, {"kind": "b"}])

    first = one_message(client.read(Q, vt=30))  # qty 1: one Message, not a list
    assert (first.msg_id, first.read_ct, first.message) == (1, 1, {"kind": "a", "n": 1})
    assert isinstance(first.enqueued_at, datetime)
    assert isinstance(first.vt, datetime)
    assert first.last_read_at is not None
    assert first.vt > first.enqueued_at

    only_b = as_messages(client.read(Q, vt=30, qty=5, conditional={"kind": "b"}))
    assert [m.msg_id for m in only_b] == [2, 4]
    rest = client.read_batch(Q, vt=30, batch_size=5)
    assert [m.msg_id for m in rest] == [3]
    assert client.read_batch(Q, vt=30, batch_size=5) == []


def test_read_uses_the_client_default_vt(flavour: Flavour, dsn: str) -> None:
    queue = flavour.connect(dsn, vt=1)
    try:
        queue.create_queue(Q)
        queue.send(Q, {"n": 1})
        assert one_message(queue.read(Q)).read_ct == 1  # vt=None: the client's vt, 1 s
        assert queue.read(Q) is None
        time.sleep(1.2)
        assert one_message(queue.read(Q)).read_ct == 2
    finally:
        queue.close()


def test_read_with_poll(client: PGMQueue, dsn: str) -> None:
    client.create_queue(Q)
    started = time.monotonic()
    assert client.read_with_poll(Q, vt=30, qty=5, max_poll_seconds=1, poll_interval_ms=50) == []
    assert time.monotonic() - started >= 0.9

    def send_later() -> None:
        time.sleep(0.3)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pgmq.send('jobs', '{\"late\": true}')")

    sender = threading.Thread(target=send_later)
    sender.start()
    got = client.read_with_poll(Q, vt=30, qty=5, max_poll_seconds=10, poll_interval_ms=20)
    sender.join()
    assert [(m.msg_id, m.message) for m in got] == [(1, {"late": True})]

    client.send_batch(Q, [{"k": "x"}, {"k": "y"}, {"k": "x"}])
    got = client.read_with_poll(Q, vt=30, qty=5, max_poll_seconds=1, conditional={"k": "x"})
    assert [m.msg_id for m in got] == [2, 4]


def test_pop(client: PGMQueue, dsn: str) -> None:
    client.create_queue(Q)
    assert client.pop(Q) is None
    client.send_batch(Q, [{"n": n} for n in range(5)])
    popped = one_message(client.pop(Q))
    assert (popped.msg_id, popped.read_ct, popped.message) == (1, 0, {"n": 0})
    assert [m.msg_id for m in as_messages(client.pop(Q, qty=3))] == [2, 3, 4]
    assert queue_ids(dsn) == [5]


# -- FIFO groups ------------------------------------------------------------------------------


def _send_groups(client: PGMQueue) -> None:
    groups = ["A", "A", "B", "A", "B", "C"]
    client.send_batch(
        Q, [{"i": i} for i in range(len(groups))], headers=[{"x-pgmq-group": g} for g in groups]
    )


def test_read_grouped(client: PGMQueue) -> None:
    client.create_queue(Q)
    client.create_fifo_index(Q)
    _send_groups(client)
    # Fills the batch from the oldest group first, then the next.
    assert [m.msg_id for m in client.read_grouped(Q, vt=30, qty=2)] == [1, 2]
    # Group A is in flight: its later messages wait; B and C are served.
    assert [m.msg_id for m in client.read_grouped(Q, vt=30, qty=10)] == [3, 5, 6]
    assert client.read_grouped(Q, vt=30, qty=10) == []
    assert client.delete_batch(Q, [1, 2]) == [1, 2]
    assert [m.msg_id for m in client.read_grouped_with_poll(Q, vt=30, qty=10, max_poll_seconds=1)] == [4]
    assert client.read_grouped_with_poll(Q, vt=30, qty=10, max_poll_seconds=1, poll_interval_ms=50) == []


def test_read_grouped_rr(client: PGMQueue) -> None:
    client.create_queue(Q)
    client.create_fifo_indexes_all()
    _send_groups(client)
    # Round robin: the head of every group, oldest group first, then the second of each.
    assert [m.msg_id for m in client.read_grouped_rr(Q, vt=30, qty=4)] == [1, 3, 6, 2]
    assert client.read_grouped_rr(Q, vt=30, qty=4) == []
    client.delete_batch(Q, [1, 2, 3, 6])
    assert [m.msg_id for m in client.read_grouped_rr_with_poll(Q, vt=30, qty=4, max_poll_seconds=1)] == [4, 5]
    assert client.read_grouped_rr_with_poll(Q, vt=30, qty=4, max_poll_seconds=1, poll_interval_ms=50) == []


# -- acknowledging and visibility -------------------------------------------------------------


def test_delete_and_delete_batch(client: PGMQueue, dsn: str) -> None:
    client.create_queue(Q)
    client.send_batch(Q, [{"n": n} for n in range(5)])
    assert client.delete(Q, 1) is True
    assert client.delete(Q, 1) is False
    assert sorted(client.delete_batch(Q, [2, 3, 99])) == [2, 3]
    assert client.delete_batch(Q, []) == []
    assert queue_ids(dsn) == [4, 5]


def test_archive_and_archive_batch(client: PGMQueue, dsn: str) -> None:
    client.create_queue(Q)
    client.send_batch(Q, [{"n": n} for n in range(5)], headers=[{"h": n} for n in range(5)])
    client.read(Q, vt=30, qty=2)
    assert client.archive(Q, 1) is True
    assert client.archive(Q, 1) is False
    assert sorted(client.archive_batch(Q, [2, 3, 99])) == [2, 3]
    assert queue_ids(dsn) == [4, 5]
    with psycopg.connect(dsn, autocommit=True) as conn:
        archived = conn.execute(
            "SELECT msg_id, read_ct, message, headers FROM pgmq.a_jobs ORDER BY 1"
        ).fetchall()
    assert archived == [(1, 1, {"n": 0}, {"h": 0}), (2, 1, {"n": 1}, {"h": 1}), (3, 0, {"n": 2}, {"h": 2})]


def test_set_vt_single_batch_seconds_and_timestamp(client: PGMQueue) -> None:
    client.create_queue(Q)
    client.send_batch(Q, [{"n": n} for n in range(4)])
    assert len(as_messages(client.read(Q, vt=3600, qty=4))) == 4

    one = one_message(client.set_vt(Q, 1, 0))  # visible again now
    assert (one.msg_id, one.read_ct) == (1, 1)
    at = datetime.now(UTC) - timedelta(seconds=5)
    two = one_message(client.set_vt(Q, 2, at))
    assert abs((two.vt - at).total_seconds()) < 0.001
    assert client.set_vt(Q, 99, 10) is None
    many = as_messages(client.set_vt(Q, [3, 4, 99], 0))
    assert sorted(m.msg_id for m in many) == [3, 4]
    # A list: the client's type hint allows a tuple, but psycopg sends a tuple as a record, not an
    # array, so a tuple fails against any server (a client bug, not a contract question).
    again = as_messages(client.set_vt(Q, [1, 2], datetime.now(UTC) + timedelta(hours=1)))
    assert sorted(m.msg_id for m in again) == [1, 2]
    assert [m.msg_id for m in client.read_batch(Q, vt=30, batch_size=10)] == [3, 4]


def test_purge(client: PGMQueue, dsn: str) -> None:
    client.create_queue(Q)
    assert client.purge(Q) == 0
    client.send_batch(Q, [{"n": n} for n in range(4)])
    client.archive(Q, 4)
    assert client.purge(Q) == 3
    assert queue_ids(dsn) == []
    assert queue_ids(dsn, "a_jobs") == [4]


# -- metrics ----------------------------------------------------------------------------------


def test_metrics_and_metrics_all(client: PGMQueue, flavour: Flavour) -> None:
    client.create_queue(Q)
    client.create_queue("other")
    empty = client.metrics(Q)
    assert isinstance(empty, QueueMetrics)
    assert (empty.queue_name, empty.queue_length, empty.total_messages, empty.queue_visible_length) == (
        Q,
        0,
        0,
        0,
    )
    assert empty.newest_msg_age_sec is None
    assert empty.oldest_msg_age_sec is None
    client.send_batch(Q, [{"n": n} for n in range(3)])
    client.send(Q, {"n": 3}, delay=3600)
    client.read(Q, vt=3600, qty=1)
    client.delete(Q, 2)
    m = client.metrics(Q)
    assert (m.queue_length, m.total_messages, m.queue_visible_length) == (3, 4, 1)
    assert m.newest_msg_age_sec == 0
    assert m.oldest_msg_age_sec == 0
    assert isinstance(m.scrape_time, datetime)
    every = client.metrics_all()
    assert [(x.queue_name, x.queue_length) for x in every] == [(Q, 3), ("other", 0)]
    with pytest.raises(flavour.undefined_table) as missing:
        client.metrics("nope")
    assert sqlstate(missing.value) == "42P01"


# -- transactions -----------------------------------------------------------------------------


def test_calls_share_a_caller_transaction(client: PGMQueue, flavour: Flavour, dsn: str) -> None:
    """Every method takes ``conn=``: the caller's transaction, committed or rolled back as one."""
    client.create_queue(Q)
    with flavour.caller_transaction(client) as conn:
        client.send(Q, {"n": 1}, conn=conn)
        client.send_batch(Q, [{"n": 2}, {"n": 3}], conn=conn)
        assert queue_ids(dsn) == []  # not committed yet: invisible to others

    def read_delete_and_send_then_fail() -> None:
        with flavour.caller_transaction(client) as conn:
            got = one_message(client.read(Q, vt=30, conn=conn))
            assert client.delete(Q, got.msg_id, conn=conn) is True
            client.send(Q, {"n": 4}, conn=conn)
            raise _Abort

    with pytest.raises(_Abort):
        read_delete_and_send_then_fail()
    assert queue_ids(dsn) == [1, 2, 3]  # the read, delete and send were rolled back
    assert one_message(client.read(Q, vt=30)).read_ct == 1


def test_transaction_decorator(sync_client: PGMQueue, dsn: str) -> None:
    client = sync_client
    client.create_queue(Q)

    @transaction
    def send_pair(queue: PGMQueue, fail: bool, conn: Any = None) -> None:
        queue.send(Q, {"first": True}, conn=conn)
        queue.send(Q, {"second": True}, conn=conn)
        if fail:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        send_pair(client, True)
    assert queue_ids(dsn) == []
    send_pair(client, False)
    assert len(queue_ids(dsn)) == 2


def test_async_transaction_decorator(async_flavour: AsyncFlavour, dsn: str) -> None:
    @async_transaction
    async def send_pair(queue: AsyncPGMQueue, fail: bool, conn: Any = None) -> None:
        await queue.send(Q, {"first": True}, conn=conn)
        await queue.send(Q, {"second": True}, conn=conn)
        if fail:
            raise RuntimeError("boom")

    async def scenario() -> None:
        client = await make_async_client(dsn)
        try:
            await client.create_queue(Q)
            with pytest.raises(RuntimeError):
                await send_pair(client, True)
            assert queue_ids(dsn) == []
            await send_pair(client, False)
            assert len(queue_ids(dsn)) == 2
        finally:
            await client.close()

    async_flavour.run(scenario())


# -- notifications ----------------------------------------------------------------------------


def test_notify_enable_update_list_disable(client: PGMQueue) -> None:
    client.create_queue(Q)
    client.create_queue("other")
    assert client.list_notify_throttles() == []
    client.enable_notify(Q)  # 250 ms by default
    client.enable_notify("other", throttle_interval_ms=0)
    assert [(t.queue_name, t.throttle_interval_ms) for t in client.list_notify_throttles()] == [
        (Q, 250),
        ("other", 0),
    ]
    client.update_notify(Q, 1000)
    assert {t.queue_name: t.throttle_interval_ms for t in client.list_notify_throttles()}[Q] == 1000
    assert all(isinstance(t.last_notified_at, datetime) for t in client.list_notify_throttles())
    client.disable_notify("other")
    assert [t.queue_name for t in client.list_notify_throttles()] == [Q]


def test_notification_listener_hears_a_send(sync_client: PGMQueue) -> None:
    client = sync_client
    client.create_queue(Q)
    client.enable_notify(Q, throttle_interval_ms=0)
    heard: list[dict[str, Any]] = []
    listener = SyncNotificationListener(client)
    thread = threading.Thread(target=listener.listen, args=(Q, heard.append), kwargs={"timeout": 2.0})
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while not heard and time.monotonic() < deadline:
            time.sleep(0.2)  # LISTEN may not be up yet: send until heard
            client.send(Q, {"n": 1})
    finally:
        thread.join(timeout=10)
        listener.stop()
    assert heard
    assert heard[0] == {"event": "insert", "payload_empty": True}


def test_notification_listener_hears_a_mixed_case_queue_by_its_name_as_given(sync_client: PGMQueue) -> None:
    """pgmq 1.13.1 (its PR #593) announces a queue's inserts on "pgmq.q_<name as given>.INSERT", and
    the client listens there: for MyQueue, on "pgmq.q_MyQueue.INSERT", not the lower-cased table's."""
    client = sync_client
    client.create_queue("MyQueue")
    client.enable_notify("MyQueue", throttle_interval_ms=0)
    heard: list[dict[str, Any]] = []
    listener = SyncNotificationListener(client)
    thread = threading.Thread(target=listener.listen, args=("MyQueue", heard.append), kwargs={"timeout": 2.0})
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while not heard and time.monotonic() < deadline:
            time.sleep(0.2)  # LISTEN may not be up yet: send until heard
            client.send("MyQueue", {"n": 1})
    finally:
        thread.join(timeout=10)
        listener.stop()
    assert heard
    assert heard[0] == {"event": "insert", "payload_empty": True}


def test_async_notification_listener_hears_a_send(async_flavour: AsyncFlavour, dsn: str) -> None:
    async def scenario() -> None:
        client = await make_async_client(dsn)
        try:
            await client.create_queue(Q)
            await client.enable_notify(Q, throttle_interval_ms=0)
            heard: list[dict[str, Any]] = []

            async def on_notify(payload: dict[str, Any]) -> None:
                heard.append(payload)

            listener = AsyncNotificationListener(client)
            task = asyncio.create_task(listener.listen(Q, on_notify))  # type: ignore[arg-type]
            try:
                deadline = time.monotonic() + 5
                while not heard and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)  # LISTEN may not be up yet: send until heard
                    await client.send(Q, {"n": 1})
            finally:
                listener.stop()
                await asyncio.wait_for(task, timeout=5)
            assert heard
            assert heard[0] == {"event": "insert", "payload_empty": True}
        finally:
            await client.close()

    async_flavour.run(scenario())


# -- topics -----------------------------------------------------------------------------------


def test_topic_bind_route_send_and_unbind(client: PGMQueue, dsn: str) -> None:
    for name in ("orders_all", "orders_eu", "audit"):
        client.create_queue(name)
    assert client.validate_topic_pattern("orders.#") is True
    assert client.validate_topic_pattern("orders..x") is False
    assert client.validate_routing_key("orders.eu.created") is True
    assert client.validate_routing_key("orders.*") is False
    client.bind_topic("orders.#", "orders_all")
    client.bind_topic("orders.eu.*", "orders_eu")
    client.bind_topic("#.audit", "audit")

    bindings = client.list_topic_bindings()
    assert sorted((b.pattern, b.queue_name) for b in bindings) == [
        ("#.audit", "audit"),
        ("orders.#", "orders_all"),
        ("orders.eu.*", "orders_eu"),
    ]
    assert all(b.compiled_regex and isinstance(b.bound_at, datetime) for b in bindings)
    assert [b.pattern for b in client.list_topic_bindings("orders_eu")] == ["orders.eu.*"]
    routes = client.test_routing("orders.eu.created")
    assert sorted(r.queue_name for r in routes) == ["orders_all", "orders_eu"]

    assert client.send_topic("orders.eu.created", {"n": 1}) == 2
    assert client.send_topic("orders.us.created", {"n": 2}, delay=3600) == 1
    assert client.send_topic("orders.eu.x", {"n": 3}, headers={"h": 1}, delay=0) == 2
    assert client.send_topic("nobody.listens", {"n": 4}) == 0

    sent = client.send_batch_topic("orders.eu.audit", [{"b": 1}, {"b": 2}])
    assert sorted((r.queue_name, r.msg_id) for r in sent) == [
        ("audit", 1),
        ("audit", 2),
        ("orders_all", 4),
        ("orders_all", 5),
        ("orders_eu", 3),
        ("orders_eu", 4),
    ]
    sent = client.send_batch_topic("x.audit", [{"b": 3}], headers=[{"h": 2}], delay=datetime.now(UTC))
    assert [(r.queue_name, r.msg_id) for r in sent] == [("audit", 3)]
    assert client.send_batch_topic("x.audit", [{"b": 4}], delay=3600)[0].msg_id == 4
    assert client.send_batch_topic("x.audit", []) == []

    eu = client.read_batch("orders_eu", vt=30, batch_size=10)
    assert [(m.message, m.headers) for m in eu] == [
        ({"n": 1}, None),
        ({"n": 3}, {"h": 1}),
        ({"b": 1}, None),
        ({"b": 2}, None),
    ]
    assert queue_ids(dsn, "q_orders_all") == [1, 2, 3, 4, 5]

    assert client.unbind_topic("orders.#", "orders_all") is True
    assert client.unbind_topic("orders.#", "orders_all") is False
    assert client.send_topic("orders.us.created", {"n": 5}) == 0


def test_send_topic_with_headers_but_no_delay_is_outside_the_contract(
    client: PGMQueue, flavour: Flavour
) -> None:
    """The client calls send_topic(routing_key, msg, headers), a form pgmq 1.13 does not define
    (its SQL has (key, msg), (key, msg, delay) and (key, msg, headers, delay)); pgbroker has
    exactly the contract's forms, so the call fails as it does against pgmq. Pass delay=0."""
    client.create_queue(Q)
    client.bind_topic("a.*", Q)
    with pytest.raises(flavour.error) as undefined:
        client.send_topic("a.b", {"n": 1}, headers={"h": 1})
    assert sqlstate(undefined.value) == "42883"  # undefined_function


# -- errors and the client's own lifecycle ----------------------------------------------------


def test_errors_are_the_drivers_exceptions_for_pgmqs_errors(client: PGMQueue, flavour: Flavour) -> None:
    """pgmq's failures reach the drivers as pgmq's do: a missing queue is an undefined table
    (psycopg UndefinedTable, asyncpg UndefinedTableError), pgmq's RAISEs are P0001 (RaiseException,
    RaiseError). A case conflict, which pgmq does not refuse, is pgbroker's PB004."""
    with pytest.raises(flavour.undefined_table) as missing:
        client.send("nope", {"n": 1})
    assert sqlstate(missing.value) == "42P01"
    assert 'relation "pgmq.q_nope" does not exist' in str(missing.value)
    with pytest.raises(flavour.raise_exception) as bad_name:
        client.create_queue("a;b")
    assert sqlstate(bad_name.value) == "P0001"
    with pytest.raises(flavour.raise_exception) as too_long:
        client.create_queue("x" * 48)
    assert str(too_long.value).startswith("queue name is too long, maximum length is 47 characters")
    client.create_queue(Q)
    with pytest.raises(flavour.error) as conflict:
        client.create_queue("JOBS")
    assert sqlstate(conflict.value) == "PB004"


def test_close_releases_the_pool(flavour: Flavour, dsn: str) -> None:
    queue = flavour.connect(dsn)
    queue.create_queue(Q)
    pool = queue.pool
    assert pool is not None
    queue.close()
    assert queue.pool is None
    assert flavour.pool_is_closed(pool)
    queue.close()  # twice is fine


def test_a_second_init_keeps_the_pool(async_flavour: AsyncFlavour, dsn: str) -> None:
    client = async_flavour.connect(dsn)  # connected: init() has run once
    try:
        pool = client.pool
        assert pool is not None
        client.init()  # type: ignore[attr-defined]  # AsyncPGMQueue's, through Blocking
        assert client.pool is pool
    finally:
        client.close()


# -- every public method is exercised ---------------------------------------------------------

# Client method -> the tests above that call it. Checked both ways, for each client: every public
# method of the client is listed, and every listed test exists and calls the method.
EXERCISED: dict[str, tuple[Callable[..., None], ...]] = {
    "archive": (test_archive_and_archive_batch,),
    "archive_batch": (test_archive_and_archive_batch,),
    "bind_topic": (test_topic_bind_route_send_and_unbind,),
    "close": (test_close_releases_the_pool,),
    "convert_archive_partitioned": (test_convert_archive_partitioned,),
    "create_fifo_index": (test_read_grouped,),
    "create_fifo_indexes_all": (test_read_grouped_rr,),
    "create_partitioned_queue": (test_create_partitioned_queue,),
    "create_queue": (test_create_list_validate_and_drop_queues,),
    "delete": (test_delete_and_delete_batch,),
    "delete_batch": (test_delete_and_delete_batch,),
    "detach_archive": (test_detach_archive_is_a_deprecated_no_op,),
    "disable_notify": (test_notify_enable_update_list_disable,),
    "drop_queue": (test_create_list_validate_and_drop_queues,),
    "enable_notify": (
        test_notify_enable_update_list_disable,
        test_notification_listener_hears_a_send,
        test_async_notification_listener_hears_a_send,
    ),
    "list_notify_throttles": (test_notify_enable_update_list_disable,),
    "list_queues": (test_create_list_validate_and_drop_queues,),
    "list_topic_bindings": (test_topic_bind_route_send_and_unbind,),
    "metrics": (test_metrics_and_metrics_all,),
    "metrics_all": (test_metrics_and_metrics_all,),
    "pop": (test_pop,),
    "purge": (test_purge,),
    "read": (test_read_single_batch_and_conditional, test_read_uses_the_client_default_vt),
    "read_batch": (test_read_single_batch_and_conditional,),
    "read_grouped": (test_read_grouped,),
    "read_grouped_rr": (test_read_grouped_rr,),
    "read_grouped_rr_with_poll": (test_read_grouped_rr,),
    "read_grouped_with_poll": (test_read_grouped,),
    "read_with_poll": (test_read_with_poll,),
    "send": (test_send_plain_with_headers_and_with_delays,),
    "send_batch": (test_send_batch_forms,),
    "send_batch_topic": (test_topic_bind_route_send_and_unbind,),
    "send_topic": (test_topic_bind_route_send_and_unbind,),
    "set_vt": (test_set_vt_single_batch_seconds_and_timestamp,),
    "test_routing": (test_topic_bind_route_send_and_unbind,),
    "unbind_topic": (test_topic_bind_route_send_and_unbind,),
    "update_notify": (test_notify_enable_update_list_disable,),
    "validate_queue_name": (test_create_list_validate_and_drop_queues,),
    "validate_routing_key": (test_topic_bind_route_send_and_unbind,),
    "validate_topic_pattern": (test_topic_bind_route_send_and_unbind,),
}
ONLY_ASYNC: dict[str, tuple[Callable[..., None], ...]] = {
    "init": (test_a_second_init_keeps_the_pool,),
}


@pytest.mark.parametrize("client_class", [PGMQueue, AsyncPGMQueue], ids=["sync", "async"])
def test_every_public_client_method_is_exercised(client_class: type) -> None:
    exercised = EXERCISED | (ONLY_ASYNC if client_class is AsyncPGMQueue else {})
    methods = public_methods(client_class)
    assert sorted(methods - exercised.keys()) == [], "client methods no test exercises"
    assert sorted(exercised.keys() - methods) == [], "listed methods the client no longer has"
    for method, tests in exercised.items():
        for test in tests:
            assert test is globals()[test.__name__]
            assert f".{method}(" in inspect.getsource(test), f"{test.__name__} does not call {method}"
