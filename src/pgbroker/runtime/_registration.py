"""A queue worker's row in pgbroker.queue_workers (sql/functions/96_monitoring.sql): registered
when it starts, renewed by a heartbeat with what it holds and has done, deleted when it stops,
so that the dashboard shows who consumes what. A worker that dies leaves a row that goes stale
and is deleted within a minute.

The row is for people, not for the worker: a heartbeat that fails (the database away, a schema
from before the table, no answer within a beat's interval) is logged once and tried again next
beat, never stopping the worker, nor holding up its stop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable

from pgbroker._db.liveness import answered_within
from pgbroker.queues import _queries as q
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.queues._query import Query
from pgbroker.runtime._log_events import log_event
from pgbroker.runtime._round_trips import run_together
from pgbroker.runtime._worker_stats import WorkerStats

__all__ = ["BEAT_SECONDS", "Registration"]

# Well within the minute after which the engine forgets a worker's row.
BEAT_SECONDS = 15.0


class Registration:
    """One worker's row: ``keep`` beats until cancelled, ``end`` deletes it."""

    def __init__(self, queue: str, concurrency: int) -> None:
        self.worker_id = uuid.uuid4()
        self.queue = queue
        self.concurrency = concurrency
        self._failing = False

    async def keep(self, broker: AsyncBroker, now: Callable[[], tuple[int, WorkerStats]]) -> None:
        while True:
            held, stats = now()
            beat = q.WorkerBeat(
                self.worker_id,
                self.queue,
                socket.gethostname(),
                os.getpid(),
                self.concurrency,
                held,
                stats.completed,
                stats.retried,
                stats.dead_lettered,
            )
            await self._run(broker, q.worker_heartbeat(beat))
            await asyncio.sleep(BEAT_SECONDS)

    async def end(self, broker: AsyncBroker) -> None:
        await self._run(broker, q.worker_stopped(self.worker_id, self.queue))

    async def _run(self, broker: AsyncBroker, query: Query[None]) -> None:
        try:
            # Bounded, the wait for a pooled connection included: a pool with none to give or a
            # session that hangs must hold up neither the beats nor the stop. That wait also swallows
            # a cancellation that comes with the connection (answered_within raises it all the same).
            await answered_within(BEAT_SECONDS, self._call(broker, query))
        except Exception as exc:
            if not self._failing:
                log_event(logging.WARNING, "worker.registration_failed", queue=self.queue, error=exc)
            self._failing = True
        else:
            self._failing = False

    @staticmethod
    async def _call(broker: AsyncBroker, query: Query[None]) -> None:
        async with broker.connection() as conn:
            await run_together(conn, [query])
