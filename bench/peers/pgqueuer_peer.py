"""PgQueuer (pip ``pgqueuer``) with its asyncpg driver, the one its docs use, and durable tables.

A queue here is an entrypoint of PgQueuer's one job table. Its worker (QueueManager.run) reads
``batch_size`` jobs a query (default 10) and buffers their completion; its docs point to larger
batches for throughput, so the tuned setting is a batch of 100 (as measured in issue 16).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from bench.peers import Handle, Peer, Send

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
