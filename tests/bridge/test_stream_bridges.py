"""Streams bridged out and in, against real servers (RabbitMQ, a private Redis): a stream read by
a consumer group is published, each message once with "<stream>:<partition>:<id>" as message id
and its key, in order per key, and the group advanced past it; received into another stream, each
message is appended once with its key, even when the broker holds it twice. The chaos test
SIGKILLs both bridges (processes) mid-run: nothing is lost, the broker gets duplicates only of
the killed batch (recognisable by message id), the target stream holds each message once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from pgbroker import Broker, codecs
from pgbroker.bridge import InboundSettings, OutboundSettings
from pgbroker.bridge.core.inbound import StreamInboundBridge
from pgbroker.bridge.core.stream_outbound import StreamOutboundBridge, stream_out_message
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.queues._records import message_identity
from pgbroker.streams._client import Stream
from pgbroker.streams._client_async import AsyncStream
from tests.support.bridge_processes import BridgeProcess, wait_for
from tests.support.probes import RedisProbe, unique
from tests.support.rabbit import Rabbit
from tests.support.servers import PrivateServer
from tests.support.services import service_params

JSON = "application/json"
KEYS = [f"k{n}" for n in range(8)]
SOURCE, TARGET, GROUP = "orders", "mirror", "bridge"

# A broker's (out URL, in URL) and a way to publish an item (message id, body, key) into it.
Publish = Callable[[str, bytes, str], Any]


@pytest.fixture
def processes() -> Iterator[list[BridgeProcess]]:
    """The test's bridge processes; any still running at its end (a failed test) is killed."""
    started: list[BridgeProcess] = []
    yield started
    for process in started:
        if process.process.poll() is None:
            process.kill()


@asynccontextmanager
async def on_rabbitmq(amqp: str) -> AsyncIterator[tuple[str, str, Publish]]:
    async with Rabbit(amqp) as rabbit:
        name = await rabbit.queue()

        async def publish(message_id: str, body: bytes, key: str) -> None:
            headers = {"x-pgmq-group": key}
            await rabbit.publish(name, body, message_id=message_id, headers=headers, content_type=JSON)

        yield f"{amqp}?routing_key={name}", f"{amqp}?queue={name}", publish


@asynccontextmanager
async def on_redis(port: int) -> AsyncIterator[tuple[str, str, Publish]]:
    name = unique("stream")
    url = f"redis://127.0.0.1:{port}?stream={name}"

    async def publish(message_id: str, body: bytes, key: str) -> None:
        import redis.asyncio

        client = redis.asyncio.Redis(host="127.0.0.1", port=port)
        try:
            fields = {"body": body, "content_type": JSON, "message_id": message_id, "key": key}
            await client.xadd(name, fields)  # type: ignore[arg-type]
        finally:
            await client.aclose()

    yield url, url, publish


def keyed_messages(count: int) -> tuple[list[Any], list[str]]:
    """``count`` messages over KEYS; every tenth a MessagePack envelope (codecs through streams)."""
    messages: list[Any] = []
    for n in range(count):
        value = {"n": n, "key": KEYS[n % len(KEYS)]}
        messages.append(codecs.to_stored(value, "msgpack") if n % 10 == 0 else value)
    return messages, [KEYS[n % len(KEYS)] for n in range(count)]


def value_of(stored: Any) -> dict[str, Any]:
    value: dict[str, Any] = codecs.from_stored(stored).value
    return value


def assert_in_order_per_key(rows: list[tuple[str | None, Any]]) -> None:
    """rows: (key, stored message) in stream order; each key's n must increase, first copies only."""
    seen: set[int] = set()
    last: dict[str | None, int] = defaultdict(lambda: -1)
    for key, stored in rows:
        value = value_of(stored)
        if value["n"] in seen:
            continue
        seen.add(value["n"])
        assert key == value["key"], f"message {value['n']} came with key {key!r}"
        assert value["n"] > last[key], f"key {key}: {value['n']} after {last[key]}"
        last[key] = value["n"]


@pytest.mark.parametrize("where", service_params("rabbitmq", "redis"))
def test_a_stream_goes_out_and_comes_back_in_once_per_message_in_order_per_key(
    dsn: str, where: str, request: pytest.FixtureRequest
) -> None:
    count = 300
    messages, keys = keyed_messages(count)
    with Broker(dsn) as broker:
        source = Stream(broker, SOURCE)
        source.create(partitions=4)
        source.create_group(GROUP, start="start")
        Stream(broker, TARGET).create(partitions=4)
        ids = source.send_many(messages, keys=keys, headers=[{"tenant": "t1"}] * count)
    urls = (
        on_rabbitmq(request.getfixturevalue("amqp"))
        if where == "rabbitmq"
        else on_redis(request.getfixturevalue("redis_server").port)
    )

    async def scenario() -> None:
        async with urls as (out_url, in_url, publish), AsyncBroker(dsn) as abroker:
            inbound = StreamInboundBridge(abroker, None, TARGET, in_url, InboundSettings(declare=True))
            outbound = StreamOutboundBridge(abroker, SOURCE, GROUP, out_url, OutboundSettings(batch_size=64))
            tasks = [asyncio.create_task(inbound.run())]
            try:
                async with asyncio.timeout(20):
                    await inbound.receiving.wait()
                tasks.append(asyncio.create_task(outbound.run()))
                async with asyncio.timeout(60):
                    while inbound.stats.received < count:
                        for task in tasks:
                            if task.done():
                                task.result()
                        await asyncio.sleep(0.05)
                # The broker holds three of them a second time (same message ids): appended once.
                with Broker(dsn) as broker, broker.connection() as conn:
                    again = conn.execute(
                        "SELECT id, partition, key, message, enqueued_at FROM pgbroker.s_orders"
                        " ORDER BY id LIMIT 3"
                    ).fetchall()
                for msg_id, partition, key, stored, enqueued_at in again:
                    data, _ = codecs.wire_body(stored)
                    await publish(message_identity(f"{SOURCE}:{partition}:{msg_id}", enqueued_at), data, key)
                async with asyncio.timeout(20):
                    while inbound.stats.duplicates < 3:
                        await asyncio.sleep(0.05)
            finally:
                outbound.stop()
                inbound.stop()
                await asyncio.gather(*tasks)
            assert (outbound.stats.published, outbound.stats.retried, outbound.stats.stale) == (count, 0, 0)
            assert (inbound.stats.received, inbound.stats.duplicates) == (count, 3)
            groups = await AsyncStream(abroker, SOURCE).groups()
            assert [(g.name, g.lag) for g in groups] == [(GROUP, 0)]  # the group advanced past all

    asyncio.run(scenario())
    with Broker(dsn) as broker, broker.connection() as conn:
        rows = conn.execute("SELECT key, message, headers FROM pgbroker.s_mirror ORDER BY id").fetchall()
    assert sorted(value_of(m)["n"] for _, m, _ in rows) == list(range(count))
    assert_in_order_per_key([(k, m) for k, m, _ in rows])
    # Bodies as they were stored (envelopes byte for byte).
    by_n = {value_of(m)["n"]: m for _, m, _ in rows}
    assert all(by_n[n] == messages[n] for n in range(count))
    assert len(ids) == count


def test_the_cli_refuses_a_stream_without_a_group(dsn: str) -> None:
    command = [sys.executable, "-m", "pgbroker.cli", "bridge", "out", "--stream", "s", "--to", "redis://h"]
    done = subprocess.run(
        [*command, "--dsn", dsn],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "--stream needs --group" in done.stderr


@pytest.mark.slow
def test_sigkilled_stream_bridges_lose_nothing_and_duplicate_only_the_killed_batch(
    dsn: str, redis_server: PrivateServer, processes: list[BridgeProcess], tmp_path: Path
) -> None:
    count, batch = 3000, 50
    messages, keys = keyed_messages(count)
    with Broker(dsn) as broker:
        source = Stream(broker, SOURCE)
        source.create(partitions=4)
        source.create_group(GROUP, start="start")
        Stream(broker, TARGET).create(partitions=4)
        ids = source.send_many(messages, keys=keys)
    expected = {f"{SOURCE}:{p}:{i}" for p, i in partitions_of(dsn, ids)}
    name = unique("chaos")
    url = f"redis://127.0.0.1:{redis_server.port}?stream={name}"
    probe = RedisProbe(redis_server.port)
    out = ["bridge", "out", "--stream", SOURCE, "--group", GROUP, "--to", url, "--consumer", "out-1"]
    out += ["--batch-size", str(batch)]
    into = ["bridge", "in", "--from", url, "--stream", TARGET, "--declare", "--batch-size", str(batch)]

    def start(options: list[str]) -> BridgeProcess:
        process = BridgeProcess(*options, dsn=dsn, logs=tmp_path, env={})
        processes.append(process)
        wait_for(process.started, "bridge started", 30)
        return process

    def broker_count() -> int:
        import redis

        client = redis.Redis(host="127.0.0.1", port=redis_server.port)
        try:
            return int(client.xlen(name))
        finally:
            client.close()

    def mirrored() -> int:
        with Broker(dsn) as broker, broker.connection() as conn:
            row = conn.execute("SELECT count(*) FROM pgbroker.s_mirror").fetchone()
        return int(row[0]) if row else 0

    receiver = start(into)
    sender = start(out)
    wait_for(lambda: broker_count() >= 0.3 * count, "30 % published", 60)
    sender.kill()  # mid-run: its batch in hand may be published and not acked
    sender = start(out)  # the same consumer name: it rewinds and takes its partitions back at once
    wait_for(lambda: mirrored() >= 0.5 * count, "50 % received", 60)
    receiver.kill()  # mid-batch: written and not acked, or not written
    receiver = start(into)
    wait_for(lambda: mirrored() >= count and broker_count() >= count, "everything through", 120)
    time.sleep(1)  # any extra copy would come now
    for process in (sender, receiver):
        code, log = process.stop()
        assert code == 0, log

    entries = asyncio.run(probe.published(name, expect=count))
    copies = Counter(message_id for message_id, _ in entries)
    positions = {str(message_id).partition("@")[0] for message_id in copies}
    assert positions == expected, "every message published, with its stream position in its id"
    assert len(copies) == count, "one id a message"
    duplicated = [m for m, n in copies.items() if n > 1]
    assert len(duplicated) <= batch, f"{len(duplicated)} duplicates: more than the killed batch"
    assert all(n == 2 for n in copies.values() if n > 1)
    with Broker(dsn) as broker, broker.connection() as conn:
        rows = conn.execute("SELECT key, message FROM pgbroker.s_mirror ORDER BY id").fetchall()
        lag = conn.execute("SELECT lag FROM pgbroker.stream_groups(%s)", (SOURCE,)).fetchall()
    assert sorted(value_of(m)["n"] for _, m in rows) == list(range(count)), "each message once"
    assert_in_order_per_key(rows)
    assert lag == [(0,)]
    print(f"stream chaos: {count} messages, {len(duplicated)} published twice (the killed batch)")


def partitions_of(dsn: str, ids: list[int]) -> list[tuple[int, int]]:
    with Broker(dsn) as broker, broker.connection() as conn:
        query = "SELECT partition, id FROM pgbroker.s_orders WHERE id = ANY(%s)"
        rows = conn.execute(query, (ids,)).fetchall()
    return [(int(p), int(i)) for p, i in rows]


def test_a_stream_id_reissued_after_a_failover_goes_out_with_a_new_message_id(dsn: str) -> None:
    """A failover that lost the tail of the WAL loses appended messages with their ids (and the
    group's acks of them): the new primary appends other messages under the same ids. Their
    message ids out must differ; a message read again (rewound) keeps its own."""
    with Broker(dsn) as broker:
        stream = Stream(broker, "ids")
        stream.create(partitions=1)
        stream.create_group("out", start="start")
        consumer = stream.consumer("out", name="bridge")
        lost = stream.send({"n": "lost"})
        first = consumer.read(10)
        [lost_out] = [stream_out_message(m) for m in first]
        consumer.ack(first)
        with broker.connection() as conn:  # the new primary's state
            conn.execute("DELETE FROM pgbroker.s_ids WHERE id >= %s", (lost,))
            conn.execute("SELECT setval('pgbroker.s_ids_seq', %s, false)", (lost,))
            conn.execute(
                "SELECT pgbroker._stream_positions_append(stream_name, group_name, array_agg(partition),"
                " array_fill(%s - 1, ARRAY[count(*)::int]), array_fill(%s - 1, ARRAY[count(*)::int]),"
                " array_fill(NULL::timestamptz, ARRAY[count(*)::int]))"
                " FROM pgbroker.stream_cursor GROUP BY stream_name, group_name",
                (lost, lost),
            )
            conn.execute("SELECT pgbroker._stream_watermark_append('ids', %s - 1, NULL, NULL)", (lost,))
        assert stream.send({"n": "new"}) == lost
        [new_out] = [stream_out_message(m) for m in consumer.read(10)]
        consumer.rewind()  # as after a lost connection: the batch is handed out again
        [again_out] = [stream_out_message(m) for m in consumer.read(10)]
    assert lost_out.message_id != new_out.message_id
    assert new_out.message_id == again_out.message_id
    assert new_out.message_id.startswith(f"ids:0:{lost}@")
