"""Back-off schedules shared by the clients and the worker: how long to pause before trying again.

One schedule serves a send waiting out backpressure, a worker polling an idle queue, and a
worker retrying an ack while the database restarts. Pauses double from ``first`` up to
``most``; jitter shortens each by a random fraction, so that many processes that failed
together (a database restart) do not come back in step.
"""

from __future__ import annotations

import random
import time


class Backoff:
    """Pauses that double from ``first`` to ``most`` seconds; ``next()`` gives the next one."""

    def __init__(self, first: float, most: float, *, jitter: float = 0.2) -> None:
        self.first = first
        self.most = most
        self._jitter = jitter
        self._next = first

    def next(self) -> float:
        pause = self._next * (1.0 - self._jitter * random.random())
        self._next = min(self.most, self._next * 2)
        return pause

    def reset(self) -> None:
        """Start again from ``first`` (after a success)."""
        self._next = self.first


class Patience:
    """A Backoff that ends ``within`` seconds from now: next() is None once time is up."""

    def __init__(self, first: float, most: float, *, within: float) -> None:
        self._backoff = Backoff(first, most)
        self._deadline = time.monotonic() + within

    def next(self) -> float | None:
        left = self._deadline - time.monotonic()
        return None if left <= 0 else min(self._backoff.next(), left)


# A send refused by backpressure tries again after 10 ms, then less and less often: a full
# queue drains at its consumers' pace, and hammering it only slows them down.
SEND_RETRY = (0.01, 1.0)
