"""What a worker has done since it started, counted as it goes."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WorkerStats"]


@dataclass
class WorkerStats:
    """What a worker has done since it started."""

    reads: int = 0  # read statements, empty ones included
    received: int = 0  # messages read
    completed: int = 0  # handled and acked
    retried: int = 0  # handler failed; back in the queue after the back-off
    dead_lettered: int = 0  # handler failed on the last allowed delivery
    stale: int = 0  # lease lost before the outcome was recorded, or read ahead and run out: redelivered
    released: int = 0  # given back unhandled at shutdown
    connection_errors: int = 0  # calls that lost their connection (then tried again while that made sense)
