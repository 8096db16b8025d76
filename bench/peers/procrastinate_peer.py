"""Procrastinate (pip ``procrastinate``) with its psycopg connector and async worker.

A queue is a Procrastinate queue with one task. Its worker runs ``concurrency`` jobs at once
(default 1; its docs: raise it for async, I/O-bound tasks) and is woken by LISTEN/NOTIFY
(``listen_notify``, on by default) with polling as the fallback. The tuned setting runs 100 at once.

In the job-queue scenario (g) a worker of W handlers is ``run_worker_async(concurrency=W)``. A
killed worker's jobs stay ``doing`` for good: Procrastinate only notices that their worker stopped
sending heartbeats, and its docs have the application retry such "stalled" jobs itself (a periodic
task calling ``get_stalled_jobs`` and ``retry_job``). Here each worker process runs that sweep
every second beside its worker, with heartbeats every vt / 5 and a worker stalled after the
scenario's vt, so the killed worker's jobs come back after about the vt as in the other systems.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import sql

from bench.peers import AsyncHandle, Handle, Peer, Send

TUNED_CONCURRENCY = 100
TASK = "bench_noop"
#: seconds between two sweeps for stalled jobs in the job-queue scenario (g)
STALLED_SWEEP = 1.0


def _app(dsn: str, handle: Handle | None = None, async_handle: AsyncHandle | None = None) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name=TASK)
    async def noop(**payload: Any) -> None:
        if handle is not None:
            handle(payload)
        if async_handle is not None:
            await async_handle(payload)

    return app


async def _retry_stalled(app: Any, queue: str, vt: int, stop: asyncio.Event) -> None:
    """Put the jobs of workers silent for ``vt`` seconds back to ``todo`` until ``stop``: the
    retry of stalled jobs Procrastinate's docs leave to the application."""
    from procrastinate.exceptions import ConnectorException

    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), STALLED_SWEEP)
        for job in await app.job_manager.get_stalled_jobs(queue=queue, seconds_since_heartbeat=vt):
            # the other worker process may have retried it first
            with contextlib.suppress(ConnectorException):
                await app.job_manager.retry_job(job)


class ProcrastinatePeer(Peer):
    key = "Procrastinate"
    database = "pgbroker_bench_peer_procrastinate"
    drain_cap = 1_000  # 50-150 jobs a second here (a query per job): 7-20 s a drain

    def describe(self, tuned: bool) -> str:
        concurrency = TUNED_CONCURRENCY if tuned else 1
        return f"run_worker_async(concurrency={concurrency}, listen_notify=True), psycopg connector"

    async def install(self, dsn: str) -> None:
        app = _app(dsn)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def create(self, dsn: str, queue: str, tuned: bool) -> None:
        pass  # a queue is only a name on the jobs

    @asynccontextmanager
    async def sender(self, dsn: str, queue: str) -> AsyncIterator[Send]:
        app = _app(dsn)
        async with app.open_async():
            deferrer = app.tasks[TASK].configure(queue=queue)

            async def send(payloads: list[dict[str, Any]]) -> None:
                if len(payloads) == 1:
                    await deferrer.defer_async(**payloads[0])
                else:
                    await deferrer.batch_defer_async(*payloads)

            yield send

    async def work(self, dsn: str, queue: str, handle: Handle, stop: asyncio.Event, tuned: bool) -> None:
        app = _app(dsn, handle)
        async with app.open_async():
            worker = asyncio.create_task(
                app.run_worker_async(
                    queues=[queue],
                    concurrency=TUNED_CONCURRENCY if tuned else 1,
                    listen_notify=True,
                    install_signal_handlers=False,
                )
            )
            await stop.wait()
            worker.cancel()  # a cancelled worker stops gracefully: running jobs finish first
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    async def work_jobs(
        self, dsn: str, queue: str, handle: AsyncHandle, stop: asyncio.Event, workers: int, vt: int
    ) -> None:
        app = _app(dsn, async_handle=handle)
        async with app.open_async():
            worker = asyncio.create_task(
                app.run_worker_async(
                    queues=[queue],
                    concurrency=workers,
                    listen_notify=True,
                    install_signal_handlers=False,
                    update_heartbeat_interval=vt / 5,
                    stalled_worker_timeout=vt,
                )
            )
            sweeper = asyncio.create_task(_retry_stalled(app, queue, vt, stop))
            await stop.wait()
            worker.cancel()  # running jobs finish first
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            await sweeper

    def job_table(self, queue: str) -> sql.Composable:
        return sql.Identifier("procrastinate_jobs")

    def ready_jobs(self, queue: str) -> sql.Composed:
        return sql.SQL(
            "SELECT count(*) FROM procrastinate_jobs WHERE queue_name = {} AND status = 'todo'"
        ).format(sql.Literal(queue))

    async def remaining(self, dsn: str, queue: str) -> int:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cursor = await conn.execute(
                "SELECT count(*) FROM procrastinate_jobs"
                " WHERE queue_name = %s AND status IN ('todo', 'doing')",
                [queue],
            )
            row = await cursor.fetchone()
            return int(row[0]) if row else 0
