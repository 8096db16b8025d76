"""The job queues compared side by side in the peer scenario (f), one adapter each.

A peer is a queue library (or a plain SQL loop) with a worker runtime: it installs itself in its
own database, enqueues, and runs a worker in the current process with the given handler until told
to stop. ``PEERS`` is the registry the scenario runs, in column order; a new system (pgbroker's
streams, say) registers here and gets its column, its rounds and its ratios.

Each adapter is configured as its own documentation recommends for speed in the ``tuned`` setting,
and with the library's defaults otherwise; ``describe`` says which knobs were set, for the report.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from psycopg import sql

#: Called with each job's payload (a dict) by a worker's handler; a no-op besides counting.
Handle = Callable[[dict[str, Any]], None]
#: Awaited with each job's payload by the job-queue scenario's handlers (its synthetic work).
AsyncHandle = Callable[[dict[str, Any]], Awaitable[None]]
#: Enqueues its payloads in one call (one job each; a list of one: the single-job form).
Send = Callable[[list[dict[str, Any]]], Awaitable[None]]


class Peer(ABC):
    """One system under test; a subclass implements the abstract methods."""

    #: the column name in the table
    key: str = ""
    #: the database the harness creates for it (dropped at the end of the scenario)
    database: str = ""
    #: most jobs a drain gives it (None: as many as the step says), for a system so slow that
    #: the step's count would not fit in the run's time; its rate is jobs a second all the same
    drain_cap: int | None = None

    @abstractmethod
    def describe(self, tuned: bool) -> str:
        """The worker's configuration in words (the defaults, or the documented speed settings)."""
        ...

    @abstractmethod
    async def install(self, dsn: str) -> None: ...

    @abstractmethod
    async def create(self, dsn: str, queue: str, tuned: bool) -> None:
        """Make an empty queue (or whatever names a stream of jobs in this system), with the
        documented speed settings when ``tuned``."""
        ...

    @abstractmethod
    def sender(self, dsn: str, queue: str) -> AbstractAsyncContextManager[Send]:
        """A producer's connection: ``async with peer.sender(dsn, queue) as send: await send([...])``."""
        ...

    async def enqueue(self, dsn: str, queue: str, payloads: list[dict[str, Any]], batch: int) -> float:
        """Enqueue ``payloads`` ``batch`` at a time (1: one call each); seconds spent sending."""
        async with self.sender(dsn, queue) as send:
            started = time.perf_counter()
            for first in range(0, len(payloads), batch):
                await send(payloads[first : first + batch])
            return time.perf_counter() - started

    @abstractmethod
    async def work(self, dsn: str, queue: str, handle: Handle, stop: asyncio.Event, tuned: bool) -> None:
        """Run one worker on ``queue`` until ``stop`` is set, then stop it gracefully."""
        ...

    async def work_jobs(
        self, dsn: str, queue: str, handle: AsyncHandle, stop: asyncio.Event, workers: int, vt: int
    ) -> None:
        """Run ``workers`` handlers at once on ``queue`` (leases of ``vt`` seconds) until ``stop`` is
        set: the job-queue scenario (g), which runs the systems of bench.job_queue.COLUMNS only;
        the others do not implement it."""
        raise NotImplementedError

    def job_table(self, queue: str) -> sql.Composable:
        """The table holding ``queue``'s jobs, read by scenario (g)'s pressure sessions: pgmq's
        ``pgmq.q_<queue>`` (pgmq, and pgbroker's pgmq-compatible queues) unless a peer says."""
        return sql.Identifier("pgmq", f"q_{queue.lower()}")

    def ready_jobs(self, queue: str) -> sql.Composed:
        """A query counting ``queue``'s jobs ready to be claimed (scenario (g)'s depth producer)."""
        return sql.SQL("SELECT count(*) FROM {} WHERE vt <= now()").format(self.job_table(queue))

    @abstractmethod
    async def remaining(self, dsn: str, queue: str) -> int:
        """Jobs not yet done (waiting, or handled but not yet acknowledged)."""
        ...


def peers() -> dict[str, Peer]:
    """The registry, in column order (a new system: a Peer here). Imported lazily: a peer's library
    is only needed to run it."""
    from bench.peers.pgbroker_queues import PgbrokerQueues
    from bench.peers.pgbroker_streams import PgbrokerStreams
    from bench.peers.pgmq_loop import PgmqLoop
    from bench.peers.pgqueuer_peer import PgQueuerPeer
    from bench.peers.procrastinate_peer import ProcrastinatePeer

    found: list[Peer] = [PgQueuerPeer(), ProcrastinatePeer(), PgmqLoop(), PgbrokerQueues(), PgbrokerStreams()]
    return {peer.key: peer for peer in found}
