"""Bridges against a broker that hangs: NATS and Mosquitto private servers frozen with SIGSTOP
(tests/support/servers.py), RabbitMQ reached through a relay that freezes (tests/support/relay.py:
the machine's RabbitMQ is shared and never stopped). Either way the bridge's connection stays open
and nothing answers, as with a hung server or a network that drops packets without a word.

Each bridge, out and in, says within a bound that it lost the connection, keeps what it holds
(out: each message published at least once, at most twice: the window sent into the hang and its
retry; in: each message stored once), carries on once the broker answers again, and returns
from run() within a bound when stopped while the broker hangs. The same for Redis is in
test_bridge_watchdogs.py."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
from psycopg import sql
from yarl import URL

from pgbroker import Broker
from pgbroker.bridge import InboundBridge, InboundSettings, OutboundBridge, OutboundSettings
from pgbroker.bridge.connector import Endpoint
from pgbroker.bridge.connectors import rabbitmq
from pgbroker.bridge.errors import AmqpConnectionLost
from pgbroker.queues._client_async import AsyncBroker
from tests.support.probes import Probe, RabbitProbe, body_of, probe, unique
from tests.support.relay import Relay
from tests.support.servers import private_server
from tests.support.services import service_params

# How long the broker hangs once the bridge said it lost it: its reconnects meet the hang too.
HANG = 3.0
# A hang is told within this, however loaded the machine: a few of the timeouts below, timers all.
TOLD_WITHIN = 20.0
# A stopped bridge returns within this while the broker hangs (a window's confirm timeout, a close).
STOPS_WITHIN = 15.0
CONFIRM_TIMEOUT = 1.0
CONNECT_TIMEOUT = 2.0
# A check at connect that meets the hang fails within this: the connect timeout, and the close.
CHECKED_WITHIN = 15.0


@dataclass
class Hanging:
    """A broker the test can freeze and thaw, and its probe (used only while it is thawed)."""

    probe: Probe
    freeze: Callable[[], None]
    thaw: Callable[[], None]


@pytest.fixture(params=service_params("nats", "mqtt", "rabbitmq"))
def hanging(request: pytest.FixtureRequest) -> Iterator[Hanging]:
    if request.param == "rabbitmq":
        amqp: str = request.getfixturevalue("amqp")
        with Relay(URL(amqp).port or 5672) as relay:
            rabbit = RabbitProbe(amqp, relay.port)
            try:
                yield Hanging(rabbit, relay.freeze, relay.thaw)
            finally:
                relay.thaw()
                asyncio.run(rabbit.close())
        return
    with private_server(request.param) as node:
        yield Hanging(probe(request.param, node.port), node.pause, node.resume)


def said(caplog: pytest.LogCaptureFixture, event: str) -> bool:
    return any(r.getMessage().startswith(event) for r in caplog.records)


async def until(
    done: Callable[[], Awaitable[bool] | bool], task: asyncio.Task[None], what: str, within: float
) -> None:
    deadline = time.monotonic() + within
    while True:
        answer = done()
        if answer if isinstance(answer, bool) else await answer:
            return
        assert not task.done(), f"the bridge returned before it was stopped: {task.exception()!r}"
        assert time.monotonic() < deadline, f"not {what} within {within} s"
        await asyncio.sleep(0.05)


async def told_while_it_hangs(
    hanging: Hanging,
    caplog: pytest.LogCaptureFixture,
    task: asyncio.Task[None],
    meanwhile: Callable[[], Awaitable[object]],
) -> None:
    """Freeze the broker, run ``meanwhile``: the bridge says it lost the connection within
    TOLD_WITHIN; the broker thawed HANG seconds later (the bridge's reconnects meet the hang)."""
    hanging.freeze()
    try:
        await meanwhile()
        await until(lambda: said(caplog, "bridge.connection_lost"), task, "told", TOLD_WITHIN)
        await asyncio.sleep(HANG)
    finally:
        hanging.thaw()


async def stopped_while_it_hangs(
    hanging: Hanging,
    stop: Callable[[], None],
    task: asyncio.Task[None],
    meanwhile: Callable[[], Awaitable[object]],
) -> None:
    """Freeze the broker, run ``meanwhile``, then stop the bridge: run() returns within STOPS_WITHIN."""
    hanging.freeze()
    try:
        await meanwhile()
        await asyncio.sleep(0.5)  # the bridge meets the hang (out: a window read and sent into it)
        stop()
        try:
            await asyncio.wait_for(asyncio.shield(task), STOPS_WITHIN)
        except TimeoutError:
            raise AssertionError(f"the bridge did not return within {STOPS_WITHIN} s of its stop") from None
    finally:
        hanging.thaw()


async def nothing() -> None:
    pass


def numbers(dsn: str, table: str) -> list[int]:
    """The "n" of every message in the pgmq table ``table`` (q_<queue> or a_<queue>)."""
    query = sql.SQL("SELECT message FROM {}").format(sql.Identifier("pgmq", table))
    with Broker(dsn) as broker, broker.connection() as conn:
        return [m["n"] for (m,) in conn.execute(query).fetchall()]


@asynccontextmanager
async def outbound_running(
    dsn: str, url: str, settings: OutboundSettings
) -> AsyncIterator[tuple[OutboundBridge, asyncio.Task[None], AsyncBroker]]:
    """An outbound bridge from the queue outbox to ``url``, started; stopped on the way out."""
    async with AsyncBroker(dsn, max_connections=4) as abroker:
        await abroker.create_queue("outbox")
        bridge = OutboundBridge(abroker, "outbox", url, settings)
        task = asyncio.create_task(bridge.run())
        try:
            await until(bridge.started.is_set, task, "started", 60)
            yield bridge, task, abroker
        finally:
            bridge.stop()
            task.cancel()


def test_the_outbound_bridge_gives_up_on_a_broker_that_hangs_carries_on_and_stops(
    dsn: str, hanging: Hanging, caplog: pytest.LogCaptureFixture
) -> None:
    """20 messages sent while the broker hangs: the bridge says it lost the connection (a window
    not confirmed within the confirm timeout), publishes them once the broker answers; 10 more
    sent while it hangs again, and the bridge stopped: run() returns, and nothing is lost (each
    message archived as published, or still in the queue)."""
    caplog.set_level(logging.INFO, logger="pgbroker.bridge.out")
    target = unique("hang")
    asyncio.run(hanging.probe.prepare_out(target))
    settings = OutboundSettings(
        idle_wait=0.5, confirm_timeout=CONFIRM_TIMEOUT, connect_timeout=CONNECT_TIMEOUT
    )

    async def scenario() -> None:
        async with outbound_running(dsn, hanging.probe.url(target), settings) as (bridge, task, abroker):
            outbox = abroker.queue("outbox")

            async def empty() -> bool:
                return (await abroker.metrics("outbox")).queue_length == 0

            await told_while_it_hangs(
                hanging, caplog, task, lambda: outbox.send_many([{"n": n} for n in range(20)])
            )
            await until(empty, task, "published after the broker answered again", 120)
            await stopped_while_it_hangs(
                hanging, bridge.stop, task, lambda: outbox.send_many([{"n": n} for n in range(20, 30)])
            )

    asyncio.run(scenario())
    got = asyncio.run(hanging.probe.published(target, expect=20))
    counts = Counter(json.loads(body)["n"] for _, body in got)
    assert set(range(20)) <= set(counts) <= set(range(30))
    # The window sent into the hang (the broker takes it when it wakes) and its retry, no more.
    assert max(counts.values()) <= 2, counts
    # Nothing lost: each of the last 10 was published (archived) or is still in the queue.
    assert sorted(numbers(dsn, "a_outbox") + numbers(dsn, "q_outbox")) == list(range(30))


def test_the_inbound_bridge_gives_up_on_a_broker_that_hangs_carries_on_and_stops(
    dsn: str, hanging: Hanging, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker hangs while the bridge waits for messages: the bridge says it lost the
    connection within a bound, stores what is published once the broker answers again (each
    message once), and returns from run() when stopped while the broker hangs again."""
    caplog.set_level(logging.INFO, logger="pgbroker.bridge.in")
    source = unique("hang")
    asyncio.run(hanging.probe.prepare_in(source))
    settings = InboundSettings(declare=True, batch_size=10, connect_timeout=CONNECT_TIMEOUT)
    with Broker(dsn) as broker:
        broker.create_queue("inbox")

    async def scenario() -> None:
        async with AsyncBroker(dsn, max_connections=4) as abroker:
            bridge = InboundBridge(abroker, None, "inbox", hanging.probe.url(source), settings)
            task = asyncio.create_task(bridge.run())

            def stored(count: int) -> Callable[[], Awaitable[bool]]:
                async def done() -> bool:
                    return (await abroker.metrics("inbox")).queue_length >= count

                return done

            try:
                await until(bridge.receiving.is_set, task, "receiving", 60)
                await hanging.probe.publish(source, [(f"m-{n}", body_of(n)) for n in range(10)])
                await until(stored(10), task, "stored", 60)
                await told_while_it_hangs(hanging, caplog, task, nothing)
                await hanging.probe.publish(source, [(f"m-{n}", body_of(n)) for n in range(10, 20)])
                await until(stored(20), task, "stored after the broker answered again", 120)
                await stopped_while_it_hangs(hanging, bridge.stop, task, nothing)
            finally:
                bridge.stop()
                task.cancel()

    asyncio.run(scenario())
    assert sorted(numbers(dsn, "q_inbox")) == list(range(20))


# A window of this many messages of PADDING bytes each is more than the kernel's socket buffers
# take on the way to a broker that reads nothing (about 4 MB each way here): its writes block.
BIG_WINDOW = 12
PADDING = 900_000
SLOW_LIVENESS_CONNECT_TIMEOUT = 10.0


def test_a_window_larger_than_the_socket_buffers_sent_into_a_hang_is_given_up_and_the_bridge_stops(
    dsn: str, hanging: Hanging, caplog: pytest.LogCaptureFixture
) -> None:
    """12 messages of 900 kB sent while the broker hangs: the window's writes block, since the
    hung broker reads nothing; the bridge still says it lost the connection (not confirmed within
    the confirm timeout), and returns from run() when stopped, nothing lost. A NATS bridge waited
    on the write for good (nats-py's publish timeout counts from the write's end), then on its
    close."""
    caplog.set_level(logging.INFO, logger="pgbroker.bridge.out")
    target = unique("bighang")
    asyncio.run(hanging.probe.prepare_out(target))
    # The client's own liveness checks (every half connect timeout) slow enough that the bridge
    # closes the connection before they give it up: the close meets the hang.
    settings = OutboundSettings(
        idle_wait=0.5, confirm_timeout=CONFIRM_TIMEOUT, connect_timeout=SLOW_LIVENESS_CONNECT_TIMEOUT
    )

    async def scenario() -> None:
        async with outbound_running(dsn, hanging.probe.url(target), settings) as (bridge, task, abroker):

            async def sent_and_told() -> None:
                await abroker.queue("outbox").send_many(
                    [{"n": n, "pad": "x" * PADDING} for n in range(BIG_WINDOW)]
                )
                await until(lambda: said(caplog, "bridge.connection_lost"), task, "told", TOLD_WITHIN)

            await stopped_while_it_hangs(hanging, bridge.stop, task, sent_and_told)

    asyncio.run(scenario())
    assert sorted(numbers(dsn, "a_outbox") + numbers(dsn, "q_outbox")) == list(range(BIG_WINDOW))


@pytest.mark.parametrize("direction", ["out", "in"])
def test_a_rabbitmq_check_at_connect_that_meets_a_hang_fails_within_the_connect_timeout(
    amqp: str, direction: str
) -> None:
    """The path to RabbitMQ hangs at the check the bridge makes once connected (out: the
    exchange's passive declare; in: the queue's), the URL's own heartbeat 60 s: opening fails
    within the connect timeout as a lost connection. It waited for the heartbeat to give the
    connection up (over a minute; for good with heartbeat=0)."""
    name = unique("checkhang")
    with Relay(URL(amqp).port or 5672) as relay:
        relay.freeze_on(name.encode())
        url = str(URL(amqp).with_port(relay.port) % {"heartbeat": "60", "exchange": name, "queue": name})
        endpoint: Endpoint[object] = (
            rabbitmq.outbound(url, "q", OutboundSettings(connect_timeout=CONNECT_TIMEOUT))
            if direction == "out"
            else rabbitmq.inbound(url, None, "q", InboundSettings(connect_timeout=CONNECT_TIMEOUT))
        )

        async def opening() -> None:
            started = time.monotonic()
            with pytest.raises(AmqpConnectionLost, match=f"no answer within {CONNECT_TIMEOUT:g} s"):
                await asyncio.wait_for(endpoint.open(), CHECKED_WITHIN)
            assert time.monotonic() - started < CHECKED_WITHIN

        asyncio.run(opening())
