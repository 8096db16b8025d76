"""Watchdogs of the bridges' loops (issue 23, item 2): a transient database failure while a
bridge runs, out of a queue or a stream or into one, leads to a bounded wait and a
retry, never to a bridge that stops. The faults are real (tests/support/faults.py): the table
the bridge needs locked by another session while the bridge's role has a 200 ms lock_timeout
(55P03), and every session of the database terminated."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from psycopg import sql

from pgbroker import Broker
from pgbroker._db.liveness import NoAnswer
from pgbroker.bridge import InboundBridge, InboundSettings, OutboundBridge, OutboundSettings
from pgbroker.bridge.core.inbound import StreamInboundBridge
from pgbroker.bridge.core.outbound import OutboundStats
from pgbroker.bridge.core.stream_outbound import StreamOutboundBridge
from pgbroker.errors import ConnectionLost
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.streams._client import Stream
from pgbroker.streams._client_async import AsyncStream
from tests.support.faults import (
    freezable,
    impatient,
    sessions_frozen,
    sessions_open,
    table_locked,
    terminate_sessions,
)
from tests.support.probes import RedisProbe, body_of, unique
from tests.support.servers import PrivateServer, private_server

pytestmark = pytest.mark.redis

FAULT_SECONDS = 3  # longer than the bridge's idle read interval, so a read meets the fault


async def until(done: Callable[[], Awaitable[bool]], task: asyncio.Task[None], what: str) -> None:
    deadline = time.monotonic() + 120
    while not await done():
        if task.done():
            task.result()  # the bridge's error
            raise AssertionError("the bridge stopped by itself")
        assert time.monotonic() < deadline, f"not {what} after 120 s"
        await asyncio.sleep(0.05)


async def during_faults(dsn: str, table: str, task: asyncio.Task[None]) -> None:
    """A lock on ``table`` for FAULT_SECONDS, then every session cut; the bridge must live on."""

    def faults() -> None:
        with table_locked(dsn, table):
            time.sleep(FAULT_SECONDS)
        terminate_sessions(dsn)

    await asyncio.to_thread(faults)
    assert not task.done(), "the bridge stopped during the faults"


def test_the_outbound_bridge_rides_out_a_lock_timeout_and_cut_sessions(
    dsn: str, redis_server: PrivateServer
) -> None:
    target = unique("watchdog")
    probe = RedisProbe(redis_server.port)
    with Broker(dsn) as broker:
        broker.create_queue("outbox").send_many([{"n": n} for n in range(50)])

    async def scenario() -> None:
        async with AsyncBroker(impatient(dsn), max_connections=4) as abroker:
            bridge = OutboundBridge(abroker, "outbox", probe.url(target), OutboundSettings(idle_wait=0.5))
            task = asyncio.create_task(bridge.run())

            async def empty() -> bool:
                return (await abroker.metrics("outbox")).queue_length == 0

            try:
                await until(empty, task, "published")
                await during_faults(dsn, "pgmq.q_outbox", task)
                await abroker.queue("outbox").send_many([{"n": n} for n in range(50, 100)])
                await until(empty, task, "published after the faults")
            finally:
                bridge.stop()
                await task
            assert bridge.stats.reconnects >= 1

    asyncio.run(scenario())
    got = asyncio.run(probe.published(target, expect=100))
    assert sorted({json.loads(body)["n"] for _, body in got}) == list(range(100))


def test_the_inbound_bridge_rides_out_a_lock_timeout_and_cut_sessions(
    dsn: str, redis_server: PrivateServer
) -> None:
    with Broker(dsn) as broker:
        broker.create_queue("inbox")

    def make(abroker: AsyncBroker, url: str, settings: InboundSettings) -> InboundBridge:
        return InboundBridge(abroker, None, "inbox", url, settings)

    async def stored(abroker: AsyncBroker, bridge: InboundBridge) -> int:
        return (await abroker.metrics("inbox")).queue_length

    _inbound_rides_out_the_faults(dsn, redis_server, make, stored, "pgmq.q_inbox")


def test_the_stream_outbound_bridge_rides_out_a_lock_timeout_and_cut_sessions(
    dsn: str, redis_server: PrivateServer
) -> None:
    target = unique("watchdog")
    probe = RedisProbe(redis_server.port)
    with Broker(dsn) as broker:
        clicks = Stream(broker, "clicks")
        clicks.create(partitions=2)
        clicks.create_group("out", start="start")
        clicks.send_many([{"n": n} for n in range(50)])

    def send_more() -> None:
        with Broker(dsn) as broker:
            Stream(broker, "clicks").send_many([{"n": n} for n in range(50, 100)])

    async def scenario() -> None:
        async with AsyncBroker(impatient(dsn), max_connections=4) as abroker:
            bridge = StreamOutboundBridge(abroker, "clicks", "out", probe.url(target))
            task = asyncio.create_task(bridge.run())

            async def published(count: int) -> Callable[[], Awaitable[bool]]:
                async def done() -> bool:
                    return bridge.stats.published >= count

                return done

            try:
                await until(await published(50), task, "published")
                await during_faults(dsn, "pgbroker.stream_cursor", task)
                await asyncio.to_thread(send_more)
                await until(await published(100), task, "published after the faults")
            finally:
                bridge.stop()
                await task
            assert bridge.stats.reconnects >= 1

    asyncio.run(scenario())
    got = asyncio.run(probe.published(target, expect=100))
    assert sorted({json.loads(body)["n"] for _, body in got}) == list(range(100))


def test_the_stream_inbound_bridge_rides_out_a_lock_timeout_and_cut_sessions(
    dsn: str, redis_server: PrivateServer
) -> None:
    with Broker(dsn) as broker:
        Stream(broker, "mirror").create(partitions=2)

    def make(abroker: AsyncBroker, url: str, settings: InboundSettings) -> StreamInboundBridge:
        return StreamInboundBridge(abroker, None, "mirror", url, settings)

    async def appended(abroker: AsyncBroker, bridge: StreamInboundBridge) -> int:
        return bridge.stats.received

    _inbound_rides_out_the_faults(dsn, redis_server, make, appended, "pgbroker.s_mirror")


def _inbound_rides_out_the_faults(
    dsn: str,
    redis_server: PrivateServer,
    make: Callable[[AsyncBroker, str, InboundSettings], Any],
    stored: Callable[[AsyncBroker, Any], Awaitable[int]],
    table: str,
) -> None:
    """50 messages in, the faults on ``table`` while 50 more are published, then all 100 in
    ``table``: the bridge ``make`` returns, counting what it stored with ``stored``."""
    source = unique("watchdog")
    probe = RedisProbe(redis_server.port)

    async def scenario() -> None:
        async with AsyncBroker(impatient(dsn), max_connections=4) as abroker:
            bridge = make(abroker, probe.url(source), InboundSettings(declare=True, batch_size=10))
            task = asyncio.create_task(bridge.run())

            def at_least(count: int) -> Callable[[], Awaitable[bool]]:
                async def done() -> bool:
                    try:
                        return await stored(abroker, bridge) >= count
                    except ConnectionLost:
                        # This check shares the bridge's pool, whose idle sessions were cut with the
                        # others: the pool drops the dead one, and the next check takes a new one.
                        return False

                return done

            try:
                async with asyncio.timeout(60):
                    await bridge.receiving.wait()
                await probe.publish(source, [(f"m-{n}", body_of(n)) for n in range(50)])
                await until(at_least(50), task, "stored")

                async def publish_while_locked() -> None:
                    await asyncio.sleep(0.5)  # the lock is held by then: the writes meet it
                    await probe.publish(source, [(f"m-{n}", body_of(n)) for n in range(50, 100)])

                publishing = asyncio.create_task(publish_while_locked())
                await during_faults(dsn, table, task)
                await publishing
                await until(at_least(100), task, "stored after the faults")
            finally:
                bridge.stop()
                await task
            assert bridge.stats.reconnects >= 1

    asyncio.run(scenario())
    with Broker(dsn) as broker, broker.connection() as conn:
        query = sql.SQL("SELECT message FROM {}").format(sql.Identifier(*table.split(".")))
        rows = conn.execute(query).fetchall()
    assert sorted(m["n"] for (m,) in rows) == list(range(100))


@pytest.fixture
def frozen_redis() -> Iterator[PrivateServer]:
    """A Redis of the test's own, which the test may freeze (resumed and stopped after)."""
    with private_server("redis") as node:
        yield node


def said(caplog: pytest.LogCaptureFixture, event: str) -> bool:
    return any(r.getMessage().startswith(event) for r in caplog.records)


async def until_said(
    caplog: pytest.LogCaptureFixture, event: str, task: asyncio.Task[None], within: float = 60
) -> None:
    deadline = time.monotonic() + within
    while not said(caplog, event):
        assert not task.done(), f"the bridge stopped: {task.exception()!r}"
        assert time.monotonic() < deadline, f"no {event} in {within} s"
        await asyncio.sleep(0.05)


def test_the_outbound_bridge_gives_up_on_a_redis_that_hangs_and_carries_on_after(
    dsn: str, frozen_redis: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis stops answering (frozen, as a hung server or a network that drops packets without a
    word would be) while the bridge publishes: the publish fails after the confirm timeout, the
    bridge says it lost the connection and tries again until Redis answers. It waited for the
    reply for as long as the hang lasted (for good on a dropped network), saying nothing, and
    extending the window's leases meanwhile, so that no other bridge took the messages."""
    caplog.set_level(logging.INFO, logger="pgbroker.bridge.out")
    target = unique("frozen")
    probe = RedisProbe(frozen_redis.port)
    settings = OutboundSettings(idle_wait=0.5, confirm_timeout=1, connect_timeout=2)
    with Broker(dsn) as broker:
        broker.create_queue("outbox")

    async def scenario() -> None:
        async with AsyncBroker(dsn, max_connections=4) as abroker:
            bridge = OutboundBridge(abroker, "outbox", probe.url(target), settings)
            task = asyncio.create_task(bridge.run())

            async def empty() -> bool:
                return (await abroker.metrics("outbox")).queue_length == 0

            try:
                await until_said(caplog, "bridge.out.started", task)
                frozen_redis.pause()
                await abroker.queue("outbox").send_many([{"n": n} for n in range(20)])
                # Within a few confirm timeouts (1 s), however loaded the machine: they are timers.
                await until_said(caplog, "bridge.connection_lost", task, within=20)
                frozen_redis.resume()
                await until(empty, task, "published after Redis answered again")
            finally:
                bridge.stop()
                await task

    asyncio.run(scenario())
    got = asyncio.run(probe.published(target, expect=20))
    assert {json.loads(body)["n"] for _, body in got} == set(range(20))
    # At most twice each: the frozen publish, written once Redis woke, and the bridge's retry
    # (the client itself sends it again on no new connection).
    assert len(got) <= 40


def test_the_inbound_bridge_gives_up_on_a_redis_that_hangs_and_carries_on_after(
    dsn: str, frozen_redis: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis stops answering while the bridge waits for entries: the read fails after the
    connect timeout, the bridge says it lost the connection, and it stores what is added once
    Redis answers again. It waited for the reply for as long as the hang lasted, saying nothing."""
    caplog.set_level(logging.INFO, logger="pgbroker.bridge.in")
    source = unique("frozen")
    probe = RedisProbe(frozen_redis.port)
    with Broker(dsn) as broker:
        broker.create_queue("inbox")

    async def scenario() -> None:
        async with AsyncBroker(dsn, max_connections=4) as abroker:
            settings = InboundSettings(declare=True, connect_timeout=2)
            bridge = InboundBridge(abroker, None, "inbox", probe.url(source), settings)
            task = asyncio.create_task(bridge.run())

            async def stored() -> bool:
                return (await abroker.metrics("inbox")).queue_length == 20

            try:
                async with asyncio.timeout(60):
                    await bridge.receiving.wait()
                frozen_redis.pause()
                # Within a few connect timeouts (2 s), however loaded the machine: they are timers.
                await until_said(caplog, "bridge.connection_lost", task, within=20)
                frozen_redis.resume()
                await probe.publish(source, [(f"m-{n}", body_of(n)) for n in range(20)])
                await until(stored, task, "stored after Redis answered again")
            finally:
                bridge.stop()
                await task

    asyncio.run(scenario())


# Hung database sessions: every session a bridge's pool (and its listener) holds stops answering,
# its backend frozen with SIGSTOP as a hung server, a stuck pooler or a network that drops
# packets without a word leaves it. Each bridge waited for the answer for as long as the hang
# lasted (for good behind a stuck pooler), saying nothing; now a call unanswered within the lease
# (out) or the ack wait (in) counts as a lost connection: warned, and retried on new sessions.
HUNG_LEASE = 2


async def queue_length(dsn: str, queue: str) -> int:
    """The queue's length, asked on a session of the test's own (the bridge's hang)."""
    async with AsyncBroker(dsn, max_connections=1) as checker:
        return (await checker.metrics(queue)).queue_length


def test_the_outbound_bridge_gives_up_on_database_sessions_that_hang_and_carries_on(
    dsn: str, redis_server: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    with Broker(dsn) as broker:
        broker.create_queue("outbox")
    settings = OutboundSettings(idle_wait=0.5, lease=HUNG_LEASE)

    def send(*numbers: int) -> None:
        with Broker(dsn) as broker:
            broker.queue("outbox").send_many([{"n": n} for n in numbers])

    async def empty(bridge: OutboundBridge | StreamOutboundBridge) -> bool:
        return await queue_length(dsn, "outbox") == 0

    _outbound_carries_on_through_hung_sessions(
        dsn,
        redis_server,
        caplog,
        lambda abroker, url: OutboundBridge(abroker, "outbox", url, settings),
        send,
        empty,
    )


def test_the_stream_outbound_bridge_gives_up_on_database_sessions_that_hang_and_carries_on(
    dsn: str, redis_server: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    with Broker(dsn) as broker:
        clicks = Stream(broker, "clicks")
        clicks.create(partitions=2)
        clicks.create_group("out", start="start")
    settings = OutboundSettings(lease=HUNG_LEASE)

    def send(*numbers: int) -> None:
        with Broker(dsn) as broker:
            Stream(broker, "clicks").send_many([{"n": n} for n in numbers])

    async def all_published(bridge: OutboundBridge | StreamOutboundBridge) -> bool:
        return await published_at_least(bridge, 21)

    _outbound_carries_on_through_hung_sessions(
        dsn,
        redis_server,
        caplog,
        lambda abroker, url: StreamOutboundBridge(abroker, "clicks", "out", url, settings),
        send,
        all_published,
    )


def _outbound_carries_on_through_hung_sessions(
    dsn: str,
    redis_server: PrivateServer,
    caplog: pytest.LogCaptureFixture,
    make: Callable[[AsyncBroker, str], OutboundBridge | StreamOutboundBridge],
    send: Callable[..., None],
    done: Callable[[OutboundBridge | StreamOutboundBridge], Awaitable[bool]],
) -> None:
    """An outbound bridge publishes -1, then 0..19 sent while its sessions hang: each once, after
    a lost connection is said."""
    caplog.set_level(logging.WARNING, logger="pgbroker.bridge.out")
    target = unique("hung")
    probe = RedisProbe(redis_server.port)

    async def scenario() -> None:
        async with AsyncBroker(freezable(dsn), max_connections=4) as abroker:
            bridge = make(abroker, probe.url(target))
            task = asyncio.create_task(bridge.run())
            try:
                await asyncio.to_thread(send, -1)
                await until(lambda: published_at_least(bridge, 1), task, "the first message published")
                with sessions_frozen(dsn) as frozen:
                    assert frozen
                    await asyncio.to_thread(send, *range(20))
                    await until(lambda: done(bridge), task, "published while the sessions hang")
            finally:
                bridge.stop()
                await asyncio.wait_for(task, 60)

    asyncio.run(scenario())
    assert said(caplog, "bridge.connection_lost")
    got = asyncio.run(probe.published(target, expect=21))
    assert {json.loads(body)["n"] for _, body in got} == set(range(-1, 20))


# A bridge whose start meets hung sessions fails within this: its bound (HUNG_LEASE), and slack.
STARTS_WITHIN = 30.0

Bridge = OutboundBridge | StreamOutboundBridge | InboundBridge
BRIDGES_STARTING: dict[str, Callable[[AsyncBroker, str], Bridge]] = {
    "out": lambda abroker, url: OutboundBridge(abroker, "outbox", url, OutboundSettings(lease=HUNG_LEASE)),
    "stream out": lambda abroker, url: StreamOutboundBridge(
        abroker, "clicks", "out", url, OutboundSettings(lease=HUNG_LEASE, declare=True)
    ),
    "in": lambda abroker, url: InboundBridge(
        abroker, None, "inbox", url, InboundSettings(ack_wait=HUNG_LEASE)
    ),
}


@pytest.mark.parametrize("kind", list(BRIDGES_STARTING))
def test_a_bridge_that_starts_on_database_sessions_that_hang_fails_within_its_bound(
    dsn: str, redis_server: PrivateServer, kind: str
) -> None:
    """Every session of the bridge's pool stops answering before it starts: its first database
    call (the queue's check and notify trigger out, the group's declaration for a stream, the
    queue's check in) fails as a lost connection within the lease (out) or the ack wait (in), as
    a first connection that cannot be made does; run() waited for the answer for as long as the
    hang lasted (for good behind a stuck pooler), saying nothing."""
    with Broker(dsn) as broker:
        broker.create_queue("outbox")
        broker.create_queue("inbox")
        Stream(broker, "clicks").create(partitions=1)
    url = RedisProbe(redis_server.port).url(unique("start"))

    async def scenario() -> None:
        # Every connection the pool will hand out is open before the hang, so the first call meets it.
        async with AsyncBroker(freezable(dsn), min_connections=2, max_connections=2) as abroker:
            await asyncio.gather(*(abroker.list_queues() for _ in range(4)))
            # The pool opens its second connection in the background: both are open before the
            # hang (the full run under load once froze one, and the bridge then met none).
            await asyncio.to_thread(sessions_open, dsn, 2)
            with sessions_frozen(dsn) as frozen:
                assert len(frozen) >= 2
                with pytest.raises(NoAnswer):
                    await asyncio.wait_for(BRIDGES_STARTING[kind](abroker, url).run(), STARTS_WITHIN)

    asyncio.run(scenario())


def test_the_inbound_bridge_gives_up_on_database_sessions_that_hang_and_carries_on(
    dsn: str, redis_server: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pgbroker.bridge.in")
    source = unique("hung")
    probe = RedisProbe(redis_server.port)
    with Broker(dsn) as broker:
        broker.create_queue("inbox")
    settings = InboundSettings(declare=True, batch_size=10, ack_wait=HUNG_LEASE)

    async def scenario() -> None:
        async with AsyncBroker(freezable(dsn), max_connections=4) as abroker:
            bridge = InboundBridge(abroker, None, "inbox", probe.url(source), settings)
            task = asyncio.create_task(bridge.run())

            def stored(count: int) -> Callable[[], Awaitable[bool]]:
                async def done() -> bool:
                    return await queue_length(dsn, "inbox") >= count

                return done

            try:
                async with asyncio.timeout(60):
                    await bridge.receiving.wait()
                await probe.publish(source, [("m--1", body_of(-1))])
                await until(stored(1), task, "the first message stored")
                with sessions_frozen(dsn) as frozen:
                    assert frozen
                    await probe.publish(source, [(f"m-{n}", body_of(n)) for n in range(20)])
                    await until(stored(21), task, "stored while the first sessions hang")
            finally:
                bridge.stop()
                await asyncio.wait_for(task, 60)

    asyncio.run(scenario())
    assert said(caplog, "bridge.connection_lost")
    with Broker(dsn) as broker, broker.connection() as conn:
        rows = conn.execute("SELECT message FROM pgmq.q_inbox").fetchall()
    assert sorted(m["n"] for (m,) in rows) == list(range(-1, 20))


async def published_at_least(bridge: OutboundBridge | StreamOutboundBridge, count: int) -> bool:
    return bridge.stats.published >= count


def test_a_lease_extension_that_fails_while_a_window_waits_is_tried_again(
    dsn: str, frozen_redis: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A window waits for its confirms (Redis frozen) and one of its lease extensions fails on a
    passing fault (a maintenance lock on the queue table, the bridge's role with a 200 ms
    lock_timeout): the bridge tries the extension again once the lock is gone, and acks the
    window once Redis confirms it, each message published once. The lease keeper ended at the
    first failure: the leases ran out, the confirmed window went unacked, and every message of
    it was published a second time."""
    _window_meets_a_lock(dsn, frozen_redis, caplog, confirmed_during_the_lock=False)
    assert said(caplog, "bridge.out.extend_failed")


def test_an_ack_that_fails_on_a_passing_fault_is_tried_again_within_the_lease(
    dsn: str, frozen_redis: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A window's confirms come while the queue table is locked (maintenance; the bridge's role
    with a 200 ms lock_timeout), so its ack fails: the bridge tries the ack again while the leases
    hold, and each message is published once. It gave the window up at the first failure (as a
    lost connection: a reconnect to the broker), and every message of it was published a second
    time once its lease ran out."""
    _window_meets_a_lock(dsn, frozen_redis, caplog, confirmed_during_the_lock=True)
    assert said(caplog, "bridge.out.ack_failed")


def _window_meets_a_lock(
    dsn: str,
    frozen_redis: PrivateServer,
    caplog: pytest.LogCaptureFixture,
    *,
    confirmed_during_the_lock: bool,
) -> None:
    """A window of 20 waits for its confirms (Redis frozen) when a lock on the queue table comes
    for half a lease; Redis confirms during the lock or after it. Every message must be published
    once, the bridge never reconnecting."""
    caplog.set_level(logging.INFO, logger="pgbroker.bridge.out")
    target = unique("extend")
    probe = RedisProbe(frozen_redis.port)
    lease = 6  # extended every 2 s; the lock below outlasts one turn, not the lease
    settings = OutboundSettings(idle_wait=0.5, windows=1, lease=lease, confirm_timeout=120)
    with Broker(dsn) as broker:
        broker.create_queue("outbox")

    def leased() -> int:
        with Broker(dsn) as broker, broker.connection() as conn:
            query = "SELECT count(*) FROM pgmq.q_outbox WHERE read_ct = 1 AND vt > now()"
            row = conn.execute(query).fetchone()
        assert row is not None
        return int(row[0])

    async def scenario() -> None:
        async with AsyncBroker(impatient(dsn), max_connections=4) as abroker:
            bridge = OutboundBridge(abroker, "outbox", probe.url(target), settings)
            task = asyncio.create_task(bridge.run())

            async def window_waits() -> bool:
                return await asyncio.to_thread(leased) == 20

            async def empty() -> bool:
                return await queue_length(dsn, "outbox") == 0

            try:
                await until_said(caplog, "bridge.out.started", task)
                frozen_redis.pause()
                try:
                    await abroker.queue("outbox").send_many([{"n": n} for n in range(20)])
                    await until(window_waits, task, "the window read")

                    def lock() -> None:
                        with table_locked(dsn, "pgmq.q_outbox"):
                            if confirmed_during_the_lock:
                                frozen_redis.resume()
                            time.sleep(lease / 2)

                    await asyncio.to_thread(lock)
                finally:
                    frozen_redis.resume()
                await until(empty, task, "published")
                await asyncio.sleep(lease + 2)  # a window left to its leases would be read again by now
            finally:
                bridge.stop()
                await asyncio.wait_for(task, 60)
            assert bridge.stats.published == 20

    asyncio.run(scenario())
    got = asyncio.run(probe.published(target, expect=21, timeout=3))
    assert sorted(json.loads(body)["n"] for _, body in got) == list(range(20))
    assert not said(caplog, "bridge.connection_lost")


def test_a_stream_ack_that_fails_on_a_passing_fault_is_tried_again_within_the_lease(
    dsn: str, frozen_redis: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream window's confirms come while the group's cursors are locked (maintenance; the
    bridge's role with a 200 ms lock_timeout), so its ack fails: the bridge tries the ack again
    while its consumer lease holds (a stream ack made again changes nothing: test_stream_engine's
    test_an_ack_made_again_changes_nothing_and_errs_nothing), and each message is published once.
    It reconnected at the first failure, rewound and published the whole window a second time."""
    caplog.set_level(logging.INFO, logger="pgbroker.bridge.out")
    target = unique("stream-ack")
    probe = RedisProbe(frozen_redis.port)
    lease = 6  # the lock below lasts half of it
    settings = OutboundSettings(lease=lease, confirm_timeout=120)
    with Broker(dsn) as broker:
        clicks = Stream(broker, "clicks")
        clicks.create(partitions=1)
        clicks.create_group("out", start="start")

    def delivered() -> int:
        with Broker(dsn) as broker, broker.connection() as conn:
            query = "SELECT delivered_id FROM pgbroker._stream_positions('clicks', 'out', ARRAY[0])"
            row = conn.execute(query).fetchone()
        assert row is not None
        return int(row[0])

    async def scenario() -> OutboundStats:
        async with AsyncBroker(impatient(dsn), max_connections=4) as abroker:
            bridge = StreamOutboundBridge(abroker, "clicks", "out", probe.url(target), settings)
            task = asyncio.create_task(bridge.run())

            async def window_waits() -> bool:
                return await asyncio.to_thread(delivered) == 20

            try:
                await until_said(caplog, "bridge.out.started", task)
                frozen_redis.pause()
                try:
                    await AsyncStream(abroker, "clicks").send_many([{"n": n} for n in range(20)])
                    await until(window_waits, task, "the window read")

                    def lock() -> None:
                        with table_locked(dsn, "pgbroker.stream_cursor"):
                            frozen_redis.resume()
                            time.sleep(lease / 2)

                    await asyncio.to_thread(lock)
                finally:
                    frozen_redis.resume()
                await until(lambda: published_at_least(bridge, 20), task, "published")
                await asyncio.sleep(2)  # a window read again after a reconnect is published by now
            finally:
                bridge.stop()
                await asyncio.wait_for(task, 60)
            return bridge.stats

    stats = asyncio.run(scenario())
    got = asyncio.run(probe.published(target, expect=21, timeout=3))
    assert sorted(json.loads(body)["n"] for _, body in got) == list(range(20))
    assert (stats.published, stats.reconnects) == (20, 0)
    assert said(caplog, "bridge.out.ack_failed")
    assert not said(caplog, "bridge.connection_lost")


def test_a_database_fault_that_lasts_is_retried_with_growing_pauses(
    dsn: str, redis_server: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The database refuses every call for a while (a maintenance lock on the queue table, the
    bridge's role with a 200 ms lock_timeout): the bridge retries with pauses that double, as
    docs/bridge.md says, and publishes once the lock is gone. The back-off started over after
    every reconnect to the broker, which succeeded each time: the bridge reconnected to Redis and
    warned about every 0.4 s for as long as the fault lasted."""
    caplog.set_level(logging.WARNING, logger="pgbroker.bridge.out")
    target = unique("backoff")
    probe = RedisProbe(redis_server.port)
    with Broker(dsn) as broker:
        broker.create_queue("outbox")
    locked_for = 8.0

    async def scenario() -> None:
        async with AsyncBroker(impatient(dsn), max_connections=4) as abroker:
            bridge = OutboundBridge(abroker, "outbox", probe.url(target), OutboundSettings(idle_wait=0.5))
            task = asyncio.create_task(bridge.run())
            try:
                await until(lambda: published_at_least(bridge, 0), task, "started")
                await asyncio.sleep(1)  # reading: an idle read every 0.5 s

                def maintenance() -> None:
                    with table_locked(dsn, "pgmq.q_outbox"):
                        time.sleep(locked_for)

                await asyncio.to_thread(maintenance)
                lost = sum(r.getMessage().startswith("bridge.connection_lost") for r in caplog.records)
                # Pauses of 0.2, 0.4, 0.8, 1.6, 3.2 s (less jitter) fit 5 tries in 8 s; started over each
                # time, about 20 (fewer on a loaded machine, never as few as 8).
                assert 1 <= lost <= 7, f"{lost} reconnects in {locked_for} s"
                await abroker.queue("outbox").send_many([{"n": n} for n in range(5)])

                async def empty() -> bool:
                    return await queue_length(dsn, "outbox") == 0

                await until(empty, task, "published after the lock")
            finally:
                bridge.stop()
                await asyncio.wait_for(task, 60)

    asyncio.run(scenario())


def test_a_stop_while_the_queue_is_full_returns_and_gives_the_batch_back(
    dsn: str, redis_server: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The inbound bridge holds a batch while its queue is full (max_depth), and is stopped (SIGTERM
    in `pgbroker bridge in`): it returns, the batch unacked, and a bridge started later stores it
    once there is room. It retried the full queue until there was room, whatever stop() said: a
    deploy's SIGTERM waited for the queue's consumers, and then for the second signal."""
    caplog.set_level(logging.WARNING, logger="pgbroker.bridge.in")
    source = unique("full")
    probe = RedisProbe(redis_server.port)
    with Broker(dsn) as broker:
        inbox = broker.create_queue("inbox")
        inbox.set_policy(max_depth=5)
        inbox.send_many([{"n": -n} for n in range(1, 6)])
    settings = InboundSettings(declare=True, batch_size=10)

    async def scenario() -> None:
        async with AsyncBroker(dsn, max_connections=4) as abroker:
            bridge = InboundBridge(abroker, None, "inbox", probe.url(source), settings)
            task = asyncio.create_task(bridge.run())
            async with asyncio.timeout(60):
                await bridge.receiving.wait()
            await probe.publish(source, [(f"m-{n}", body_of(n)) for n in range(3)])
            try:
                await until_said(caplog, "bridge.in.queue_full", task)
            finally:
                bridge.stop()
                await asyncio.wait_for(task, 30)  # the pauses are a second at most
            assert bridge.stats.received == 0

            with Broker(dsn) as broker:
                broker.queue("inbox").purge()
            again = InboundBridge(abroker, None, "inbox", probe.url(source), settings)
            task = asyncio.create_task(again.run())

            async def stored() -> bool:
                return await queue_length(dsn, "inbox") >= 3

            try:
                await until(stored, task, "stored by the next bridge")
            finally:
                again.stop()
                await asyncio.wait_for(task, 30)

    asyncio.run(scenario())
    with Broker(dsn) as broker, broker.connection() as conn:
        rows = conn.execute("SELECT message FROM pgmq.q_inbox").fetchall()
    assert sorted(m["n"] for (m,) in rows) == [0, 1, 2]


def test_an_idle_stream_bridge_with_a_lease_of_a_second_does_not_give_up_its_reads(
    dsn: str, redis_server: PrivateServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A read of the stream outbound bridge waits up to a second for messages: bounded by the
    lease alone (--lease 1), an idle bridge gave up every read as unanswered and reconnected."""
    caplog.set_level(logging.WARNING, logger="pgbroker.bridge.out")
    target = unique("idle")
    probe = RedisProbe(redis_server.port)
    with Broker(dsn) as broker:
        clicks = Stream(broker, "clicks")
        clicks.create(partitions=1)
        clicks.create_group("out", start="start")

    async def scenario() -> None:
        async with AsyncBroker(dsn, max_connections=4) as abroker:
            settings = OutboundSettings(lease=1)
            bridge = StreamOutboundBridge(abroker, "clicks", "out", probe.url(target), settings)
            task = asyncio.create_task(bridge.run())
            try:
                await asyncio.sleep(5)  # idle: reads that wait a second each
                assert not task.done(), task.exception()
            finally:
                bridge.stop()
                await asyncio.wait_for(task, 60)

    asyncio.run(scenario())
    assert not said(caplog, "bridge.connection_lost")
