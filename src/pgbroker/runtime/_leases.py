"""A worker's leases: one per message held, renewed by the heartbeat, given back at shutdown,
and the calls made on them retried after a lost connection while the lease still holds.

The heartbeat's extends and the give-back are made as the worker makes its reads and acks
(``WorkerCall``: through its SchemaWatch, each bounded by the lease), so a function an upgrade
just re-made is tried again, not taken for the lease lost."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pgbroker._db.backoff import Patience
from pgbroker._db.liveness import STOP_PATIENCE, is_transient
from pgbroker._db.schema_watch import SCHEMA_CHANGED_HINT, SchemaChanged
from pgbroker.errors import PgbrokerError
from pgbroker.queues._client_async import AsyncQueue
from pgbroker.queues._records import Receipt
from pgbroker.runtime._log_events import log_event
from pgbroker.runtime._worker_stats import WorkerStats

__all__ = ["RECONNECT", "Lease", "WorkerCall", "extend_leases", "release_leases", "retry_while_leased"]

T = TypeVar("T")
# Retries of calls that lost their connection: soon at first, then every few seconds.
RECONNECT = (0.05, 2.0)


class WorkerCall(Protocol):
    """How a worker makes a database call (Worker._call): through its SchemaWatch, which tells an
    upgrade's errors (SchemaChanged) from a bug's, its answer awaited at most the lease."""

    def __call__(self, call: Coroutine[Any, Any, T], /) -> Awaitable[T]: ...


@dataclass(eq=False, slots=True)
class Lease:
    """One message's lease: the current receipt, when it ends, and whether the heartbeat is
    renewing it."""

    receipt: Receipt
    # When the lease ends on this process's monotonic clock: when it was asked for, plus its vt.
    # The server starts it a little later and writes its end in the receipt on the server's own
    # clock, which a worker's wall clock may be far from (a VM resumed from sleep, no NTP).
    ends: float
    # Set once the outcome is being recorded, or the lease is lost or given back: no more extends.
    over: bool = False
    # An extend in flight: the outcome waits for it, then uses the receipt it handed out.
    extending: asyncio.Future[None] | None = None


async def retry_while_leased(stats: WorkerStats, lease_ends: float, call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, tried again after connection errors until ``lease_ends`` (Lease.ends), and
    after a function or column an upgrade just moved (SchemaChanged, from a call through the
    worker's SchemaWatch), as the reads are: the same call finds the new ones.

    Past the lease a retry could only fail as stale, so the last error is raised instead.
    """
    retry = Patience(*RECONNECT, within=lease_ends - time.monotonic())
    while True:
        try:
            return await call()
        except Exception as exc:
            if isinstance(exc, SchemaChanged):
                log_event(logging.WARNING, "worker.schema_changed", error=exc, hint=SCHEMA_CHANGED_HINT)
            elif is_transient(exc):
                stats.connection_errors += 1
            else:
                raise
            pause = retry.next()
            if pause is None:
                raise
            log_event(logging.INFO, "worker.retrying", error=exc, pause=f"{pause:.2f}")
            await asyncio.sleep(pause)


async def extend_leases(
    queue: AsyncQueue, leases: list[Lease], vt: int, stats: WorkerStats, worker_call: WorkerCall
) -> None:
    """Extend ``leases`` in one call; a lease the server no longer holds is over (counted, logged)."""
    turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    for lease in leases:
        lease.extending = turn
    receipts = [lease.receipt for lease in leases]
    asked_at = time.monotonic()
    try:
        renewed = await retry_while_leased(
            stats,
            min(lease.ends for lease in leases),
            lambda: worker_call(queue.extend_many(receipts, vt=vt)),
        )
        error = "the lease had ended"
    except Exception as exc:
        renewed = {}
        error = exc.message if isinstance(exc, PgbrokerError) else str(exc)
    except asyncio.CancelledError:  # the worker stops: the leases keep their receipts, and are given back
        for lease in leases:
            lease.extending = None
        turn.set_result(None)
        raise
    for lease in leases:
        lease.extending = None
        held = lease.receipt
        if held.msg_id in renewed:
            lease.receipt, lease.ends = renewed[held.msg_id], asked_at + vt
        elif not lease.over:
            lease.over = True
            stats.stale += 1
            log_event(
                logging.WARNING,
                "worker.lease_lost",
                queue=queue.name,
                msg_id=held.msg_id,
                delivery=held.read_ct,
                error=error,
            )
    turn.set_result(None)


async def release_leases(
    queue: AsyncQueue, leases: list[Lease], stats: WorkerStats, worker_call: WorkerCall
) -> None:
    """Nack the leases whose handler has not finished (or not started): at the worker's stop, so
    tried again (an upgrade's moved function, a lost connection) for STOP_PATIENCE at most, and
    never past the leases; a message not given back comes again once its lease ends."""
    given_back = []
    for lease in leases:
        if lease.extending is not None:  # the receipt to give back is the one it hands out
            await asyncio.shield(lease.extending)
        if not lease.over:  # otherwise its outcome is being recorded
            lease.over = True
            given_back.append(lease)
    if not given_back:
        return
    receipts = [lease.receipt for lease in given_back]
    try:
        until = min(max(lease.ends for lease in given_back), time.monotonic() + STOP_PATIENCE)
        released = await retry_while_leased(stats, until, lambda: worker_call(queue.nack_many(receipts)))
    except Exception as exc:
        released = []
        log_event(logging.WARNING, "worker.release_failed", queue=queue.name, error=exc)
    stats.released += len(released)
    log_event(
        logging.WARNING,
        "worker.released",
        queue=queue.name,
        messages=len(released),
        unfinished=len(given_back),
    )
