"""The inbound bridge in process, against real Postgres and RabbitMQ: deliveries written to a
pgbroker queue and acked only after the commit, redeliveries de-duplicated by message_id within
the window, bodies and properties kept, refused messages rejected, clear errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from psycopg import sql

from pgbroker import Broker
from pgbroker.bridge import AmqpNotFound, InboundBridge, InboundSettings
from pgbroker.queues._client_async import AsyncBroker
from tests.support.rabbit import Rabbit
from tests.support.tables import Conn, q_rows


async def run_until(
    bridge: InboundBridge, done: Callable[[], Awaitable[bool]], *, timeout: float = 30
) -> None:
    """Run the bridge until done() holds, then stop it gracefully; fail after ``timeout``."""
    task = asyncio.create_task(bridge.run())
    deadline = time.monotonic() + timeout
    try:
        while not await done():
            if task.done():
                task.result()
                raise AssertionError("the bridge returned before it was stopped")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not done after {timeout} s: {bridge.stats}")
            await asyncio.sleep(0.05)
    finally:
        bridge.stop()
        await asyncio.wait([task])
    task.result()


def received(bridge: InboundBridge, count: int) -> Callable[[], Awaitable[bool]]:
    async def done() -> bool:
        return bridge.stats.received + bridge.stats.duplicates + bridge.stats.rejected >= count

    return done


def test_deliveries_are_written_then_acked_and_redeliveries_are_not_sent_twice(
    broker: Broker, dsn: str, conn: Conn, amqp: str
) -> None:
    broker.create_queue("inbox")

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            source = await rabbit.queue()
            for i in range(200):
                await rabbit.publish(source, b'{"n": %d}' % i, message_id=f"m-{i}")
            # The same ids again, as RabbitMQ redelivers after a crash between commit and ack.
            for i in range(50):
                await rabbit.publish(source, b'{"n": %d}' % i, message_id=f"m-{i}")
            bridge = InboundBridge(abroker, source, "inbox", amqp, InboundSettings(batch_size=64))
            await run_until(bridge, received(bridge, 250))
            assert (bridge.stats.received, bridge.stats.duplicates) == (200, 50)
            assert await rabbit.count(source) == 0  # every delivery was acked

    asyncio.run(scenario())
    rows = q_rows(conn, "inbox")
    assert sorted(row[3]["n"] for row in rows) == list(range(200))
    assert sorted(row[4]["x-amqp-properties"]["message_id"] for row in rows) == sorted(
        f"m-{i}" for i in range(200)
    )


def test_bodies_properties_and_origin_are_kept(broker: Broker, dsn: str, conn: Conn, amqp: str) -> None:
    broker.create_queue("inbox")

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            source = await rabbit.queue()
            await rabbit.publish(
                source,
                b'{"a": [1, 2]}',
                message_id="json",
                headers={"tenant": "t1"},
                correlation_id="c-9",
                content_type="application/json",
            )
            await rabbit.publish(source, b"plain words", message_id="text")
            await rabbit.publish(source, b"\xff\x00\xfe", message_id="binary")
            bridge = InboundBridge(abroker, source, "inbox", amqp)
            await run_until(bridge, received(bridge, 3))

    asyncio.run(scenario())
    by_id = {row[4]["x-amqp-properties"]["message_id"]: row for row in q_rows(conn, "inbox")}
    json_row, text_row, binary_row = by_id["json"], by_id["text"], by_id["binary"]
    assert json_row[3] == {"a": [1, 2]}
    assert "x-amqp-body" not in json_row[4]
    assert json_row[4]["x-amqp-properties"]["headers"] == {"tenant": "t1"}
    assert json_row[4]["x-amqp-properties"]["correlation_id"] == "c-9"
    assert json_row[4]["x-amqp-received"]["routing_key"] == json_row[4]["x-amqp-received"]["queue"]
    assert (text_row[3], text_row[4]["x-amqp-body"]) == ("plain words", "text")
    assert (binary_row[3], binary_row[4]["x-amqp-body"]) == ("/wD+", "base64")


def test_messages_without_message_id_are_received_every_time(
    broker: Broker, dsn: str, conn: Conn, amqp: str
) -> None:
    broker.create_queue("inbox")

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            source = await rabbit.queue()
            for _ in range(3):
                await rabbit.publish(source, b'"same"')
            bridge = InboundBridge(abroker, source, "inbox", amqp)
            await run_until(bridge, received(bridge, 3))
            assert (bridge.stats.received, bridge.stats.duplicates) == (3, 0)

    asyncio.run(scenario())
    assert [row[3] for row in q_rows(conn, "inbox")] == ["same"] * 3


def test_a_message_id_is_received_again_after_the_window_and_pruning_forgets_it(
    broker: Broker, dsn: str, conn: Conn
) -> None:
    broker.create_queue("inbox")

    async def scenario() -> None:
        async with AsyncBroker(dsn) as abroker:
            inbox = abroker.queue("inbox")
            first = await inbox.receive_many(
                ["a", "a", None], [1, 2, 3], [None, None, None], seen_within=3600
            )
            assert [message_id for message_id, _ in first] == ["a", None]
            assert await inbox.receive_many(["a"], [4], [None], seen_within=3600) == []
            conn.execute("UPDATE pgbroker.inbound_seen SET seen_at = now() - interval '2 hours'")
            again = await inbox.receive_many(["a"], [5], [None], seen_within=3600)
            assert [message_id for message_id, _ in again] == ["a"]
            conn.execute("UPDATE pgbroker.inbound_seen SET seen_at = now() - interval '2 hours'")
            assert await abroker.prune_inbound_seen(3600) == 1
            assert conn.execute("SELECT count(*) FROM pgbroker.inbound_seen").fetchone() == (0,)

    asyncio.run(scenario())
    assert [row[3] for row in q_rows(conn, "inbox")] == [1, 3, 5]


def test_a_message_pgbroker_refuses_is_rejected_and_the_rest_of_its_batch_received(
    broker: Broker, dsn: str, conn: Conn, amqp: str
) -> None:
    broker.create_queue("inbox")
    # For the bridge's sessions, opened after this.
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET pgbroker.max_message_bytes = 1000").format(
            sql.Identifier(conn.info.dbname)
        )
    )

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            source = await rabbit.queue()
            await rabbit.publish(source, b'"small-1"', message_id="s1")
            await rabbit.publish(source, b'"' + b"x" * 5000 + b'"', message_id="big")
            await rabbit.publish(source, b'"small-2"', message_id="s2")
            bridge = InboundBridge(abroker, source, "inbox", amqp, InboundSettings(linger=0.2))
            await run_until(bridge, received(bridge, 3))
            assert (bridge.stats.received, bridge.stats.rejected) == (2, 1)
            assert await rabbit.count(source) == 0

    asyncio.run(scenario())
    assert sorted(row[3] for row in q_rows(conn, "inbox")) == ["small-1", "small-2"]


def test_a_missing_rabbit_queue_is_a_clear_error_unless_declared(broker: Broker, dsn: str, amqp: str) -> None:
    broker.create_queue("inbox")

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            name = f"pgbroker-test-missing-{time.monotonic_ns()}"
            with pytest.raises(AmqpNotFound) as missing:
                await InboundBridge(abroker, name, "inbox", amqp).run()
            assert f"no queue {name!r}" in str(missing.value)
            assert missing.value.hint is not None
            assert "--declare" in missing.value.hint

            rabbit.forget_later(queue=name)
            bridge = InboundBridge(abroker, name, "inbox", amqp, InboundSettings(declare=True))
            task = asyncio.create_task(bridge.run())
            try:
                async with asyncio.timeout(10):
                    while not await rabbit.queue_exists(name):
                        await asyncio.sleep(0.05)
                await rabbit.publish(name, b'"declared"', message_id="d")
                async with asyncio.timeout(10):
                    while bridge.stats.received < 1:
                        await asyncio.sleep(0.05)
            finally:
                bridge.stop()
                await task

    asyncio.run(scenario())


def test_a_full_queue_holds_deliveries_unacked_until_there_is_room(
    broker: Broker, dsn: str, conn: Conn, amqp: str
) -> None:
    inbox = broker.create_queue("inbox")
    inbox.set_policy(max_depth=50)

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            source = await rabbit.queue()
            for i in range(100):
                await rabbit.publish(source, b'{"n": %d}' % i, message_id=f"m-{i}")
            bridge = InboundBridge(
                abroker, source, "inbox", amqp, InboundSettings(batch_size=10, prefetch=20)
            )
            task = asyncio.create_task(bridge.run())
            try:
                async with asyncio.timeout(20):
                    while bridge.stats.received < 50:
                        await asyncio.sleep(0.05)
                await asyncio.sleep(1.0)
                assert bridge.stats.received == 50  # the queue is full: the rest waits in RabbitMQ
                taken = inbox.pop_many(50)
                async with asyncio.timeout(20):
                    while bridge.stats.received < 100:
                        await asyncio.sleep(0.05)
            finally:
                bridge.stop()
                await task
            assert await rabbit.count(source) == 0
            rest = inbox.pop_many(100)
            assert sorted(m.message["n"] for m in taken + rest) == list(range(100))

    asyncio.run(scenario())
