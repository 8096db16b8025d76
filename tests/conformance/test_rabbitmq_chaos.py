"""Chaos, the article's test made harder: three `pgbroker bridge out` processes publish 10,000
messages inserted one by one with jitter, one bridge is SIGKILLed mid-run and RabbitMQ is
restarted once. A RabbitMQ consumer then receives every message; a message arrives twice only
when a delivery was cut off between the broker's confirm and the Postgres ack (the crash or the
restart), always with the same message_id and body, and never is one missing.

And the inbound twin: `pgbroker bridge in` SIGKILLed mid-stream loses nothing and doubles
nothing in the pgbroker queue.

RabbitMQ is restarted on a private node (tests/support/private_rabbit.py), never the shared one.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import psycopg
import pytest

from pgbroker import Broker
from pgbroker.bridge import OutboundBridge, OutboundSettings
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.queues._records import message_identity
from tests.support.postgres import scratch_dir
from tests.support.private_rabbit import PrivateRabbit, server_binary
from tests.support.rabbit import Rabbit

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 10_000
BRIDGES = 3
LEASE_SECONDS = 5  # a killed bridge's messages come back after this long
DEADLINE_SECONDS = 150


@pytest.fixture
def private_rabbit() -> Iterator[PrivateRabbit]:
    server = server_binary()
    if server is None:
        pytest.fail(
            "the chaos test restarts a private RabbitMQ node and needs rabbitmq-server installed; "
            "run scripts/ensure-rabbitmq (as root it installs Debian's rabbitmq-server)",
            pytrace=False,
        )
    base = scratch_dir("pgbroker-rabbit-")
    node = PrivateRabbit(base, server)
    node.start()
    try:
        yield node
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)


class Bridge:
    """A `pgbroker bridge ...` process; its stderr goes to a file (a pipe could fill and block it)."""

    def __init__(self, *args: str, dsn: str, logs: Path) -> None:
        self.log = logs / f"bridge-{time.monotonic_ns()}.err"
        with self.log.open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pgbroker.cli", *args, "--dsn", dsn],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> tuple[int, str]:
        """SIGTERM, then the exit code and stderr (a graceful stop exits 0)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        return code, self.log.read_text()


def wait_for(condition: object, what: str, timeout: float) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done after {timeout} s")
        time.sleep(0.2)


def test_three_bridges_deliver_every_message_through_a_sigkill_and_a_rabbitmq_restart(
    dsn: str, private_rabbit: PrivateRabbit, tmp_path: Path
) -> None:
    url = private_rabbit.url
    with Broker(dsn) as broker:
        outbox = broker.create_queue("outbox")
        # Retries after a failed publish come back within seconds, not minutes.
        outbox.set_policy(backoff_base_seconds=1, backoff_max_seconds=4)

    async def declare_sink() -> str:
        async with Rabbit(url) as rabbit:
            sink = "chaos-sink"
            await rabbit.channel.queue_declare(sink, durable=True)
            return sink

    sink = asyncio.run(declare_sink())
    options = ["bridge", "out", "--queue", "outbox", "--amqp", url, "--routing-key", sink]
    options += ["--lease", str(LEASE_SECONDS), "--batch-size", "200"]
    bridges = [Bridge(*options, dsn=dsn, logs=tmp_path) for _ in range(BRIDGES)]
    killed = bridges[0]
    inserted = 0

    def produce() -> None:
        nonlocal inserted
        rng = random.Random(7)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for value in range(MESSAGES):
                conn.execute("SELECT pgmq.send('outbox', %s::jsonb)", [json.dumps({"value": value})])
                inserted = value + 1
                time.sleep(rng.random() * 0.001)

    producer = threading.Thread(target=produce)
    started = time.monotonic()
    producer.start()
    try:
        wait_for(lambda: inserted >= MESSAGES * 0.3, "30% inserted", 60)
        killed.kill()
        wait_for(lambda: inserted >= MESSAGES * 0.6, "60% inserted", 60)
        private_rabbit.restart()
        producer.join()
        with Broker(dsn) as broker:
            wait_for(
                lambda: broker.metrics("outbox").queue_length == 0,
                "the outbox drained",
                DEADLINE_SECONDS - (time.monotonic() - started),
            )
    finally:
        producer.join()
        errs = []
        for bridge in bridges[1:]:
            code, err = bridge.stop()
            assert code == 0, err
            errs.append(err)
    # The restart reached the bridges that were running: they lost their connection and came back.
    assert all("bridge.connection_lost" in err for err in errs), errs

    async def drain() -> list[tuple[str, bytes]]:
        async with Rabbit(url) as rabbit:
            try:
                got = await rabbit.drain(sink, expect=MESSAGES, timeout=60)
            finally:
                rabbit.forget_later(queue=sink)
            return [(m.header.properties.message_id or "", m.body) for m in got]

    received = asyncio.run(drain())
    with psycopg.connect(dsn) as conn:
        archived = {
            message_identity(str(msg_id), enqueued_at): (read_ct, message["value"])
            for msg_id, enqueued_at, read_ct, message in conn.execute(
                "SELECT msg_id, enqueued_at, read_ct, message FROM pgmq.a_outbox"
            )
        }
        published = conn.execute(
            "SELECT count(*) FROM pgmq.a_outbox WHERE headers ? 'x-pgbroker-published'"
        ).fetchone()
    read_again = sum(1 for read_ct, _ in archived.values() if read_ct >= 2)

    by_id = Counter(message_id for message_id, _ in received)
    values = {message_id: json.loads(body)["value"] for message_id, body in received}
    duplicates = {message_id: n for message_id, n in by_id.items() if n > 1}
    missing = set(range(MESSAGES)) - set(values.values())
    print(
        f"\nchaos outbound: sent={MESSAGES} received={len(received)} distinct={len(by_id)} "
        f"duplicates={sum(n - 1 for n in duplicates.values())} (messages: {len(duplicates)}) "
        f"missing={len(missing)} read_more_than_once={read_again} seconds={time.monotonic() - started:.1f}"
    )
    assert not missing
    assert len(archived) == MESSAGES
    assert published == (MESSAGES,)
    # Every message_id is one message (msg_id@enqueued_at) with one body: a duplicate is the
    # same message again.
    assert set(by_id) == set(archived)
    assert all(values[message_id] == archived[message_id][1] for message_id in by_id)
    assert len({body for _, body in received}) == MESSAGES
    # A duplicate only where a delivery was cut off: the message was read more than once.
    assert all(archived[message_id][0] >= 2 for message_id in duplicates)
    # At most what was in flight when the bridge was killed and when RabbitMQ went down:
    # 2 windows of 200 per bridge.
    assert sum(n - 1 for n in duplicates.values()) <= BRIDGES * 2 * 200


def test_killing_the_inbound_bridge_mid_stream_loses_nothing_and_doubles_nothing(
    dsn: str, amqp: str, tmp_path: Path
) -> None:
    total = 5000
    with Broker(dsn) as broker:
        broker.create_queue("inbox")
    source = f"pgbroker-test-inbound-chaos-{time.monotonic_ns()}"

    async def publish() -> None:
        async with Rabbit(amqp) as rabbit:
            await rabbit.channel.queue_declare(source, durable=True)  # deleted at the end, below
            for i in range(total):
                await rabbit.publish(source, json.dumps({"n": i}).encode(), message_id=f"m-{i}")

    async def leftover() -> int:
        async with Rabbit(amqp) as rabbit:
            rabbit.forget_later(queue=source)
            return await rabbit.count(source)

    asyncio.run(publish())
    options = ["bridge", "in", "--amqp", amqp, "--from", source, "--queue", "inbox", "--batch-size", "100"]
    options += ["--prefetch", "300"]
    bridges: list[Bridge] = []
    progress: list[str] = []
    try:
        with Broker(dsn) as broker:
            bridges.append(Bridge(*options, dsn=dsn, logs=tmp_path))
            wait_for(lambda: broker.metrics("inbox").queue_length >= total // 4, "a quarter received", 60)
            bridges[0].kill()
            at_kill = broker.metrics("inbox").queue_length
            bridges.append(Bridge(*options, "--progress", "0.5", dsn=dsn, logs=tmp_path))
            wait_for(lambda: broker.metrics("inbox").queue_length >= total, "all received", 60)
            time.sleep(1.0)  # redeliveries of what the killed bridge held would land now
            code, err = bridges[1].stop()
            assert code == 0, err
            progress = [line for line in err.splitlines() if line.startswith("progress ")]
    finally:
        for bridge in bridges:
            if bridge.process.poll() is None:
                bridge.process.kill()
        remaining = asyncio.run(leftover())
    with psycopg.connect(dsn) as conn:
        values = [row[0] for row in conn.execute("SELECT (message->>'n')::int FROM pgmq.q_inbox")]
        seen = conn.execute("SELECT count(*) FROM pgbroker.inbound_seen").fetchone()
    print(
        f"\nchaos inbound: sent={total} in_queue={len(values)} at_kill={at_kill} "
        f"distinct={len(set(values))}; restarted bridge: {progress[-1] if progress else 'no progress line'}"
    )
    assert remaining == 0  # everything was acked
    assert sorted(values) == list(range(total))
    assert seen == (total,)


def test_the_inbound_bridge_rides_out_a_rabbitmq_restart(
    dsn: str, private_rabbit: PrivateRabbit, tmp_path: Path
) -> None:
    total = 5000
    url = private_rabbit.url
    source = "chaos-source"
    with Broker(dsn) as broker:
        broker.create_queue("inbox")

    async def publish() -> None:
        async with Rabbit(url) as rabbit:
            await rabbit.channel.queue_declare(source, durable=True)  # the node is deleted at the end
            for i in range(total):
                await rabbit.publish(source, json.dumps({"n": i}).encode(), message_id=f"m-{i}")

    asyncio.run(publish())
    options = ["bridge", "in", "--amqp", url, "--from", source, "--queue", "inbox", "--batch-size", "100"]
    bridge = Bridge(*options, "--prefetch", "300", "--progress", "0.5", dsn=dsn, logs=tmp_path)
    try:
        with Broker(dsn) as broker:
            wait_for(lambda: broker.metrics("inbox").queue_length >= total // 4, "a quarter received", 60)
            private_rabbit.restart()
            wait_for(lambda: broker.metrics("inbox").queue_length >= total, "all received", 90)
            time.sleep(1.0)  # redeliveries would land now
    finally:
        code, err = bridge.stop()
    assert code == 0, err
    assert "bridge.connection_lost" in err
    with psycopg.connect(dsn) as conn:
        values = [row[0] for row in conn.execute("SELECT (message->>'n')::int FROM pgmq.q_inbox")]
    progress = [line for line in err.splitlines() if line.startswith("progress ")]
    print(f"\nchaos inbound restart: sent={total} in_queue={len(values)} {progress[-1] if progress else ''}")
    assert sorted(values) == list(range(total))


def test_leases_are_extended_while_rabbitmq_holds_back_confirms(
    dsn: str, private_rabbit: PrivateRabbit
) -> None:
    """A memory alarm blocks publishers: confirms stop coming for longer than the lease. The
    bridge keeps extending its leases, so nothing is read twice, and publishes once unblocked."""
    with Broker(dsn) as broker:
        outbox = broker.create_queue("outbox")
        outbox.send_many(list(range(50)))

    async def scenario() -> None:
        async with Rabbit(private_rabbit.url) as rabbit, AsyncBroker(dsn) as abroker:
            target = await rabbit.queue()
            # rabbitmqctl starts an Erlang VM: seconds on a loaded machine, run beside the loop.
            alarm = partial(private_rabbit.ctl, "set_vm_memory_high_watermark")
            await asyncio.to_thread(alarm, "absolute", "1")  # an alarm: blocked
            # Extended every lease/3: an 8 s lease leaves a loaded machine seconds for each
            # extension's round trip (at load 15 on 2 cores, 2 s and 4 s leases ran out once, and the
            # bridge's second window read the 50 messages again).
            settings = OutboundSettings(routing_key=target, lease=8, confirm_timeout=90)
            bridge = OutboundBridge(abroker, "outbox", private_rabbit.url, settings)
            task = asyncio.create_task(bridge.run())
            try:
                await asyncio.sleep(24)  # three leases
                assert bridge.stats.published == 0
                # Run on the loop, it stopped the bridge's extensions while it ran: at load 12 on
                # 2 cores long enough for the 8 s leases to run out, and the 50 went out twice.
                await asyncio.to_thread(alarm, "0.4")
                got = await rabbit.drain(target, expect=50, timeout=30)
                assert sorted(json.loads(m.body) for m in got) == list(range(50))
            finally:
                bridge.stop()
                await task
            assert (bridge.stats.published, bridge.stats.stale, bridge.stats.retried) == (50, 0, 0)

    asyncio.run(scenario())
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT max(read_ct), count(*) FROM pgmq.a_outbox").fetchone() == (1, 50)
