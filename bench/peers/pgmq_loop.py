"""pgmq (the reference 1.13 SQL) with the consumer loop its docs show: read a batch, handle each
message, delete the batch. pgmq has no worker runtime of its own; this is the loop a user writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench.peers import AsyncHandle, Handle, Peer, Send

TUNED_BATCH = 100
VT = 30
#: the job-queue scenario's loop (g): each of the W loops reads up to this many, handles them one
#: after the other, and archives the batch in one call
JOBS_BATCH = 64
IDLE_POLL = 0.1  # seconds between reads of an empty queue (pgmq.read_with_poll's default interval)


class PgmqLoop(Peer):
    key = "pgmq"
    database = "pgbroker_bench_peer_pgmq"

    def describe(self, tuned: bool) -> str:
        batch = TUNED_BATCH if tuned else 1
        return f"read {batch} + delete of the batch, poll {IDLE_POLL} s when empty"

    async def install(self, dsn: str) -> None:
        from bench.harness import install_reference_pgmq

        with psycopg.connect(dsn, autocommit=True) as conn:
            install_reference_pgmq(conn)

    async def create(self, dsn: str, queue: str, tuned: bool) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("SELECT pgmq.create(%s)", [queue])

    @asynccontextmanager
    async def sender(self, dsn: str, queue: str) -> AsyncIterator[Send]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:

            async def send(payloads: list[dict[str, Any]]) -> None:
                if len(payloads) == 1:
                    await conn.execute("SELECT pgmq.send(%s, %s)", [queue, Jsonb(payloads[0])])
                else:
                    chunk = [Jsonb(p) for p in payloads]
                    await conn.execute("SELECT pgmq.send_batch(%s, %s::jsonb[])", [queue, chunk])

            yield send

    async def work(self, dsn: str, queue: str, handle: Handle, stop: asyncio.Event, tuned: bool) -> None:
        batch = TUNED_BATCH if tuned else 1
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                cursor = await conn.execute(
                    "SELECT msg_id, message FROM pgmq.read(%s, %s, %s)", [queue, VT, batch]
                )
                rows = await cursor.fetchall()
                if not rows:
                    await asyncio.sleep(IDLE_POLL)
                    continue
                for _, message in rows:
                    handle(message)
                await conn.execute("SELECT pgmq.delete(%s, %s::bigint[])", [queue, [r[0] for r in rows]])

    async def work_jobs(
        self, dsn: str, queue: str, handle: AsyncHandle, stop: asyncio.Event, workers: int, vt: int
    ) -> None:
        async def loop() -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                while not stop.is_set():
                    cursor = await conn.execute(
                        "SELECT msg_id, message FROM pgmq.read(%s, %s, %s)", [queue, vt, JOBS_BATCH]
                    )
                    rows = await cursor.fetchall()
                    if not rows:
                        await asyncio.sleep(IDLE_POLL)
                        continue
                    for _, message in rows:
                        await handle(message)
                    await conn.execute("SELECT pgmq.archive(%s, %s::bigint[])", [queue, [r[0] for r in rows]])

        await asyncio.gather(*(loop() for _ in range(workers)))

    async def remaining(self, dsn: str, queue: str) -> int:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cursor = await conn.execute("SELECT queue_length FROM pgmq.metrics(%s)", [queue])
            row = await cursor.fetchone()
            return int(row[0]) if row else 0
