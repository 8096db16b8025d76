"""PgQueuer (pip ``pgqueuer``) with its asyncpg driver, the one its docs use, and durable tables.

A queue here is an entrypoint of PgQueuer's one job table. Its worker (QueueManager.run) reads
``batch_size`` jobs a query (default 10) and buffers their completion; its docs point to larger
batches for throughput, so the tuned setting is a batch of 100 (as measured in issue 16).

In the job-queue scenario (g) a worker of W handlers is ``run(max_concurrent_tasks=W)``, the
per-process cap on picked jobs, with the largest batch the library allows under it (half the cap;
its performance guide: larger batches for short jobs). W = 1 is below that rule's minimum of 2, so
one handler is the entrypoint's ``concurrency_limit=1`` instead (a cap across all workers: the
one-handler step runs one process). A killed worker's picked jobs stop getting heartbeats and are
picked again after ``heartbeat_timeout``, set to the scenario's vt; no notification tells an idle
worker so, only its next poll (``dequeue_timeout``, 30 s by default: here the vt too).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from psycopg import sql

from bench.peers import AsyncHandle, Handle, Peer, Send

TUNED_BATCH = 100


def _asyncpg_dsn(dsn: str) -> dict[str, Any]:
    """asyncpg's connect() keywords for a libpq conninfo (it reads URLs, not key=value strings)."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    keys = {"host": "host", "port": "port", "user": "user", "password": "password", "dbname": "database"}
    return {ours: params[theirs] for theirs, ours in keys.items() if params.get(theirs)}


class PgQueuerPeer(Peer):
    key = "PgQueuer"
    database = "pgbroker_bench_peer_pgqueuer"

    def describe(self, tuned: bool) -> str:
        return f"QueueManager.run(batch_size={TUNED_BATCH if tuned else 10}), asyncpg driver"

    async def _connect(self, dsn: str) -> asyncpg.Connection:
        return await asyncpg.connect(**_asyncpg_dsn(dsn))

    async def install(self, dsn: str) -> None:
        from pgqueuer import AsyncpgDriver, Queries

        conn = await self._connect(dsn)
        try:
            await Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()

    async def create(self, dsn: str, queue: str, tuned: bool) -> None:
        pass  # an entrypoint needs no setup

    @asynccontextmanager
    async def sender(self, dsn: str, queue: str) -> AsyncIterator[Send]:
        from pgqueuer import AsyncpgDriver, Queries

        conn = await self._connect(dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))

            async def send(payloads: list[dict[str, Any]]) -> None:
                encoded = [json.dumps(p).encode() for p in payloads]
                if len(encoded) == 1:
                    await queries.enqueue(queue, encoded[0])
                else:
                    await queries.enqueue([queue] * len(encoded), list(encoded), [0] * len(encoded))

            yield send
        finally:
            await conn.close()

    async def work(self, dsn: str, queue: str, handle: Handle, stop: asyncio.Event, tuned: bool) -> None:
        from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

        conn = await self._connect(dsn)
        try:
            manager = QueueManager(Queries(AsyncpgDriver(conn)))

            @manager.entrypoint(queue)
            async def handler(job: Job) -> None:
                handle(json.loads(job.payload or b"{}"))

            async def stop_when_told() -> None:
                await stop.wait()
                manager.shutdown.set()

            stopper = asyncio.create_task(stop_when_told())
            await manager.run(batch_size=TUNED_BATCH if tuned else 10)
            await stopper
        finally:
            await conn.close()

    async def work_jobs(
        self, dsn: str, queue: str, handle: AsyncHandle, stop: asyncio.Event, workers: int, vt: int
    ) -> None:
        from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

        conn = await self._connect(dsn)
        try:
            manager = QueueManager(Queries(AsyncpgDriver(conn)))

            @manager.entrypoint(queue, concurrency_limit=1 if workers == 1 else 0)
            async def handler(job: Job) -> None:
                await handle(json.loads(job.payload or b"{}"))

            async def stop_when_told() -> None:
                await stop.wait()
                manager.shutdown.set()

            stopper = asyncio.create_task(stop_when_told())
            await manager.run(
                batch_size=max(1, workers // 2),
                max_concurrent_tasks=workers if workers > 1 else None,
                heartbeat_timeout=timedelta(seconds=vt),
                dequeue_timeout=timedelta(seconds=vt),
            )
            await stopper
        finally:
            await conn.close()

    def job_table(self, queue: str) -> sql.Composable:
        return sql.Identifier("pgqueuer")

    def ready_jobs(self, queue: str) -> sql.Composed:
        return sql.SQL("SELECT count(*) FROM pgqueuer WHERE entrypoint = {} AND status = 'queued'").format(
            sql.Literal(queue)
        )

    async def remaining(self, dsn: str, queue: str) -> int:
        conn = await self._connect(dsn)
        try:
            found = await conn.fetchval(
                "SELECT count(*) FROM pgqueuer WHERE entrypoint = $1 AND status IN ('queued', 'picked')",
                queue,
            )
            return int(found)
        finally:
            await conn.close()
