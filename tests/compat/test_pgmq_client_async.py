"""The official pgmq asyncio client (``pgmq.AsyncPGMQueue``, asyncpg) against a pgbroker database.

The same ground as test_pgmq_client.py, through asyncpg: another driver, another wire protocol
path (asyncpg prepares every statement and binds JSON as text). The client builds its own pool
from host/port/database/username/password, with its ``CREATE EXTENSION pgmq`` step switched off.
Each test runs its scenario with ``asyncio.run`` (the suite has no asyncio plugin).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import psycopg
import pytest
from pgmq import AsyncPGMQueue, Message, QueueMetrics, QueueRecord, async_transaction
from pgmq.notify_listener import AsyncNotificationListener
from psycopg import sql

from tests.compat.conftest import make_async_client, public_methods

Q = "jobs"
Scenario = Callable[[AsyncPGMQueue], Awaitable[None]]


def run_scenario(dsn: str, scenario: Scenario, **options: Any) -> None:
    """Run ``scenario`` with an initialised async client on ``dsn``, closing it afterwards."""

    async def main() -> None:
        client = await make_async_client(dsn, **options)
        try:
            await scenario(client)
        finally:
            await client.close()

    asyncio.run(main())


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
    code = getattr(exc, "sqlstate", None)
    return str(code) if code is not None else None


# -- queue management -------------------------------------------------------------------------


def test_create_list_validate_and_drop_queues(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        await client.create_queue(Q)
        await client.create_queue("fast", unlogged=True)
        with pytest.warns(UserWarning, match="QueueRecord"):
            queues = await client.list_queues()
        assert all(isinstance(q, QueueRecord) for q in queues)
        assert [(q.queue_name, q.is_partitioned, q.is_unlogged) for q in queues] == [
            ("fast", False, True),
            (Q, False, False),
        ]
        assert await client.validate_queue_name("a" * 47) is True
        with pytest.raises(asyncpg.PostgresError) as too_long:
            await client.validate_queue_name("a" * 48)
        assert sqlstate(too_long.value) == "PB001"
        assert await client.drop_queue("fast") is True
        assert await client.drop_queue("fast") is False
        with pytest.warns(UserWarning, match="QueueRecord"):
            assert [q.queue_name for q in await client.list_queues()] == [Q]

    run_scenario(dsn, scenario)


def test_create_partitioned_queue(dsn: str, require_pg_partman: None) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_partitioned_queue("parts")
        await client.create_partitioned_queue(
            "daily", partition_interval="1 day", retention_interval="7 days"
        )
        with pytest.warns(UserWarning, match="QueueRecord"):
            assert {q.queue_name: q.is_partitioned for q in await client.list_queues()} == {
                "parts": True,
                "daily": True,
            }
        assert await client.send_batch("parts", [{"n": 1}, {"n": 2}]) == [1, 2]
        assert [m.msg_id for m in await client.read_batch("parts", vt=30, batch_size=5)] == [1, 2]
        assert (await client.metrics("parts")).queue_length == 2
        assert await client.drop_queue("daily") is True

    run_scenario(dsn, scenario)


def test_convert_archive_partitioned(dsn: str, require_pg_partman: None) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        ids = await client.send_batch(Q, [{"n": n} for n in range(3)])
        await client.archive_batch(Q, ids[:2])
        await client.convert_archive_partitioned(Q, partition_interval=1000, retention_interval=100000)
        assert await client.archive(Q, ids[2]) is True

    run_scenario(dsn, scenario)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT relkind FROM pg_class WHERE oid = 'pgmq.a_jobs'::regclass"
        ).fetchone() == ("p",)
    assert queue_ids(dsn, "a_jobs") == [1, 2, 3]


def test_detach_archive_is_a_deprecated_no_op(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        await client.archive(Q, await client.send(Q, {"n": 1}))
        await client.detach_archive(Q)

    run_scenario(dsn, scenario)
    assert queue_ids(dsn, "a_jobs") == [1]


# -- sending and reading ----------------------------------------------------------------------


def test_send_forms(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        ids = [
            await client.send(Q, {"kind": "plain"}),
            await client.send(Q, {"kind": "headers"}, headers={"trace": "abc"}),
            await client.send(Q, {"kind": "delay"}, delay=3600),
            await client.send(Q, {"kind": "delay 0"}, delay=0),
            await client.send(Q, {"kind": "past"}, delay=datetime.now(UTC) - timedelta(hours=1)),
            await client.send(Q, {"kind": "future"}, delay=datetime.now(UTC) + timedelta(hours=1)),
            await client.send(Q, {"kind": "both"}, headers={"h": 1}, delay=3600),
            await client.send(
                Q, {"kind": "both ts"}, headers={"h": 2}, delay=datetime.now(UTC) - timedelta(1)
            ),
            await client.send(Q, {"kind": "tz alias"}, tz=3600),
        ]
        assert ids == list(range(1, 10))
        got = await client.read_batch(Q, vt=30, batch_size=20)
        assert [(m.msg_id, m.message, m.headers) for m in got] == [
            (1, {"kind": "plain"}, None),
            (2, {"kind": "headers"}, {"trace": "abc"}),
            (4, {"kind": "delay 0"}, None),
            (5, {"kind": "past"}, None),
            (8, {"kind": "both ts"}, {"h": 2}),
        ]

    run_scenario(dsn, scenario)


def test_send_batch_forms(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        msgs = [{"n": 1}, {"n": 2}, {"n": 3}]
        heads: list[dict[str, Any]] = [{"h": 1}, {"h": 2}, {"h": 3}]
        assert await client.send_batch(Q, msgs) == [1, 2, 3]
        assert await client.send_batch(Q, msgs, headers=heads) == [4, 5, 6]
        assert await client.send_batch(Q, msgs, delay=3600) == [7, 8, 9]
        assert await client.send_batch(Q, msgs, delay=datetime.now(UTC) + timedelta(hours=1)) == [10, 11, 12]
        assert await client.send_batch(Q, msgs, headers=heads, delay=0) == [13, 14, 15]
        assert await client.send_batch(Q, msgs, headers=heads, delay=datetime.now(UTC) - timedelta(1)) == [
            16,
            17,
            18,
        ]
        assert await client.send_batch(Q, []) == []
        got = await client.read_batch(Q, vt=30, batch_size=100)
        assert [m.msg_id for m in got] == [1, 2, 3, 4, 5, 6, 13, 14, 15, 16, 17, 18]
        assert [m.headers for m in got[3:6]] == heads

    run_scenario(dsn, scenario)


def test_read_single_batch_and_conditional(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        assert await client.read(Q) is None
        await client.send_batch(Q, [{"kind": "a"}, {"kind": "b"}, {"kind": "a"}, {"kind": "b"}])
        first = one_message(await client.read(Q, vt=30))
        assert (first.msg_id, first.read_ct, first.message) == (1, 1, {"kind": "a"})
        assert first.last_read_at is not None
        assert first.vt > first.enqueued_at
        only_b = as_messages(await client.read(Q, vt=30, qty=5, conditional={"kind": "b"}))
        assert [m.msg_id for m in only_b] == [2, 4]
        assert [m.msg_id for m in await client.read_batch(Q, vt=30, batch_size=5)] == [3]

    run_scenario(dsn, scenario)


def test_read_uses_the_client_default_vt(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        await client.send(Q, {"n": 1})
        assert one_message(await client.read(Q)).read_ct == 1
        assert await client.read(Q) is None
        await asyncio.sleep(1.2)
        assert one_message(await client.read(Q)).read_ct == 2

    run_scenario(dsn, scenario, vt=1)


def test_read_with_poll(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        started = time.monotonic()
        assert await client.read_with_poll(Q, vt=30, qty=5, max_poll_seconds=1, poll_interval_ms=50) == []
        assert time.monotonic() - started >= 0.9

        async def send_later() -> None:
            await asyncio.sleep(0.3)
            await client.send(Q, {"late": True})

        sender = asyncio.create_task(send_later())
        got = await client.read_with_poll(Q, vt=30, qty=5, max_poll_seconds=10, poll_interval_ms=20)
        await sender
        assert [(m.msg_id, m.message) for m in got] == [(1, {"late": True})]
        await client.send_batch(Q, [{"k": "x"}, {"k": "y"}, {"k": "x"}])
        got = await client.read_with_poll(Q, vt=30, qty=5, max_poll_seconds=1, conditional={"k": "x"})
        assert [m.msg_id for m in got] == [2, 4]

    run_scenario(dsn, scenario)


def test_pop(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        assert await client.pop(Q) is None
        await client.send_batch(Q, [{"n": n} for n in range(5)])
        popped = one_message(await client.pop(Q))
        assert (popped.msg_id, popped.read_ct, popped.message) == (1, 0, {"n": 0})
        assert [m.msg_id for m in as_messages(await client.pop(Q, qty=3))] == [2, 3, 4]

    run_scenario(dsn, scenario)
    assert queue_ids(dsn) == [5]


# -- FIFO groups ------------------------------------------------------------------------------


async def _send_groups(client: AsyncPGMQueue) -> None:
    groups = ["A", "A", "B", "A", "B", "C"]
    await client.send_batch(
        Q, [{"i": i} for i in range(len(groups))], headers=[{"x-pgmq-group": g} for g in groups]
    )


def test_read_grouped(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        await client.create_fifo_index(Q)
        await _send_groups(client)
        assert [m.msg_id for m in await client.read_grouped(Q, vt=30, qty=2)] == [1, 2]
        assert [m.msg_id for m in await client.read_grouped(Q, vt=30, qty=10)] == [3, 5, 6]
        assert await client.delete_batch(Q, [1, 2]) == [1, 2]
        got = await client.read_grouped_with_poll(Q, vt=30, qty=10, max_poll_seconds=1)
        assert [m.msg_id for m in got] == [4]
        assert (
            await client.read_grouped_with_poll(Q, vt=30, qty=10, max_poll_seconds=1, poll_interval_ms=50)
            == []
        )

    run_scenario(dsn, scenario)


def test_read_grouped_rr(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        await client.create_fifo_indexes_all()
        await _send_groups(client)
        assert [m.msg_id for m in await client.read_grouped_rr(Q, vt=30, qty=4)] == [1, 3, 6, 2]
        assert await client.read_grouped_rr(Q, vt=30, qty=4) == []
        await client.delete_batch(Q, [1, 2, 3, 6])
        got = await client.read_grouped_rr_with_poll(Q, vt=30, qty=4, max_poll_seconds=1)
        assert [m.msg_id for m in got] == [4, 5]

    run_scenario(dsn, scenario)


# -- acknowledging, visibility, purge, metrics ------------------------------------------------


def test_delete_archive_and_their_batches(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        await client.send_batch(Q, [{"n": n} for n in range(8)])
        assert await client.delete(Q, 1) is True
        assert await client.delete(Q, 1) is False
        assert sorted(await client.delete_batch(Q, [2, 3, 99])) == [2, 3]
        assert await client.archive(Q, 4) is True
        assert await client.archive(Q, 4) is False
        assert sorted(await client.archive_batch(Q, [5, 6, 99])) == [5, 6]

    run_scenario(dsn, scenario)
    assert queue_ids(dsn) == [7, 8]
    assert queue_ids(dsn, "a_jobs") == [4, 5, 6]


def test_set_vt_single_batch_seconds_and_timestamp(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        await client.send_batch(Q, [{"n": n} for n in range(4)])
        assert len(as_messages(await client.read(Q, vt=3600, qty=4))) == 4
        assert one_message(await client.set_vt(Q, 1, 0)).msg_id == 1
        at = datetime.now(UTC) - timedelta(seconds=5)
        two = one_message(await client.set_vt(Q, 2, at))
        assert abs((two.vt - at).total_seconds()) < 0.001
        assert await client.set_vt(Q, 99, 10) is None
        assert sorted(m.msg_id for m in as_messages(await client.set_vt(Q, [3, 4, 99], 0))) == [3, 4]
        later = datetime.now(UTC) + timedelta(hours=1)
        assert sorted(m.msg_id for m in as_messages(await client.set_vt(Q, [1, 2], later))) == [1, 2]
        assert [m.msg_id for m in await client.read_batch(Q, vt=30, batch_size=10)] == [3, 4]

    run_scenario(dsn, scenario)


def test_purge(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        assert await client.purge(Q) == 0
        await client.send_batch(Q, [{"n": n} for n in range(4)])
        await client.archive(Q, 4)
        assert await client.purge(Q) == 3

    run_scenario(dsn, scenario)
    assert queue_ids(dsn) == []
    assert queue_ids(dsn, "a_jobs") == [4]


def test_metrics_and_metrics_all(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        await client.create_queue("other")
        empty = await client.metrics(Q)
        assert isinstance(empty, QueueMetrics)
        assert (empty.queue_length, empty.total_messages, empty.newest_msg_age_sec) == (0, 0, None)
        await client.send_batch(Q, [{"n": n} for n in range(3)])
        await client.send(Q, {"n": 3}, delay=3600)
        await client.read(Q, vt=3600, qty=1)
        await client.delete(Q, 2)
        m = await client.metrics(Q)
        assert (m.queue_name, m.queue_length, m.total_messages, m.queue_visible_length) == (Q, 3, 4, 1)
        every = await client.metrics_all()
        assert [(x.queue_name, x.queue_length) for x in every] == [(Q, 3), ("other", 0)]
        with pytest.raises(asyncpg.PostgresError) as missing:
            await client.metrics("nope")
        assert sqlstate(missing.value) == "PB002"

    run_scenario(dsn, scenario)


# -- transactions -----------------------------------------------------------------------------


class _Abort(Exception):
    pass


def test_calls_share_a_caller_transaction(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        assert client.pool is not None
        async with client.pool.acquire() as conn:
            async with conn.transaction():
                await client.send(Q, {"n": 1}, conn=conn)
                await client.send_batch(Q, [{"n": 2}, {"n": 3}], conn=conn)
                assert queue_ids(dsn) == []

            async def read_and_delete_then_fail() -> None:
                async with conn.transaction():
                    got = one_message(await client.read(Q, vt=30, conn=conn))
                    assert await client.delete(Q, got.msg_id, conn=conn) is True
                    raise _Abort

            with pytest.raises(_Abort):
                await read_and_delete_then_fail()
        assert queue_ids(dsn) == [1, 2, 3]
        assert one_message(await client.read(Q, vt=30)).read_ct == 1

    run_scenario(dsn, scenario)


def test_transaction_decorator(dsn: str) -> None:
    @async_transaction
    async def send_pair(queue: AsyncPGMQueue, fail: bool, conn: Any = None) -> None:
        await queue.send(Q, {"first": True}, conn=conn)
        await queue.send(Q, {"second": True}, conn=conn)
        if fail:
            raise _Abort

    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        with pytest.raises(_Abort):
            await send_pair(client, True)
        assert queue_ids(dsn) == []
        await send_pair(client, False)
        assert len(queue_ids(dsn)) == 2

    run_scenario(dsn, scenario)


# -- notifications ----------------------------------------------------------------------------


def test_notify_enable_update_list_disable(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        await client.create_queue(Q)
        await client.create_queue("other")
        assert await client.list_notify_throttles() == []
        await client.enable_notify(Q)
        await client.enable_notify("other", throttle_interval_ms=0)
        throttles = await client.list_notify_throttles()
        assert [(t.queue_name, t.throttle_interval_ms) for t in throttles] == [(Q, 250), ("other", 0)]
        await client.update_notify(Q, 1000)
        assert {t.queue_name: t.throttle_interval_ms for t in await client.list_notify_throttles()}[Q] == 1000
        await client.disable_notify("other")
        assert [t.queue_name for t in await client.list_notify_throttles()] == [Q]

    run_scenario(dsn, scenario)


def test_notification_listener_hears_a_send(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
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

    run_scenario(dsn, scenario)


# -- topics -----------------------------------------------------------------------------------


def test_topic_bind_route_send_and_unbind(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        for name in ("orders_all", "orders_eu"):
            await client.create_queue(name)
        assert await client.validate_topic_pattern("orders.#") is True
        assert await client.validate_topic_pattern("orders..x") is False
        assert await client.validate_routing_key("orders.eu") is True
        assert await client.validate_routing_key("orders.*") is False
        await client.bind_topic("orders.#", "orders_all")
        await client.bind_topic("orders.eu.*", "orders_eu")
        bindings = await client.list_topic_bindings()
        assert sorted((b.pattern, b.queue_name) for b in bindings) == [
            ("orders.#", "orders_all"),
            ("orders.eu.*", "orders_eu"),
        ]
        assert [b.pattern for b in await client.list_topic_bindings("orders_eu")] == ["orders.eu.*"]
        assert sorted(r.queue_name for r in await client.test_routing("orders.eu.x")) == [
            "orders_all",
            "orders_eu",
        ]
        assert await client.send_topic("orders.eu.x", {"n": 1}) == 2
        assert await client.send_topic("orders.us.x", {"n": 2}, delay=3600) == 1
        assert await client.send_topic("orders.eu.y", {"n": 3}, headers={"h": 1}, delay=0) == 2
        sent = await client.send_batch_topic("orders.eu.z", [{"b": 1}], headers=[{"h": 2}], delay=3600)
        assert sorted((r.queue_name, r.msg_id) for r in sent) == [("orders_all", 4), ("orders_eu", 3)]
        sent = await client.send_batch_topic("orders.x", [{"b": 2}, {"b": 3}])
        assert [(r.queue_name, r.msg_id) for r in sent] == [("orders_all", 5), ("orders_all", 6)]
        eu = await client.read_batch("orders_eu", vt=30, batch_size=10)
        assert [(m.message, m.headers) for m in eu] == [({"n": 1}, None), ({"n": 3}, {"h": 1})]
        assert await client.unbind_topic("orders.#", "orders_all") is True
        assert await client.unbind_topic("orders.#", "orders_all") is False
        with pytest.raises(asyncpg.UndefinedFunctionError):
            # (routing_key, msg, headers) is not a pgmq 1.13 form; see the sync suite.
            await client.send_topic("orders.eu.x", {"n": 4}, headers={"h": 1})

    run_scenario(dsn, scenario)


# -- errors and lifecycle ---------------------------------------------------------------------


def test_errors_carry_pgbroker_sqlstates(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        with pytest.raises(asyncpg.PostgresError) as missing:
            await client.send("nope", {"n": 1})
        assert sqlstate(missing.value) == "PB002"
        with pytest.raises(asyncpg.PostgresError) as bad:
            await client.create_queue("a;b")
        assert sqlstate(bad.value) == "PB001"

    run_scenario(dsn, scenario)


def test_init_and_close(dsn: str) -> None:
    async def scenario(client: AsyncPGMQueue) -> None:
        pool: Any = client.pool
        assert pool is not None
        await client.init()  # a second init keeps the pool
        assert id(client.pool) == id(pool)
        await client.close()
        assert client.pool is None
        assert pool.is_closing()
        await client.close()

    run_scenario(dsn, scenario)


# -- every public method is exercised ---------------------------------------------------------

EXERCISED: dict[str, tuple[Callable[..., None], ...]] = {
    "archive": (test_delete_archive_and_their_batches,),
    "archive_batch": (test_delete_archive_and_their_batches,),
    "bind_topic": (test_topic_bind_route_send_and_unbind,),
    "close": (test_init_and_close,),
    "convert_archive_partitioned": (test_convert_archive_partitioned,),
    "create_fifo_index": (test_read_grouped,),
    "create_fifo_indexes_all": (test_read_grouped_rr,),
    "create_partitioned_queue": (test_create_partitioned_queue,),
    "create_queue": (test_create_list_validate_and_drop_queues,),
    "delete": (test_delete_archive_and_their_batches,),
    "delete_batch": (test_delete_archive_and_their_batches,),
    "detach_archive": (test_detach_archive_is_a_deprecated_no_op,),
    "disable_notify": (test_notify_enable_update_list_disable,),
    "drop_queue": (test_create_list_validate_and_drop_queues,),
    "enable_notify": (test_notify_enable_update_list_disable, test_notification_listener_hears_a_send),
    "init": (test_init_and_close,),
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
    "send": (test_send_forms,),
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


def test_every_public_client_method_is_exercised() -> None:
    methods = public_methods(AsyncPGMQueue)
    assert sorted(methods - EXERCISED.keys()) == [], "client methods no test exercises"
    assert sorted(EXERCISED.keys() - methods) == [], "listed methods the client no longer has"
    for method, tests in EXERCISED.items():
        for test in tests:
            assert test is globals()[test.__name__]
            assert f".{method}(" in inspect.getsource(test), f"{test.__name__} does not call {method}"
