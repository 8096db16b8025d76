"""pgbroker's SQS-style queues with its worker runtime (pgbroker.Worker under pgbroker.runtime._app.serve)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from bench.peers import AsyncHandle, Handle, Peer, Send
from pgbroker import Message, Worker
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.runtime._app import serve
from pgbroker.runtime._stream_worker import StreamWorker

#: docs/performance.md ("worker and peers"): many messages in flight let a batch's acks ride with
#: the next read; the default (1) suits slow handlers and strict one-at-a-time work.
TUNED_CONCURRENCY = 100


class PgbrokerQueues(Peer):
    key = "pgbroker"
    database = "pgbroker_bench_peer_pgbroker"

    def describe(self, tuned: bool) -> str:
        if tuned:
            return f"Worker(concurrency={TUNED_CONCURRENCY}), queue policy ack_mode='delete'"
        return "Worker() (concurrency 1; acks archive)"

    async def install(self, dsn: str) -> None:
        async with AsyncBroker(dsn, max_connections=1) as broker:
            await broker.install()

    async def create(self, dsn: str, queue: str, tuned: bool) -> None:
        async with AsyncBroker(dsn, max_connections=1) as broker:
            created = await broker.create_queue(queue)
            if tuned:  # acks delete rather than archive, as pgmq's delete and PgQueuer do
                await created.set_policy(ack_mode="delete")

    @asynccontextmanager
    async def sender(self, dsn: str, queue: str) -> AsyncIterator[Send]:
        async with AsyncBroker(dsn, max_connections=1) as broker:
            target = broker.queue(queue)

            async def send(payloads: list[dict[str, Any]]) -> None:
                if len(payloads) == 1:
                    await target.send(payloads[0])
                else:
                    await target.send_many(payloads)

            yield send

    async def work(self, dsn: str, queue: str, handle: Handle, stop: asyncio.Event, tuned: bool) -> None:
        async def handler(message: Message) -> None:
            handle(message.message)

        worker = Worker(queue, handler, concurrency=TUNED_CONCURRENCY) if tuned else Worker(queue, handler)
        await serve_until(dsn, worker, stop)

    async def work_jobs(
        self, dsn: str, queue: str, handle: AsyncHandle, stop: asyncio.Event, workers: int, vt: int
    ) -> None:
        """The queue's defaults (acks archive, as the pgmq loop's), ``workers`` handlers at once."""

        async def handler(message: Message) -> None:
            await handle(message.message)

        await serve_until(dsn, Worker(queue, handler, concurrency=workers, vt=vt), stop)

    async def remaining(self, dsn: str, queue: str) -> int:
        async with AsyncBroker(dsn, max_connections=1) as broker:
            return (await broker.metrics(queue)).queue_length


async def serve_until(dsn: str, worker: Worker | StreamWorker, stop: asyncio.Event) -> None:
    """Run ``worker`` (a queue's or a stream group's) until ``stop`` is set, then stop it gracefully."""

    async def stop_when_told() -> None:
        await stop.wait()
        worker.stop()

    stopper = asyncio.create_task(stop_when_told())
    await serve([worker], dsn=dsn, handle_signals=False, schedules=False)
    await stopper
