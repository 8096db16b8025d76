"""The outcomes a worker owes the server: handled messages waiting to be acked or failed.

A handler that returns (or raises) leaves its outcome here and its slot is free at once. The
outcomes ride with the worker's next read, in the same transaction and round trip
(pgbroker.runtime._round_trips); the ones no read comes for within ``linger`` seconds (every slot still
busy, or the worker stopping) are sent on their own. Successes of a batch share one
pgbroker.complete, failures one pgbroker.fail per distinct error and traceback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from traceback import format_exception
from typing import Any

from pgbroker._frozen import builder
from pgbroker.queues import _queries as q
from pgbroker.queues._query import Query
from pgbroker.queues._records import Message, Receipt

__all__ = ["Outbox", "Outcome"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """A handled message: the receipt to record it with, when its lease ends (Lease.ends), and the
    handler's error (None: success) with its traceback (kept with the message by pgbroker.fail)."""

    message: Message
    receipt: Receipt
    lease_ends: float
    error: str | None = None
    traceback: str | None = None

    @staticmethod
    def success(message: Message, receipt: Receipt, lease_ends: float) -> Outcome:
        """A handled message (one for each the worker handles: made fast, pgbroker._frozen)."""
        return _build_outcome(message, receipt, lease_ends, None, None)

    @classmethod
    def failure(cls, message: Message, receipt: Receipt, lease_ends: float, exc: Exception) -> Outcome:
        """A failed delivery: the exception's type and text, and its traceback when it was raised
        (a body the codec cannot decode was not)."""
        trace = "".join(format_exception(exc)) if exc.__traceback__ is not None else None
        return cls(message, receipt, lease_ends, f"{type(exc).__name__}: {exc}", trace)


_build_outcome = builder(Outcome)


class Outbox:
    """Outcomes not yet sent, oldest first; ``changed`` is set whenever one is added."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self._items: list[Outcome] = []
        self._since = 0.0  # monotonic time of the oldest outcome waiting
        self.changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def add(self, outcome: Outcome) -> None:
        if not self._items:
            self._since = time.monotonic()
        self._items.append(outcome)
        self.changed.set()

    def put_back(self, outcomes: list[Outcome]) -> None:
        """Return outcomes whose sending failed, ahead of any added since."""
        if outcomes:
            self._items[:0] = outcomes
            self._since = time.monotonic()
            self.changed.set()

    def take(self) -> list[Outcome]:
        taken, self._items = self._items, []
        return taken

    def waited(self) -> float:
        """Seconds the oldest outcome has waited (0 when there is none)."""
        return time.monotonic() - self._since if self._items else 0.0


@dataclass(frozen=True, slots=True)
class Batch:
    """A list of outcomes, sorted for the statements that record them, and how to read their
    results back."""

    queue: str
    successes: list[Outcome]
    failures: dict[tuple[str, str | None], list[Outcome]]  # by error text and traceback
    #: a failure's last delivery when the queue's policy sets no limit of its own
    max_deliveries: int | None

    def queries(self) -> list[Query[Any]]:
        """The statements, made when asked for: the worker's common case, successes and a read,
        takes the successes' receipts into its one statement instead."""
        queries: list[Query[Any]] = []
        if self.successes:
            receipts = [outcome.receipt for outcome in self.successes]
            queries.append(q.message_complete_many(self.queue, receipts))
        for (error, traceback), failed in self.failures.items():
            receipts = [outcome.receipt for outcome in failed]
            queries.append(
                q.message_fail_many(
                    self.queue,
                    receipts,
                    error=error,
                    traceback=traceback,
                    default_max_deliveries=self.max_deliveries,
                )
            )
        return queries

    def results(self, found: Iterable[Any]) -> tuple[set[int], dict[int, str]]:
        """(msg_ids acked, {msg_id: 'retry' | 'dead_lettered'}) from the queries' results."""
        answers = iter(found)
        acked = set(next(answers)) if self.successes else set()
        failed: dict[int, str] = {}
        for _ in self.failures:
            failed.update(next(answers))
        return acked, failed


def batch_of(queue: str, outcomes: list[Outcome], max_deliveries: int | None = None) -> Batch:
    """``outcomes`` sorted into successes and failures by error; a failure is dead-lettered at
    ``max_deliveries`` when the queue's policy sets no limit of its own."""
    successes = [outcome for outcome in outcomes if outcome.error is None]
    failures: dict[tuple[str, str | None], list[Outcome]] = {}
    if len(successes) < len(outcomes):
        for outcome in outcomes:
            if outcome.error is not None:
                failures.setdefault((outcome.error, outcome.traceback), []).append(outcome)
    return Batch(queue, successes, failures, max_deliveries)
