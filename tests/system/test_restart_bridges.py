"""A restart of Postgres under running bridges (`pgbroker bridge out|in` processes) costs nothing
once the server accepts connections again: the bridges go on without an operator, no message is
lost, the outbound side publishes a message twice only with the same message_id (its ack was cut
off by the restart), and the inbound side stores none twice.

Postgres is a private embedded cluster restarted with ``pg_ctl restart -m fast`` (sessions cut),
as in test_restart.py; RabbitMQ is the shared one (only Postgres restarts).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import psycopg
import pytest

from pgbroker import Broker
from pgbroker.embedded import EmbeddedPostgres
from pgbroker.streams import Stream
from tests.support.bridge_processes import pgbroker
from tests.support.postgres import _restart_and_wait
from tests.support.rabbit import Rabbit

pytestmark = pytest.mark.slow

BEFORE = 20_000  # waiting when the bridge starts; the restart comes while it works through them
AFTER = 1_000  # sent (or published) after the restart
RESTART_AT = 4_000  # moved by the bridge when Postgres is restarted
LEASE = 3  # seconds: what the restart cut off before its ack comes back this soon
# A stream bridge tries a cut ack again within its consumer lease: longer than a restart takes
# under load, so that none is given up.
STREAM_LEASE = 10


def _alive_then_stopped(bridge: subprocess.Popen[str]) -> str:
    """The bridge still runs after the restart (nobody restarted it); stop it as an operator does."""
    assert bridge.poll() is None, f"the bridge died: {bridge.communicate()[1]}"
    bridge.send_signal(signal.SIGTERM)
    _, err = bridge.communicate(timeout=60)
    assert bridge.returncode == 0, err
    assert "Traceback" not in err, err
    return err


async def _until(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        await asyncio.sleep(0.05)


def _published_across_a_restart(
    cluster: EmbeddedPostgres, amqp: str, source: list[str], send: Callable[[Broker, range], None], lease: int
) -> tuple[list[int], list[str]]:
    """BEFORE messages sent to ``source`` (the bridge's --queue or --stream and its options), a
    `bridge out` process started on them, Postgres restarted once it moved RESTART_AT, AFTER more
    sent: the numbers and message ids of all that reached RabbitMQ."""
    dsn = cluster.dsn()
    with Broker(dsn) as direct:
        for start in range(0, BEFORE, 1000):
            send(direct, range(start, start + 1000))

    async def scenario() -> tuple[list[int], list[str]]:
        async with Rabbit(amqp) as rabbit:
            target = await rabbit.queue()
            bridge = pgbroker(
                "bridge", "out", *source, "--amqp", amqp, "--routing-key", target,
                "--lease", str(lease), "--batch-size", "100", dsn=dsn,
            )  # fmt: skip

            async def far_enough() -> bool:
                return await rabbit.count(target) >= RESTART_AT

            try:
                await _until(far_enough, "the bridge published nothing")
                await asyncio.to_thread(_restart_and_wait, cluster)
                with Broker(cluster.dsn()) as after:
                    send(after, range(BEFORE, BEFORE + AFTER))
                got = await rabbit.drain(target, expect=BEFORE + AFTER, timeout=120)
                await asyncio.sleep(lease + 1)  # a re-publish of a cut-off ack comes within a lease
                got += await rabbit.drain(target, expect=1, timeout=1)
            finally:
                _alive_then_stopped(bridge)
            return [json.loads(m.body)["n"] for m in got], [str(m.header.properties.message_id) for m in got]

    numbers, ids = asyncio.run(scenario())
    assert set(numbers) == set(range(BEFORE + AFTER)), "messages were lost"
    # A duplicate carries the same message_id (its identity) as its first publish: recognisable.
    assert len(set(ids)) == BEFORE + AFTER
    return numbers, ids


def _published_twice(numbers: list[int], source: str) -> set[int]:
    twice = {n for n, times in Counter(numbers).items() if times > 1}
    print(f"bridge out of a {source} across a restart: {len(twice)} of {BEFORE + AFTER:,} published twice")
    return twice


def test_bridge_out_rides_out_a_restart(cluster: EmbeddedPostgres, amqp: str) -> None:
    with Broker(cluster.dsn()) as direct:
        direct.create_queue("outbox")

    def send(broker: Broker, numbers: range) -> None:
        broker.queue("outbox").send_many([{"n": n} for n in numbers])

    numbers, _ = _published_across_a_restart(cluster, amqp, ["--queue", "outbox"], send, LEASE)
    twice = _published_twice(numbers, "queue")
    # At most the windows whose acks the restart cut (2 of 100 here), and their leases' renewals
    # under load: a bridge that published everything again would fail this.
    assert len(twice) < (BEFORE + AFTER) // 10, f"{len(twice)} published twice"
    with psycopg.connect(cluster.dsn()) as conn:
        left = conn.execute("SELECT count(*) FROM pgmq.q_outbox").fetchone()
    assert left == (0,)


def test_stream_bridge_out_rides_out_a_restart(cluster: EmbeddedPostgres, amqp: str) -> None:
    """The stream side: the ack of a confirmed window that the restart cut is tried again within
    the consumer lease (a stream ack made again changes nothing), so nothing is published twice
    while the server is back within the lease. The bridge reconnected at once instead, rewound,
    and published the window a second time."""
    with Broker(cluster.dsn()) as direct:
        clicks = Stream(direct, "clicks")
        clicks.create(partitions=4)
        clicks.create_group("out", start="start")

    def send(broker: Broker, numbers: range) -> None:
        Stream(broker, "clicks").send_many([{"n": n} for n in numbers], keys=[f"k{n % 16}" for n in numbers])

    source = ["--stream", "clicks", "--group", "out"]
    numbers, _ = _published_across_a_restart(cluster, amqp, source, send, STREAM_LEASE)
    assert not _published_twice(numbers, "stream")
    with psycopg.connect(cluster.dsn()) as conn:
        lag = conn.execute("SELECT sum(lag) FROM pgbroker.stream_lag('clicks')").fetchone()
    assert lag == (0,)


def test_bridge_in_rides_out_a_restart(cluster: EmbeddedPostgres, amqp: str) -> None:
    dsn = cluster.dsn()
    with Broker(dsn) as direct:
        direct.create_queue("inbox")

    def stored() -> int:
        with psycopg.connect(cluster.dsn()) as conn:
            row = conn.execute("SELECT count(*) FROM pgmq.q_inbox").fetchone()
        return int(row[0]) if row else 0

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit:
            source = await rabbit.queue()
            for i in range(BEFORE):
                await rabbit.publish(source, b'{"n": %d}' % i, message_id=f"m-{i}")
            bridge = pgbroker(
                "bridge", "in", "--amqp", amqp, "--from", source, "--queue", "inbox",
                "--batch-size", "100", dsn=dsn,
            )  # fmt: skip

            async def far_enough() -> bool:
                return await asyncio.to_thread(stored) >= RESTART_AT

            try:
                await _until(far_enough, "the bridge stored nothing")
                await asyncio.to_thread(_restart_and_wait, cluster)
                for i in range(BEFORE, BEFORE + AFTER):
                    await rabbit.publish(source, b'{"n": %d}' % i, message_id=f"m-{i}")

                async def all_in() -> bool:
                    return (
                        not await rabbit.count(source) and await asyncio.to_thread(stored) >= BEFORE + AFTER
                    )

                await _until(all_in, "the bridge did not receive everything")
                await asyncio.sleep(1)  # a late second store would show now
            finally:
                _alive_then_stopped(bridge)

    asyncio.run(scenario())
    with psycopg.connect(cluster.dsn()) as conn:
        numbers = Counter(int(n) for (n,) in conn.execute("SELECT message->>'n' FROM pgmq.q_inbox"))
    assert set(numbers) == set(range(BEFORE + AFTER)), "messages were lost"
    assert max(numbers.values()) == 1, f"stored twice: {[n for n, k in numbers.items() if k > 1][:10]}"
