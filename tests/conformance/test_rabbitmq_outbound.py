"""The outbound bridge in process, against real Postgres and RabbitMQ: routing and properties from
headers, publish records, catch-up and wake-ups, failures through the retry policy into the
dead-letter queue, clear errors, --declare, and parallel bridges that never publish twice."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pgbroker import Broker
from pgbroker.bridge import (
    AmqpAccessRefused,
    AmqpNotFound,
    AmqpUnreachable,
    OutboundBridge,
    OutboundSettings,
)
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.queues._records import message_identity
from tests.support.identity import ids_across_a_failover
from tests.support.rabbit import Rabbit, unique
from tests.support.tables import Conn, q_rows

PUBLISHED = "x-pgbroker-published"
DEAD = "x-pgbroker-dead-letter"


async def run_bridges(
    bridges: list[OutboundBridge], done: Callable[[], Awaitable[bool]], *, timeout: float = 30
) -> None:
    """Run the bridges until done() holds, then stop them gracefully; fail after ``timeout``."""
    tasks = [asyncio.create_task(b.run()) for b in bridges]
    deadline = time.monotonic() + timeout
    try:
        while not await done():
            failed = [t for t in tasks if t.done()]
            if failed:
                failed[0].result()  # raises the bridge's error
                raise AssertionError("a bridge returned before it was stopped")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not done after {timeout} s: {[b.stats for b in bridges]}")
            await asyncio.sleep(0.05)
    finally:
        for b in bridges:
            b.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        t.result()


def queue_empty(broker: AsyncBroker, queue: str) -> Callable[[], Awaitable[bool]]:
    async def done() -> bool:
        return (await broker.metrics(queue)).queue_length == 0

    return done


def archive_headers(conn: Conn, queue: str) -> dict[int, dict[str, Any]]:
    rows = conn.execute(f"SELECT msg_id, headers FROM pgmq.a_{queue} ORDER BY msg_id").fetchall()  # noqa: S608
    return {msg_id: headers for msg_id, headers in rows}


def test_messages_are_published_with_routing_and_properties_from_headers(
    broker: Broker, dsn: str, conn: Conn, amqp: str
) -> None:
    outbox = broker.create_queue("outbox")

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            orders = await rabbit.exchange("topic")
            target = await rabbit.queue(bind=(orders, "order.created"))
            headers = {
                "x-amqp-exchange": orders,
                "x-amqp-routing-key": "order.created",
                "x-amqp-properties": {
                    "correlation_id": "c-1",
                    "type": "order",
                    "priority": 5,
                    "headers": {"tenant": "t1"},
                },
                "source": "shop",
            }
            msg_id = outbox.send({"order": 1}, headers=headers)
            await run_bridges([OutboundBridge(abroker, "outbox", amqp)], queue_empty(abroker, "outbox"))
            got = await rabbit.drain(target, expect=1)

            assert len(got) == 1
            props = got[0].header.properties
            assert json.loads(got[0].body) == {"order": 1}
            [(enqueued_at,)] = conn.execute("SELECT enqueued_at FROM pgmq.a_outbox").fetchall()
            assert props.message_id == message_identity(str(msg_id), enqueued_at)
            assert props.delivery_mode == 2
            assert props.content_type == "application/json"
            assert (props.correlation_id, props.message_type, props.priority) == ("c-1", "order", 5)
            assert props.headers == {"tenant": "t1", "source": "shop"}

            record = archive_headers(conn, "outbox")[msg_id][PUBLISHED]
            assert (record["exchange"], record["routing_key"]) == (orders, "order.created")
            published_at = conn.execute("SELECT %s::timestamptz", [record["at"]]).fetchone()
            archived_at = conn.execute("SELECT archived_at FROM pgmq.a_outbox").fetchone()
            assert published_at is not None
            assert archived_at is not None
            assert published_at[0] <= archived_at[0]

    asyncio.run(scenario())


def test_queue_level_defaults_route_messages_without_routing_headers(
    broker: Broker, dsn: str, amqp: str
) -> None:
    broker.create_queue("events")

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            exchange = await rabbit.exchange("direct")
            by_queue_name = await rabbit.queue(bind=(exchange, "events"))
            by_default_key = await rabbit.queue(bind=(exchange, "ev.key"))
            broker.queue("events").send_many([1, 2, 3])
            bridge = OutboundBridge(abroker, "events", amqp, OutboundSettings(exchange=exchange))
            await run_bridges([bridge], queue_empty(abroker, "events"))
            assert sorted(json.loads(m.body) for m in await rabbit.drain(by_queue_name, expect=3)) == [
                1,
                2,
                3,
            ]

            broker.queue("events").send(4)
            keyed = OutboundBridge(
                abroker, "events", amqp, OutboundSettings(exchange=exchange, routing_key="ev.key")
            )
            await run_bridges([keyed], queue_empty(abroker, "events"))
            assert [json.loads(m.body) for m in await rabbit.drain(by_default_key, expect=1)] == [4]

    asyncio.run(scenario())


def test_catch_up_on_start_and_a_notification_wakes_an_idle_bridge(
    broker: Broker, dsn: str, amqp: str
) -> None:
    outbox = broker.create_queue("outbox")
    outbox.send_many([f"before-{i}" for i in range(20)])

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            target = await rabbit.queue()
            # A long idle wait: only the NOTIFY can make the late message go out quickly.
            settings = OutboundSettings(routing_key=target, idle_wait=30)
            bridge = OutboundBridge(abroker, "outbox", amqp, settings)
            task = asyncio.create_task(bridge.run())
            try:
                caught_up = await rabbit.drain(target, expect=20, timeout=20)
                assert sorted(json.loads(m.body) for m in caught_up) == sorted(
                    f"before-{i}" for i in range(20)
                )
                await asyncio.sleep(1.0)  # the bridge is now waiting on its notification channel
                started = time.monotonic()
                outbox.send("late")
                late = await rabbit.drain(target, expect=1, timeout=10)
                assert [json.loads(m.body) for m in late] == ["late"]
                assert time.monotonic() - started < 3.0
            finally:
                bridge.stop()
                await task

    asyncio.run(scenario())


def test_unroutable_message_is_retried_then_dead_lettered_with_the_error(
    broker: Broker, dsn: str, conn: Conn, amqp: str
) -> None:
    outbox = broker.create_queue("outbox")
    broker.create_queue("outbox_dlq")
    outbox.set_policy(
        max_deliveries=3, backoff="fixed", backoff_base_seconds=0, dead_letter_queue="outbox_dlq"
    )

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            exchange = await rabbit.exchange("direct")  # no queue bound: everything is returned
            outbox.send({"n": 1})
            bridge = OutboundBridge(abroker, "outbox", amqp, OutboundSettings(exchange=exchange))
            await run_bridges([bridge], queue_empty(abroker, "outbox"))
            assert (bridge.stats.published, bridge.stats.retried, bridge.stats.dead_lettered) == (0, 2, 1)

    asyncio.run(scenario())
    letters = q_rows(conn, "outbox_dlq")
    assert len(letters) == 1
    dead = letters[0][4][DEAD]
    assert dead["deliveries"] == 3
    assert "unroutable" in dead["error"]
    assert "returned as mandatory" in dead["error"]


def test_a_message_the_broker_nacks_is_retried_then_dead_lettered(
    broker: Broker, dsn: str, conn: Conn, amqp: str
) -> None:
    outbox = broker.create_queue("outbox")
    outbox.set_policy(max_deliveries=2, backoff="fixed", backoff_base_seconds=0)

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            # A full queue that rejects publishes: RabbitMQ answers them with basic.nack.
            full = await rabbit.queue(arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
            outbox.send("refused")
            bridge = OutboundBridge(abroker, "outbox", amqp, OutboundSettings(routing_key=full))
            await run_bridges([bridge], queue_empty(abroker, "outbox"))
            assert (bridge.stats.published, bridge.stats.retried, bridge.stats.dead_lettered) == (0, 1, 1)

    asyncio.run(scenario())
    (letter,) = archive_headers(conn, "outbox").values()
    assert "basic.nack" in letter[DEAD]["error"]
    assert PUBLISHED not in letter


def test_a_missing_exchange_fails_its_messages_and_not_the_others(
    broker: Broker, dsn: str, conn: Conn, amqp: str
) -> None:
    outbox = broker.create_queue("outbox")
    outbox.set_policy(max_deliveries=1)  # dead letters go to the archive

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            target = await rabbit.queue()
            good = outbox.send("good", headers={"x-amqp-routing-key": target})
            bad = outbox.send("bad", headers={"x-amqp-exchange": "pgbroker-test-no-such-exchange"})
            bridge = OutboundBridge(abroker, "outbox", amqp)
            await run_bridges([bridge], queue_empty(abroker, "outbox"))
            assert [json.loads(m.body) for m in await rabbit.drain(target, expect=1)] == ["good"]
            archived = archive_headers(conn, "outbox")
            assert PUBLISHED in archived[good]
            assert "no exchange 'pgbroker-test-no-such-exchange'" in archived[bad][DEAD]["error"]
            assert "--declare" in archived[bad][DEAD]["error"]

    asyncio.run(scenario())


def test_declare_creates_the_exchange_that_is_otherwise_a_clear_error(
    broker: Broker, dsn: str, amqp: str
) -> None:
    broker.create_queue("outbox")

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            name = f"pgbroker-test-declared-{time.monotonic_ns()}"
            with pytest.raises(AmqpNotFound) as missing:
                await OutboundBridge(abroker, "outbox", amqp, OutboundSettings(exchange=name)).run()
            assert f"no exchange {name!r}" in str(missing.value)
            assert missing.value.hint is not None
            assert "--declare" in missing.value.hint

            rabbit.forget_later(exchange=name)
            settings = OutboundSettings(exchange=name, declare=True, exchange_type="fanout")
            bridge = OutboundBridge(abroker, "outbox", amqp, settings)
            task = asyncio.create_task(bridge.run())
            try:
                async with asyncio.timeout(10):
                    while not await rabbit.exchange_exists(name):
                        await asyncio.sleep(0.05)
                target = await rabbit.queue(bind=(name, ""))
                broker.queue("outbox").send("declared")
                got = await rabbit.drain(target, expect=1, timeout=10)
                assert [json.loads(m.body) for m in got] == ["declared"]
            finally:
                bridge.stop()
                await task

    asyncio.run(scenario())


def test_bad_credentials_and_an_unreachable_broker_are_clear_errors(
    broker: Broker, dsn: str, amqp: str
) -> None:
    broker.create_queue("outbox")

    async def scenario() -> None:
        async with AsyncBroker(dsn) as abroker:
            bad_password = amqp.replace("guest:guest@", "guest:wrong@")
            with pytest.raises(AmqpAccessRefused) as refused:
                await OutboundBridge(abroker, "outbox", bad_password).run()
            assert "refused the login of user 'guest'" in str(refused.value)
            assert "wrong" not in str(refused.value)
            with pytest.raises(AmqpUnreachable) as unreachable:
                await OutboundBridge(abroker, "outbox", "amqp://guest:guest@127.0.0.1:1/").run()
            assert "cannot reach RabbitMQ at 127.0.0.1:1" in str(unreachable.value)
            assert unreachable.value.hint is not None
            assert "ensure-rabbitmq" in unreachable.value.hint

    asyncio.run(scenario())


def test_parallel_bridges_publish_every_message_exactly_once(broker: Broker, dsn: str, amqp: str) -> None:
    outbox = broker.create_queue("outbox")
    total = 3000

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn, max_connections=12) as abroker:
            target = await rabbit.queue()
            settings = OutboundSettings(routing_key=target, batch_size=100, idle_wait=0.2)
            bridges = [OutboundBridge(abroker, "outbox", amqp, settings) for _ in range(3)]

            async def produce() -> None:
                for start in range(0, total, 100):
                    outbox.send_many(list(range(start, start + 100)))
                    # Spread over ~1.5 s, so that the bridges' batches interleave.
                    await asyncio.sleep(0.05)

            producer = asyncio.create_task(produce())

            async def done() -> bool:
                return producer.done() and (await abroker.metrics("outbox")).queue_length == 0

            await run_bridges(bridges, done, timeout=60)
            got = await rabbit.drain(target, expect=total, timeout=30)
            ids = Counter(m.header.properties.message_id for m in got)
            assert len(got) == total
            assert len(ids) == total
            assert sorted(json.loads(m.body) for m in got) == list(range(total))
            # They did run in parallel: the queue was shared (which bridge takes which batch is
            # up to SKIP LOCKED and the event loop, so one of three may find nothing left).
            assert sum(b.stats.published > 0 for b in bridges) >= 2, [b.stats for b in bridges]

    asyncio.run(scenario())


def test_ack_mode_delete_leaves_no_archive_row(broker: Broker, dsn: str, conn: Conn, amqp: str) -> None:
    outbox = broker.create_queue("outbox")
    outbox.set_policy(ack_mode="delete")

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            target = await rabbit.queue()
            outbox.send_many(["a", "b"])
            bridge = OutboundBridge(abroker, "outbox", amqp, OutboundSettings(routing_key=target))
            await run_bridges([bridge], queue_empty(abroker, "outbox"))
            assert len(await rabbit.drain(target, expect=2)) == 2

    asyncio.run(scenario())
    assert archive_headers(conn, "outbox") == {}
    assert q_rows(conn, "outbox") == []


def test_a_msg_id_reissued_after_a_failover_gets_a_new_message_id_and_a_redelivery_keeps_its_own(
    dsn: str, amqp: str
) -> None:
    target = unique("q")

    async def declare() -> None:  # kept until published() read it: the bridge runs in between
        async with Rabbit(amqp) as rabbit:
            await rabbit.channel.queue_declare(target, durable=True)

    asyncio.run(declare())

    async def published(expect: int) -> list[tuple[str | None, bytes]]:
        async with Rabbit(amqp) as rabbit:
            got = await rabbit.drain(target, expect=expect)
            rabbit.forget_later(queue=target)
        return [(m.header.properties.message_id, m.body) for m in got]

    ids_across_a_failover(dsn, f"{amqp}?routing_key={target}", published)
