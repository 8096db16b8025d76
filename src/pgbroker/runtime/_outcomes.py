"""What the server made of a worker's outcomes: each counted in the worker's stats and logged,
and for one the server refused (its lease had ended), the reason, asked for on its own."""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from pgbroker.errors import StaleReceipt
from pgbroker.queues._client_async import AsyncQueue
from pgbroker.runtime._log_events import log_event
from pgbroker.runtime._outbox import Batch, Outcome
from pgbroker.runtime._worker_stats import WorkerStats

__all__ = ["not_recorded", "record_outcomes", "why"]


async def why(call: Awaitable[object]) -> str:
    """Why a receipt was refused: the single forms raise StaleReceipt with the server's reason
    (they cannot succeed now: a receipt that stopped holding never holds again)."""
    try:
        await call
    except StaleReceipt as exc:
        return exc.message
    except Exception as exc:
        return f"unknown ({exc})"
    return "recorded on the second try"


async def record_outcomes(
    queue: AsyncQueue, batch: Batch, acked: set[int], failed: dict[int, str], stats: WorkerStats
) -> None:
    """Count what the server recorded; ask why for what it refused (a stale receipt)."""
    for outcome in batch.successes:
        if outcome.receipt.msg_id in acked:
            stats.completed += 1
        else:
            not_recorded(queue.name, outcome, await why(queue.ack(outcome.receipt)), stats)
    for (error, traceback), outcomes in batch.failures.items():
        for outcome in outcomes:
            message = outcome.message
            result = failed.get(message.msg_id)
            if result is None:
                refused = queue.fail(outcome.receipt, error=error, traceback=traceback)
                not_recorded(queue.name, outcome, await why(refused), stats)
                continue
            fields = {
                "queue": queue.name,
                "msg_id": message.msg_id,
                "delivery": message.read_ct,
                "error": error,
            }
            if result == "dead_lettered":
                stats.dead_lettered += 1
                # Where it went depends on the policy (its dead-letter queue, else the archive);
                # the command finds it either way.
                see = f"pgbroker dlq list {queue.name}"
                log_event(logging.WARNING, "worker.dead_lettered", **fields, see=see)
            else:
                stats.retried += 1
                log_event(logging.INFO, "worker.retry", **fields)


def not_recorded(queue: str, outcome: Outcome, why: str, stats: WorkerStats) -> None:
    """Count and log an outcome the server refused: its lease had ended (a stale receipt)."""
    stats.stale += 1
    message = outcome.message
    if outcome.error is None:
        log_event(
            logging.WARNING,
            "worker.ack_refused",
            queue=queue,
            msg_id=message.msg_id,
            delivery=message.read_ct,
            reason=why,
        )
    else:
        log_event(
            logging.WARNING,
            "worker.failure_not_recorded",
            queue=queue,
            msg_id=message.msg_id,
            delivery=message.read_ct,
            error=outcome.error,
            why=why,
        )
