"""Benchmark of the bridges: outbound msg/s with confirms, and inbound msg/s with acks after the
commit, for every connector in one run (RabbitMQ, Redis Streams, NATS JetStream, MQTT, SQS).

Every connector but RabbitMQ runs against a private server the bench starts on a loopback port
(tests/support/servers.py: redis-server with appendfsync always, nats-server -js with a file
store, mosquitto with persistence, moto's SQS server), and sets it up and reads it through the
tests' own clients (tests/support/probes.py). Their outbound run is as RabbitMQ's below; their
inbound run has the messages waiting in the broker first (MQTT: in the bridge's persistent
session, made by a first connection), then times one InboundBridge writing them all. SQS runs
over a twentieth of the messages (at most 500): moto slows down as a queue grows, so its figures
are moto's, not Amazon's.

Outbound: --messages messages are sent to a pgbroker queue first, then one OutboundBridge
publishes them to a durable RabbitMQ queue (persistent, mandatory, confirmed) and acks them in
Postgres (archived with their publish records); msg/s runs from the bridge's start to the last
ack. It runs with the default windows (--batch messages each, two in flight) and, for scale,
with confirms one at a time (batch 1, one window) over a tenth of the messages.

Inbound: --messages messages (each with a message_id) wait in a RabbitMQ queue, then one
InboundBridge writes them to a pgbroker queue (de-duplication on) and acks them; msg/s runs
from its start to the last write.

    python -m bench.bridge_bench [--dsn DSN] [--amqp URL] [--messages 30000] [--batch 500]
                                 [--connectors amqp,redis,nats,mqtt,sqs]

Without --dsn the DSN comes from DATABASE_URL, else the embedded cluster is used; without
--amqp, $PGBROKER_AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/. The benchmark's queues are
deleted at the end. Bounded: about 40 seconds on this machine. It sets up RabbitMQ with aiormq
(the dev extra, as the tests do), independently of the bridge's own client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiormq
from pamqp.commands import Basic
from tests.support.postgres import scratch_dir
from tests.support.probes import Probe, probe, unique
from tests.support.servers import KINDS, PrivateServer

from bench.notify_latency import settings
from pgbroker import Broker
from pgbroker._db.dsn import resolve_dsn
from pgbroker.bridge import InboundBridge, InboundSettings, OutboundBridge, OutboundSettings
from pgbroker.queues._client_async import AsyncBroker

DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672/"
TARGET_OUTBOUND = 5_000  # msg/s with confirms
PAYLOAD = {"order": 12345, "customer": "c-42", "items": [1, 2, 3], "pad": "x" * 64}


async def _until(done: Callable[[], Awaitable[bool]], bridge: OutboundBridge | InboundBridge) -> float:
    """Seconds from the bridge's start until done()."""
    started = time.perf_counter()
    task = asyncio.create_task(bridge.run())
    try:
        while not await done():
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        return time.perf_counter() - started
    finally:
        bridge.stop()
        await task


async def outbound(
    dsn: str, amqp: str, queue: str, messages: int, batch: int, windows: int
) -> tuple[float, float]:
    """Confirmed msg/s of one bridge draining ``messages`` from ``queue``, and the CPU time this
    process spent per message (microseconds): the bridge's cost, whatever else the machine runs."""
    with Broker(dsn, max_connections=1) as broker:
        outbox = broker.create_queue(queue)
        for start in range(0, messages, 1000):
            outbox.send_many([PAYLOAD] * min(1000, messages - start))
    connection = await aiormq.connect(amqp)
    channel = await connection.channel()
    target = f"{queue}_sink"
    await channel.queue_declare(target, durable=True)
    try:
        async with AsyncBroker(dsn, max_connections=4) as abroker:
            config = OutboundSettings(routing_key=target, batch_size=batch, windows=windows)
            bridge = OutboundBridge(abroker, queue, amqp, config)

            async def drained() -> bool:
                return (await abroker.metrics(queue)).queue_length == 0

            cpu = time.process_time()
            seconds = await _until(drained, bridge)
            cpu = time.process_time() - cpu
            assert bridge.stats.published == messages, bridge.stats
    finally:
        await channel.queue_delete(target)
        await connection.close()
        with Broker(dsn, max_connections=1) as broker:
            broker.drop_queue(queue)
    return messages / seconds, cpu / messages * 1e6


async def inbound(dsn: str, amqp: str, queue: str, messages: int, batch: int) -> float:
    """Received msg/s of one bridge writing ``messages`` into ``queue``."""
    with Broker(dsn, max_connections=1) as broker:
        broker.create_queue(queue)
    source = f"{queue}_source"
    connection = await aiormq.connect(amqp)
    channel = await connection.channel(publisher_confirms=False)
    await channel.queue_declare(source, durable=True)
    body = json.dumps(PAYLOAD).encode()
    for i in range(messages):
        props = Basic.Properties(message_id=f"bench-{i}", delivery_mode=2, content_type="application/json")
        await channel.basic_publish(body, routing_key=source, properties=props)
    while (await channel.queue_declare(source, passive=True)).message_count != messages:
        await asyncio.sleep(0.05)  # unconfirmed publishes: wait until RabbitMQ has them all
    try:
        async with AsyncBroker(dsn, max_connections=4) as abroker:
            bridge = InboundBridge(abroker, source, queue, amqp, InboundSettings(batch_size=batch))

            async def received() -> bool:
                return bridge.stats.received >= messages

            seconds = await _until(received, bridge)
    finally:
        await channel.queue_delete(source)
        await connection.close()
        with Broker(dsn, max_connections=1) as broker:
            broker.drop_queue(queue)
    return messages / seconds


async def connector_outbound(dsn: str, check: Probe, queue: str, messages: int, batch: int) -> float:
    """Confirmed msg/s of one bridge publishing ``messages`` to a private broker."""
    with Broker(dsn, max_connections=1) as broker:
        outbox = broker.create_queue(queue)
        for start in range(0, messages, 1000):
            outbox.send_many([PAYLOAD] * min(1000, messages - start))
    target = unique("bench")
    await check.prepare_out(target)
    try:
        async with AsyncBroker(dsn, max_connections=4) as abroker:
            bridge = OutboundBridge(abroker, queue, check.url(target), OutboundSettings(batch_size=batch))

            async def drained() -> bool:
                return (await abroker.metrics(queue)).queue_length == 0

            seconds = await _until(drained, bridge)
            assert bridge.stats.published == messages, bridge.stats
    finally:
        with Broker(dsn, max_connections=1) as broker:
            broker.drop_queue(queue)
    return messages / seconds


async def connector_inbound(dsn: str, check: Probe, queue: str, messages: int, batch: int) -> float:
    """Received msg/s of one bridge writing ``messages`` waiting in a private broker."""
    with Broker(dsn, max_connections=1) as broker:
        broker.create_queue(queue)
    source = unique("bench")
    await check.prepare_in(source)
    url = check.url(source)
    settings = InboundSettings(batch_size=batch, declare=True)
    body = json.dumps(PAYLOAD).encode()
    try:
        async with AsyncBroker(dsn, max_connections=4) as abroker:
            if check.kind == "mqtt":  # a first connection makes the session that keeps the messages
                first = InboundBridge(abroker, None, queue, url, settings)
                task = asyncio.create_task(first.run())
                await first.receiving.wait()
                first.stop()
                await task
            for start in range(0, messages, 1000):
                await check.publish(
                    source, [(f"b-{i}", body) for i in range(start, min(messages, start + 1000))]
                )
            bridge = InboundBridge(abroker, None, queue, url, settings)

            async def received() -> bool:
                return bridge.stats.received >= messages

            seconds = await _until(received, bridge)
    finally:
        with Broker(dsn, max_connections=1) as broker:
            broker.drop_queue(queue)
    return messages / seconds


async def connectors(dsn: str, kinds: list[str], messages: int, batch: int) -> dict[str, Any]:
    """{kind_out: msg/s, kind_in: msg/s, ...} against private servers, one after the other."""
    result: dict[str, Any] = {}
    for kind in kinds:
        node = PrivateServer(KINDS[kind], scratch_dir(f"pgbroker-bench-{kind}-"))
        node.start()
        count = min(500, messages // 20) if kind == "sqs" else messages
        check = probe(kind, node.port)
        os.environ.update(check.env)
        prefix = f"bench_{kind}_{uuid.uuid4().hex[:6]}"
        try:
            result[f"{kind}_messages"] = count
            result[f"{kind}_out_msgs_per_s"] = round(
                await connector_outbound(dsn, check, f"{prefix}_out", count, batch)
            )
            result[f"{kind}_in_msgs_per_s"] = round(
                await connector_inbound(dsn, check, f"{prefix}_in", count, batch)
            )
        finally:
            node.close()
    return result


async def run(
    dsn: str, amqp: str, messages: int, batch: int, windows: int, outbound_only: bool
) -> dict[str, Any]:
    prefix = f"bench_bridge_{uuid.uuid4().hex[:8]}"
    windowed, cpu_us = await outbound(dsn, amqp, f"{prefix}_out", messages, batch, windows)
    result = {
        "bench": "bridge",
        "messages": messages,
        "batch": batch,
        "windows": windows,
        "outbound_msgs_per_s": round(windowed),
        "outbound_cpu_us_per_msg": round(cpu_us),
    }
    if not outbound_only:
        one_by_one, _ = await outbound(dsn, amqp, f"{prefix}_one", max(100, messages // 10), 1, windows=1)
        result["outbound_one_by_one_msgs_per_s"] = round(one_by_one)
        result["inbound_msgs_per_s"] = round(await inbound(dsn, amqp, f"{prefix}_in", messages, batch))
    return result


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--dsn", help="server to use (default: DATABASE_URL, else the embedded cluster)")
    parser.add_argument("--amqp", help=f"RabbitMQ (default: $PGBROKER_AMQP_URL, else {DEFAULT_AMQP})")
    parser.add_argument("--messages", type=int, default=30_000, help="messages per direction (30000)")
    parser.add_argument("--batch", type=int, default=500, help="messages per window / batch (500)")
    parser.add_argument("--windows", type=int, default=2, help="outbound windows in flight (2)")
    parser.add_argument("--outbound-only", action="store_true", help="RabbitMQ: skip the inbound run")
    parser.add_argument(
        "--connectors", default="amqp,redis,nats,mqtt,sqs", help="which to run (amqp,redis,nats,mqtt,sqs)"
    )
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.connectors.split(",") if k.strip()]
    unknown = sorted(set(kinds) - {"amqp", *KINDS})
    if unknown:
        parser.error(f"unknown connectors: {', '.join(unknown)}")
    dsn = resolve_dsn(args.dsn)
    amqp = args.amqp or os.environ.get("PGBROKER_AMQP_URL") or DEFAULT_AMQP
    with Broker(dsn, max_connections=1) as broker:
        broker.install()
    print(settings(dsn))
    size = len(json.dumps(PAYLOAD))
    if "amqp" in kinds:
        result = asyncio.run(run(dsn, amqp, args.messages, args.batch, args.windows, args.outbound_only))
        print(f"\nRabbitMQ bridge, {args.messages:,} messages of {size} B, persistent, to a durable queue")
        rows = [
            (f"outbound, confirms in windows of {args.batch} x{args.windows}", "outbound_msgs_per_s"),
            ("outbound, confirms one at a time", "outbound_one_by_one_msgs_per_s"),
            (f"inbound, batches of {args.batch}", "inbound_msgs_per_s"),
        ]
        print(f"{'direction':<40}{'msg/s':>10}")
        for name, key in rows:
            if key in result:
                print(f"{name:<40}{result[key]:>10,}")
        cpu = result["outbound_cpu_us_per_msg"]
        print(f"outbound bridge CPU per message: {cpu} us (load average {_load()})")
        met = result["outbound_msgs_per_s"] >= TARGET_OUTBOUND
        print(f"target outbound >= {TARGET_OUTBOUND:,} msg/s with confirms: {'met' if met else 'MISSED'}")
        print(json.dumps(result))
    others = [k for k in kinds if k != "amqp"]
    if others:
        found = asyncio.run(connectors(dsn, others, args.messages, args.batch))
        print(
            f"\nOther connectors, messages of {size} B, batches of {args.batch}, private servers on loopback"
        )
        print(f"{'connector':<12}{'messages':>10}{'out msg/s':>12}{'in msg/s':>12}")
        for kind in others:
            out, into = found[f"{kind}_out_msgs_per_s"], found[f"{kind}_in_msgs_per_s"]
            print(f"{kind:<12}{found[f'{kind}_messages']:>10,}{out:>12,}{into:>12,}")
        print(f"(load average {_load()})")
        print(json.dumps({"bench": "bridge_connectors", **found}))


if __name__ == "__main__":
    main()
