"""Benchmark of the RabbitMQ bridge: outbound msg/s with publisher confirms, and inbound msg/s.

Outbound: --messages messages are sent to a pgbroker queue first, then one OutboundBridge
publishes them to a durable RabbitMQ queue (persistent, mandatory, confirmed) and acks them in
Postgres (archived with their publish records); msg/s runs from the bridge's start to the last
ack. It runs with the default windows (--batch messages each, two in flight) and, for scale,
with confirms one at a time (batch 1, one window) over a tenth of the messages.

Inbound: --messages messages (each with a message_id) wait in a RabbitMQ queue, then one
InboundBridge writes them to a pgbroker queue (de-duplication on) and acks them; msg/s runs
from its start to the last write.

    python -m bench.bridge_bench [--dsn DSN] [--amqp URL] [--messages 30000] [--batch 500]

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

from bench.notify_latency import settings
from pgbroker import Broker
from pgbroker.aio import AsyncBroker
from pgbroker.bridge import InboundBridge, InboundSettings, OutboundBridge, OutboundSettings
from pgbroker.dsn import resolve_dsn

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
    parser.add_argument("--outbound-only", action="store_true", help="skip the inbound run")
    args = parser.parse_args(argv)
    dsn = resolve_dsn(args.dsn)
    amqp = args.amqp or os.environ.get("PGBROKER_AMQP_URL") or DEFAULT_AMQP
    with Broker(dsn, max_connections=1) as broker:
        broker.install()
    print(settings(dsn))
    result = asyncio.run(run(dsn, amqp, args.messages, args.batch, args.windows, args.outbound_only))
    size = len(json.dumps(PAYLOAD))
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
    print(f"outbound bridge CPU per message: {result['outbound_cpu_us_per_msg']} us (load average {_load()})")
    met = result["outbound_msgs_per_s"] >= TARGET_OUTBOUND
    print(f"target outbound >= {TARGET_OUTBOUND:,} msg/s with confirms: {'met' if met else 'MISSED'}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
