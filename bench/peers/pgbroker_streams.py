"""pgbroker's streams (docs/streams.md) with their worker runtime: one group, one StreamWorker.

A "queue" here is a stream with one consumer group that starts at the beginning. Defaults: the
StreamWorker's (batches of 100, one partition at a time); tuned, per docs/streams.md's sizing:
batches of 1,000 and the stream's four partitions handled at once. Every stream notifies, so an
idle consumer wakes on a send (streams.md: leave it off for many concurrent producers; the
steady step has one).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from bench.peers import Handle, Peer, Send
from bench.peers.keyed import KeyedHandle, KeyedSend
from bench.peers.pgbroker_queues import serve_until
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.runtime._stream_worker import StreamWorker
from pgbroker.streams._client_async import AsyncStream
from pgbroker.streams._records import StreamMessage

GROUP = "bench"
PARTITIONS = 4
TUNED_BATCH = 1_000


class PgbrokerStreams(Peer):
    key = "pgbroker streams"
    database = "pgbroker_bench_peer_streams"

    def describe(self, tuned: bool) -> str:
        if tuned:
            return (
                f"StreamWorker(batch_size={TUNED_BATCH}, concurrency={PARTITIONS}), {PARTITIONS} partitions"
            )
        return f"StreamWorker() (batch_size=100, concurrency=1), {PARTITIONS} partitions"

    async def install(self, dsn: str) -> None:
        async with AsyncBroker(dsn, max_connections=1) as broker:
            await broker.install()

    async def create(self, dsn: str, queue: str, tuned: bool) -> None:
        async with AsyncBroker(dsn, max_connections=1) as broker:
            stream = AsyncStream(broker, queue)
            await stream.create(partitions=PARTITIONS, notify=True)
            await stream.create_group(GROUP, start="start")

    @asynccontextmanager
    async def sender(self, dsn: str, queue: str) -> AsyncIterator[Send]:
        async with AsyncBroker(dsn, max_connections=1) as broker:
            stream = AsyncStream(broker, queue)

            async def send(payloads: list[dict[str, Any]]) -> None:
                await stream.send_many(payloads)

            yield send

    async def work(self, dsn: str, queue: str, handle: Handle, stop: asyncio.Event, tuned: bool) -> None:
        async def handler(message: StreamMessage) -> None:
            handle(message.message)

        options: dict[str, Any] = {"batch_size": TUNED_BATCH, "concurrency": PARTITIONS} if tuned else {}
        worker = StreamWorker(queue, GROUP, handler, **options)
        await serve_until(dsn, worker, stop)

    async def remaining(self, dsn: str, queue: str) -> int:
        async with AsyncBroker(dsn, max_connections=1) as broker:
            return sum(partition.lag for partition in await AsyncStream(broker, queue).lag())


class PgbrokerStreamGroup:
    """The keyed stream shape of scenario (h) (bench.stream_pgq): one group, one StreamWorker with
    ``concurrency=W`` and batches of TUNED_BATCH over a stream of PARTITIONS partitions, each
    message sent with its key. The batch is the top of docs/streams.md's range ("Sizing": larger
    batches go faster), as PgQ's batches are a tick's worth (hundreds to a thousand and more
    events at these rates); ``max(100, 4 W)`` (bench.stream_workers_bench) gave the stream group
    0.5-0.75x PgQ at W = 16 and 0.6-0.85x at W = 64 here, against 0.9x and 1.0x with 1,000."""

    key = "pgbroker"
    database = "pgbroker_bench_peer_stream_group"

    def describe(self) -> str:
        return f"StreamWorker(concurrency=W, batch_size={TUNED_BATCH}), {PARTITIONS} partitions"

    async def install(self, dsn: str) -> None:
        await PgbrokerStreams().install(dsn)

    async def create(self, dsn: str, queue: str) -> None:
        await PgbrokerStreams().create(dsn, queue, True)

    async def drop(self, dsn: str, queue: str) -> None:
        async with AsyncBroker(dsn, max_connections=1) as broker:
            await AsyncStream(broker, queue).drop()

    @asynccontextmanager
    async def sender(self, dsn: str, queue: str) -> AsyncIterator[KeyedSend]:
        async with AsyncBroker(dsn, max_connections=1) as broker:
            stream = AsyncStream(broker, queue)

            async def send(events: list[tuple[str, dict[str, Any]]]) -> None:
                await stream.send_many([payload for _, payload in events], keys=[key for key, _ in events])

            yield send

    async def work(
        self, dsn: str, queue: str, handle: KeyedHandle, stop: asyncio.Event, workers: int
    ) -> None:
        async def handler(message: StreamMessage) -> None:
            await handle(message.message)

        worker = StreamWorker(queue, GROUP, handler, concurrency=workers, batch_size=TUNED_BATCH)
        await serve_until(dsn, worker, stop)

    async def remaining(self, dsn: str, queue: str) -> int:
        return await PgbrokerStreams().remaining(dsn, queue)
