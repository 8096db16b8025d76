"""Every connector beyond RabbitMQ, in process, against real servers (private ones the tests
start, tests/support/servers.py): out, each message published once with its identity (msg_id@enqueued_at) as
message id, its body the payload's JSON and a publish record in the archive; in, each message stored once,
even when the broker holds it twice; and the clear errors of a broker that is not there or a
consumer group that does not exist. The chaos tests (SIGKILL, restarts) are in
test_connector_chaos.py."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from pgbroker import Broker
from pgbroker.bridge import (
    BrokerNotFound,
    BrokerUnreachable,
    InboundBridge,
    InboundSettings,
    OutboundBridge,
    OutboundSettings,
)
from pgbroker.errors import InvalidArgument
from pgbroker.queues._client_async import AsyncBroker
from tests.support.identity import ids_across_a_failover, msg_id_of
from tests.support.postgres import scratch_dir
from tests.support.probes import Probe, body_of, probe, unique
from tests.support.servers import CONNECTORS, KINDS, PrivateServer, free_port
from tests.support.services import service_params


@pytest.fixture(scope="module", params=service_params(*CONNECTORS))
def server(request: pytest.FixtureRequest) -> Iterator[PrivateServer]:
    base = scratch_dir(f"pgbroker-{request.param}-")
    node = PrivateServer(KINDS[request.param], base)
    node.start()
    try:
        yield node
    finally:
        node.close()


@pytest.fixture
def broker_probe(server: PrivateServer, monkeypatch: pytest.MonkeyPatch) -> Probe:
    found = probe(server.kind.name, server.port)
    for key, value in found.env.items():
        monkeypatch.setenv(key, value)
    return found


async def until(
    done: Callable[[], Awaitable[bool]], tasks: list[asyncio.Task[None]], timeout: float = 30
) -> None:
    deadline = time.monotonic() + timeout
    while not await done():
        for task in tasks:
            if task.done():
                task.result()
                raise AssertionError("a bridge returned before it was stopped")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done after {timeout} s")
        await asyncio.sleep(0.05)


def test_out_publishes_each_message_once_with_its_msg_id_and_a_publish_record(
    dsn: str, broker_probe: Probe
) -> None:
    target = unique("out")
    with Broker(dsn) as broker:
        queue = broker.create_queue("outbox")
        ids = queue.send_many([{"n": n} for n in range(200)], headers=[{"tenant": "t1"}] * 200)

    async def scenario() -> None:
        await broker_probe.prepare_out(target)
        async with AsyncBroker(dsn) as abroker:
            settings = OutboundSettings(batch_size=64, confirm_timeout=10)
            bridge = OutboundBridge(abroker, "outbox", broker_probe.url(target), settings)
            task = asyncio.create_task(bridge.run())

            async def empty() -> bool:
                return (await abroker.metrics("outbox")).queue_length == 0

            try:
                await until(empty, [task])
            finally:
                bridge.stop()
                await task
            assert (bridge.stats.published, bridge.stats.retried, bridge.stats.stale) == (200, 0, 0)
        got = await broker_probe.published(target, expect=200)
        assert sorted(msg_id_of(mid) for mid, _ in got) == sorted(ids)
        assert {msg_id_of(mid): json.loads(body) for mid, body in got} == {
            i: {"n": n} for n, i in enumerate(ids)
        }

    asyncio.run(scenario())
    with Broker(dsn) as broker, broker.connection() as conn:
        records = [
            h["x-pgbroker-published"] for (h,) in conn.execute("SELECT headers FROM pgmq.a_outbox").fetchall()
        ]
    assert len(records) == 200
    assert all("at" in r for r in records)


def test_a_msg_id_reissued_after_a_failover_gets_a_new_message_id_and_a_redelivery_keeps_its_own(
    dsn: str, broker_probe: Probe
) -> None:
    target = unique("failover")
    asyncio.run(broker_probe.prepare_out(target))

    async def published(expect: int) -> list[tuple[str | None, bytes]]:
        return await broker_probe.published(target, expect=expect)

    ids_across_a_failover(
        dsn, broker_probe.url(target), published, broker_deduplicates=broker_probe.kind == "nats"
    )


def test_in_stores_each_message_once_even_when_the_broker_holds_it_twice(
    dsn: str, broker_probe: Probe
) -> None:
    source = unique("in")
    items = [(f"m-{n}", body_of(n)) for n in range(150)]
    again = items[:30]  # the same message ids published a second time

    async def scenario() -> None:
        await broker_probe.prepare_in(source)
        async with AsyncBroker(dsn) as abroker:
            await abroker.create_queue("inbox")
            settings = InboundSettings(batch_size=50, declare=True, ack_wait=5)
            bridge = InboundBridge(abroker, None, "inbox", broker_probe.url(source), settings)
            task = asyncio.create_task(bridge.run())
            try:
                async with asyncio.timeout(20):
                    await bridge.receiving.wait()  # MQTT keeps messages only for subscriptions
                await broker_probe.publish(source, items)
                await broker_probe.publish(source, again)

                # A JetStream stream drops a second publish of a Nats-Msg-Id itself (within its
                # duplicate window): the bridge never sees those copies.
                copies = 0 if broker_probe.kind == "nats" else len(again)

                async def all_seen() -> bool:
                    return bridge.stats.received + bridge.stats.duplicates >= len(items) + copies

                await until(all_seen, [task])
                await asyncio.sleep(0.5)  # any further copy would come now
            finally:
                bridge.stop()
                await task
            assert bridge.stats.received == 150
            if broker_probe.kind == "sqs":
                # SQS hands a message out again when its visibility timeout runs out before the
                # delete arrives (a loaded machine, a slow endpoint): more copies, none stored.
                assert bridge.stats.duplicates >= copies
            else:
                assert bridge.stats.duplicates == copies

    asyncio.run(scenario())
    with Broker(dsn) as broker, broker.connection() as conn:
        rows: list[Any] = conn.execute("SELECT message, headers FROM pgmq.q_inbox").fetchall()
    assert sorted(m["n"] for m, _ in rows) == list(range(150))
    prefix = f"x-{broker_probe.kind}-"
    assert all(f"{prefix}received" in h for _, h in rows)


def test_a_broker_that_is_not_there_is_reported_at_once(dsn: str, broker_probe: Probe) -> None:
    nowhere = broker_probe.url("x").replace(f":{broker_probe.port}", f":{free_port()}")  # type: ignore[attr-defined]

    async def scenario() -> None:
        async with AsyncBroker(dsn) as abroker:
            await abroker.create_queue("outbox")
            settings = OutboundSettings(connect_timeout=2)
            with pytest.raises(BrokerUnreachable, match="cannot reach"):
                await OutboundBridge(abroker, "outbox", nowhere, settings).run()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "url",
    [
        "redis://h?nope=1",
        "nats://h?subject=a&subject=b",
        "mqtt://h#frag",
        "sqs://us-east-1/q?endpoint=ftp://x",
    ],
)
def test_bad_urls_are_refused_before_connecting(url: str) -> None:
    async def scenario() -> None:
        with pytest.raises(InvalidArgument):
            OutboundBridge(AsyncBroker("postgresql://nowhere"), "outbox", url)

    asyncio.run(scenario())


def test_an_unknown_scheme_names_the_known_ones() -> None:
    with pytest.raises(InvalidArgument, match="redis://"):
        OutboundBridge(AsyncBroker("postgresql://nowhere"), "outbox", "kafka://h:9092")


@pytest.mark.redis
def test_redis_inbound_without_declare_needs_the_consumer_group(dsn: str) -> None:
    base = scratch_dir("pgbroker-redis-")
    node = PrivateServer(KINDS["redis"], base)
    node.start()
    try:

        async def scenario() -> None:
            async with AsyncBroker(dsn) as abroker:
                await abroker.create_queue("inbox")
                url = f"redis://127.0.0.1:{node.port}?stream=s1&group=g1"
                with pytest.raises(BrokerNotFound, match="XGROUP CREATE s1 g1"):
                    await InboundBridge(abroker, None, "inbox", url).run()

        asyncio.run(scenario())
    finally:
        node.close()


@pytest.mark.mqtt
def test_an_mqtt_publish_no_subscriber_matched_is_retried_then_dead_lettered(dsn: str) -> None:
    base = scratch_dir("pgbroker-mqtt-")
    node = PrivateServer(KINDS["mqtt"], base)
    node.start()
    try:
        with Broker(dsn) as broker:
            outbox = broker.create_queue("outbox")
            broker.create_queue("outbox_dlq")
            outbox.set_policy(
                max_deliveries=2, backoff="fixed", backoff_base_seconds=0, dead_letter_queue="outbox_dlq"
            )
            outbox.send({"n": 1})

        async def scenario() -> None:
            async with AsyncBroker(dsn) as abroker:
                url = f"mqtt://127.0.0.1:{node.port}?topic=nobody/listens"
                bridge = OutboundBridge(abroker, "outbox", url)
                task = asyncio.create_task(bridge.run())

                async def dead() -> bool:
                    return (await abroker.metrics("outbox_dlq")).queue_length == 1

                try:
                    await until(dead, [task])
                finally:
                    bridge.stop()
                    await task
                assert (bridge.stats.published, bridge.stats.retried, bridge.stats.dead_lettered) == (0, 1, 1)

        asyncio.run(scenario())
        with Broker(dsn) as broker, broker.connection() as conn:
            row = conn.execute("SELECT headers FROM pgmq.q_outbox_dlq").fetchone()
        assert row is not None
        headers = row[0]
        assert (
            "no MQTT subscriber matched topic 'nobody/listens'" in headers["x-pgbroker-dead-letter"]["error"]
        )
    finally:
        node.close()


def test_a_missing_client_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # as if redis-py were not installed
    monkeypatch.delitem(sys.modules, "pgbroker.bridge.connectors.redis_streams", raising=False)
    # Imported by an earlier test.
    monkeypatch.delattr("pgbroker.bridge.connectors.redis_streams", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"redis:// bridge needs redis .*pgbroker\[bridge\]"):
        OutboundBridge(AsyncBroker("postgresql://nowhere"), "outbox", "redis://127.0.0.1:6379")


def test_the_cli_takes_a_url_and_refuses_mixed_forms(dsn: str) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pgbroker.cli", "bridge", *args, "--dsn", dsn],
            capture_output=True,
            text=True,
            timeout=30,
        )

    with Broker(dsn) as broker:
        broker.create_queue("q")
    unknown = run("out", "--queue", "q", "--to", "kafka://127.0.0.1:9092")
    assert unknown.returncode == 2
    assert "no bridge connector for kafka://" in unknown.stderr
    both = run("in", "--from", "redis://127.0.0.1:1", "--amqp", "amqp://x", "--queue", "q")
    assert both.returncode == 2
    assert "--amqp is not needed" in both.stderr
    nowhere = run("out", "--queue", "q", "--to", f"redis://127.0.0.1:{free_port()}")
    assert nowhere.returncode == 6
    assert "cannot reach Redis" in nowhere.stderr


@pytest.mark.sqs
def test_to_an_sqs_fifo_queue_the_fifo_group_is_the_message_group_and_order_holds_per_group(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    node = PrivateServer(KINDS["sqs"], scratch_dir("pgbroker-sqs-"))
    node.start()
    try:
        check = probe("sqs", node.port)
        for key, value in check.env.items():
            monkeypatch.setenv(key, value)
        with Broker(dsn) as broker:
            queue = broker.create_queue("outbox")
            groups = [{"x-pgmq-group": f"g{n % 2}"} for n in range(20)]
            ids = queue.send_many([{"n": n} for n in range(20)], headers=groups)

        async def scenario() -> None:
            async with AsyncBroker(dsn) as abroker:
                settings = OutboundSettings(declare=True, batch_size=7, windows=1)  # order: one window
                bridge = OutboundBridge(abroker, "outbox", check.url("orders.fifo"), settings)
                task = asyncio.create_task(bridge.run())

                async def empty() -> bool:
                    return (await abroker.metrics("outbox")).queue_length == 0

                try:
                    await until(empty, [task])
                finally:
                    bridge.stop()
                    await task

        asyncio.run(scenario())
        client = boto3.client("sqs", endpoint_url=f"http://127.0.0.1:{node.port}", region_name="us-east-1")
        url = client.get_queue_url(QueueName="orders.fifo")["QueueUrl"]
        got: list[tuple[str, int, str]] = []
        while len(got) < 20:
            reply = client.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"], WaitTimeSeconds=1
            )
            messages = reply.get("Messages", [])
            assert messages, f"only {len(got)} of 20 came"
            for m in messages:
                attributes = m["Attributes"]
                got.append(
                    (
                        attributes["MessageGroupId"],
                        json.loads(m["Body"])["n"],
                        attributes["MessageDeduplicationId"],
                    )
                )
                client.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        assert {g for g, _, _ in got} == {"g0", "g1"}
        for group in ("g0", "g1"):
            ns = [n for g, n, _ in got if g == group]
            assert ns == sorted(ns), f"order within {group}"
            assert all((n % 2 == 0) == (group == "g0") for n in ns)
        assert sorted(msg_id_of(d) for _, _, d in got) == sorted(ids), "the identity is the deduplication id"
    finally:
        node.close()
