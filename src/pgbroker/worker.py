"""The worker runtime: a handler consumes a queue with N messages in flight per process.

A Worker reads batches sized to its free slots and runs each message's handler: an async
handler on the event loop, a sync one on the worker's threads. The outcome goes through the
queue's policy, in SQL: success -> pgbroker.complete (archive or delete), an exception ->
pgbroker.fail (back in the queue after the back-off, or dead-lettered after max_deliveries).
Acks of messages that finish together share one statement.

While a handler runs, a heartbeat extends its lease. Each extend hands out a new receipt and
spends the old one, so the heartbeat and the outcome of a message take turns on its lease.
A handler that outlives its lease (no heartbeat, or the database away for longer than the
lease) cannot ack: another consumer has the message by then. That is counted as ``stale``
and logged, never retried here.

Calls that fail because the connection is lost (a restart, a failover) are retried while the
lease still holds; fenced receipts make a retried ack safe, so a restart of Postgres costs
no duplicate handling.

An empty queue is waited on with LISTEN/NOTIFY; polls are the fallback, less frequent the
longer the queue stays empty (``poll_min`` doubling up to ``poll_max``). Worker.stop() (or
SIGTERM/SIGINT under pgbroker.app.serve) stops reading, lets the handlers in flight finish
within ``grace_period``, and gives back (nacks) the messages of those that cannot.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeAlias, TypeVar

import psycopg

from pgbroker.aio import AsyncBroker, AsyncQueue
from pgbroker.backoff import Backoff, Patience
from pgbroker.errors import DatabaseError, InvalidArgument, PgbrokerError, QueueNotFound, StaleReceipt
from pgbroker.handler_threads import HandlerThreads
from pgbroker.listen import AsyncSubscription, nap
from pgbroker.models import Message, Receipt

__all__ = ["Handler", "Worker", "WorkerStats"]

log = logging.getLogger("pgbroker.worker")

T = TypeVar("T")
# Called with each message; a coroutine function is awaited, anything else runs on a thread.
# Returning normally is success; raising is a failure (see pgbroker.fail).
Handler: TypeAlias = Callable[[Message], Any]

# How long to wait for the LISTEN to be in place before the first read; reads do not need it.
_LISTEN_TIMEOUT = 1.0
# Retries of calls that lost their connection: soon at first, then every few seconds.
_RECONNECT = (0.05, 2.0)


def _is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a lost or refused connection (the same call may succeed soon).

    psycopg reports those, and pool timeouts, as OperationalError; the clients wrap errors
    raised by a query in pgbroker's types, with the psycopg error as the cause.
    """
    cause = exc.__cause__ if isinstance(exc, DatabaseError) else exc
    return isinstance(cause, psycopg.OperationalError)


def _log(level: int, event: str, **fields: object) -> None:
    """One log line: the event, then key=value pairs (values with spaces are JSON-quoted)."""
    if log.isEnabledFor(level):
        pairs = []
        for key, value in fields.items():
            text = str(value)
            plain = text and not any(c in text for c in ' "=\n')
            pairs.append(f"{key}={text if plain else json.dumps(text)}")
        log.log(level, "%s %s", event, " ".join(pairs))


@dataclass
class WorkerStats:
    """What a worker has done since it started."""

    reads: int = 0  # read statements, empty ones included
    received: int = 0  # messages read
    completed: int = 0  # handled and acked
    retried: int = 0  # handler failed; back in the queue after the back-off
    dead_lettered: int = 0  # handler failed on the last allowed delivery
    stale: int = 0  # lease lost before the outcome was recorded: the message is redelivered
    released: int = 0  # given back unhandled at shutdown
    connection_errors: int = 0  # calls that lost their connection (then tried again while that made sense)


@dataclass
class _Lease:
    """One message's lease: the current receipt, and whose turn it is to use it."""

    receipt: Receipt
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Set once the outcome is being recorded, or the lease is lost or given back: the heartbeat stops.
    over: bool = False
    # The heartbeat: a timer until the first extend is due (most handlers finish before), then a task.
    beat: asyncio.TimerHandle | asyncio.Task[None] | None = None


async def _retry_while_leased(stats: WorkerStats, lease_ends: float, call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, tried again after connection errors until ``lease_ends`` (epoch seconds).

    Past the lease a retry could only fail as stale, so the last error is raised instead.
    """
    retry = Patience(*_RECONNECT, within=lease_ends - time.time())
    while True:
        try:
            return await call()
        except Exception as exc:
            if not _is_transient(exc):
                raise
            stats.connection_errors += 1
            pause = retry.next()
            if pause is None:
                raise
            _log(logging.INFO, "worker.retrying", error=exc, pause=f"{pause:.2f}")
            await asyncio.sleep(pause)


class _Completer:
    """Acks successes in batches: what finishes while one ack is in flight goes in the next."""

    def __init__(self, queue: AsyncQueue, stats: WorkerStats) -> None:
        self._queue = queue
        self._stats = stats
        self._pending: list[tuple[Receipt, asyncio.Future[str | None]]] = []
        self._more = asyncio.Event()

    async def complete(self, receipt: Receipt) -> str | None:
        """Ack by the queue's policy; None once acked, else why it was refused."""
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._pending.append((receipt, future))
        self._more.set()
        return await future

    async def run(self) -> None:
        while True:
            await self._more.wait()
            self._more.clear()
            batch, self._pending = self._pending, []
            await self._flush(batch)

    async def _flush(self, batch: list[tuple[Receipt, asyncio.Future[str | None]]]) -> None:
        receipts = [receipt for receipt, _ in batch]
        lease_ends = max(receipt.lease for receipt in receipts) / 1e6
        try:
            acked = set(
                await _retry_while_leased(
                    self._stats, lease_ends, lambda: self._queue.complete_many(receipts)
                )
            )
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_result(f"the ack failed: {exc}")
            return
        for receipt, future in batch:
            refused = None if receipt.msg_id in acked else await self._why(receipt)
            if not future.done():
                future.set_result(refused)

    async def _why(self, receipt: Receipt) -> str:
        # The batch form only leaves a stale receipt out; the single form says why (it cannot
        # succeed now: a receipt that stopped holding never holds again).
        try:
            await self._queue.ack(receipt)
        except StaleReceipt as exc:
            return exc.message
        except Exception as exc:
            return f"unknown ({exc})"
        return "acked on the second try"


def _check_seconds(value: float, what: str, *, positive: bool = True) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value >= 0)
    ):
        raise InvalidArgument(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    if positive and value == 0:
        raise InvalidArgument(f"{what} must be > 0 seconds, got {value!r}")
    return float(value)


def _check_count(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{what} must be a whole number >= 1, got {value!r}")
    return value


class Worker:
    """Consumes one queue with one handler; ``await worker.run(broker)`` until stop().

    concurrency: messages in flight at once. batch_size: most messages per read (default:
    concurrency); a read is made once at least half the slots (or batch_size) are free, so
    that fast handlers share reads. vt: lease seconds. heartbeat: extend leases of slow
    handlers every vt/3 seconds. notify: enable notify on the queue if it has none (with
    pgmq's default 250 ms throttle), so an idle worker sleeps until a send. poll_min and
    poll_max: the fallback polls of an empty queue, doubling from one to the other.
    grace_period: seconds a stopping worker waits for its handlers. maintain_every: apply
    the archive retention and forget expired dedup keys every so many seconds (None: leave it
    to `pgbroker maintain`).
    """

    def __init__(
        self,
        queue: str,
        handler: Handler,
        *,
        concurrency: int = 1,
        batch_size: int | None = None,
        vt: int = 30,
        heartbeat: bool = True,
        notify: bool = True,
        poll_min: float = 0.05,
        poll_max: float = 5.0,
        grace_period: float = 30.0,
        maintain_every: float | None = None,
    ) -> None:
        if not callable(handler):
            raise InvalidArgument(f"handler must be callable, got {handler!r}")
        self.queue = queue
        self.handler = handler
        self.concurrency = _check_count(concurrency, "concurrency")
        self.batch_size = _check_count(batch_size if batch_size is not None else concurrency, "batch_size")
        self.vt = _check_count(vt, "vt")
        self.heartbeat = heartbeat
        self.notify = notify
        self.poll_min = _check_seconds(poll_min, "poll_min")
        self.poll_max = max(self.poll_min, _check_seconds(poll_max, "poll_max"))
        self.grace_period = _check_seconds(grace_period, "grace_period", positive=False)
        self.maintain_every = (
            None if maintain_every is None else _check_seconds(maintain_every, "maintain_every")
        )
        self.stats = WorkerStats()
        call = getattr(handler, "__call__", None)  # noqa: B004 - a callable object with an async __call__
        self._is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)
        self._in_flight: dict[asyncio.Task[None], _Lease] = {}
        self._stopping = asyncio.Event()
        self._hurry = False
        self._changed = asyncio.Event()  # a slot came free, or stop() was called

    def __repr__(self) -> str:
        return f"Worker({self.queue!r}, {getattr(self.handler, '__qualname__', self.handler)!r})"

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def stop(self, *, grace_period: float | None = None) -> None:
        """Stop reading and let run() drain; call on the worker's event loop.

        grace_period overrides the worker's own (0: give back what is in flight now).
        """
        if grace_period is not None:
            self.grace_period = _check_seconds(grace_period, "grace_period", positive=False)
            self._hurry = self.grace_period == 0
        self._stopping.set()
        self._changed.set()

    async def run(self, broker: AsyncBroker) -> None:
        """Consume until stop(), then drain. Raises what made consuming impossible (QueueNotFound)."""
        queue = broker.queue(self.queue)
        if self.notify:
            await self._enable_notify(queue)
        threads = None if self._is_async else HandlerThreads(self.concurrency, f"pgbroker-{self.queue}")
        completer = _Completer(queue, self.stats)
        helpers = [asyncio.create_task(completer.run(), name=f"pgbroker-ack-{self.queue}")]
        if self.maintain_every is not None:
            helpers.append(asyncio.create_task(self._maintain(queue), name=f"pgbroker-maintain-{self.queue}"))
        _log(
            logging.INFO,
            "worker.started",
            queue=self.queue,
            concurrency=self.concurrency,
            vt=self.vt,
            heartbeat=self.heartbeat,
            pid=os.getpid(),
        )
        try:
            await self._consume(queue, completer, threads)
        finally:
            self._stopping.set()
            await self._drain(queue)
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            if threads is not None:
                threads.close()
            _log(logging.INFO, "worker.stopped", queue=self.queue, **self._counts())

    def _counts(self) -> dict[str, int]:
        s = self.stats
        return {
            "completed": s.completed,
            "retried": s.retried,
            "dead_lettered": s.dead_lettered,
            "stale": s.stale,
            "released": s.released,
        }

    async def _enable_notify(self, queue: AsyncQueue) -> None:
        try:
            await queue.enable_notify(keep_existing=True)
        except QueueNotFound:
            raise
        except PgbrokerError as exc:
            # A role that may not create triggers, say: the worker still works, by polling.
            _log(
                logging.WARNING,
                "worker.notify_unavailable",
                queue=self.queue,
                poll_max=self.poll_max,
                error=exc,
            )

    # -- reading ---------------------------------------------------------------------------

    async def _consume(
        self, queue: AsyncQueue, completer: _Completer, threads: HandlerThreads | None
    ) -> None:
        idle = Backoff(self.poll_min, self.poll_max)
        trouble = Backoff(*_RECONNECT)
        unavailable = False
        subscription: AsyncSubscription | None = None
        # Read when this many slots are free, so that fast handlers share reads.
        refill = min(self.batch_size, max(1, self.concurrency // 2))
        while not self._stopping.is_set():
            await self._until(lambda: self.concurrency - self.in_flight >= refill)
            if self._stopping.is_set():
                return
            try:
                if subscription is None:
                    subscription = await queue.listen(_LISTEN_TIMEOUT)
                qty = min(self.batch_size, self.concurrency - self.in_flight)
                self.stats.reads += 1
                messages = await queue.read_many(qty, vt=self.vt)
            except Exception as exc:
                if not _is_transient(exc):
                    raise
                self.stats.connection_errors += 1
                # Once per outage at WARNING; the retries at DEBUG.
                _log(
                    logging.DEBUG if unavailable else logging.WARNING,
                    "worker.database_unavailable",
                    queue=self.queue,
                    error=exc,
                )
                unavailable = True
                await self._nap(None, trouble.next())
                continue
            if unavailable:
                _log(logging.WARNING, "worker.database_available", queue=self.queue)
                unavailable = False
                trouble.reset()
            self.stats.received += len(messages)
            for message in messages:
                self._start(queue, completer, threads, message)
            if messages:
                idle.reset()
            else:
                await self._nap(subscription, idle.next())

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not (ready() or self._stopping.is_set()):
            self._changed.clear()
            await self._changed.wait()

    async def _nap(self, subscription: AsyncSubscription | None, seconds: float) -> None:
        """Sleep until a notification of a send, stop(), or ``seconds`` have passed."""
        await nap(self._stopping, subscription, seconds)

    # -- one message -----------------------------------------------------------------------

    def _start(
        self, queue: AsyncQueue, completer: _Completer, threads: HandlerThreads | None, message: Message
    ) -> None:
        assert message.receipt is not None  # pgbroker.read hands out receipts
        lease = _Lease(message.receipt)
        task = asyncio.create_task(self._process(queue, completer, threads, message, lease))
        self._in_flight[task] = lease
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        self._changed.set()
        if not task.cancelled() and task.exception() is not None:
            _log(logging.ERROR, "worker.bug", queue=self.queue, error=repr(task.exception()))

    async def _process(
        self,
        queue: AsyncQueue,
        completer: _Completer,
        threads: HandlerThreads | None,
        message: Message,
        lease: _Lease,
    ) -> None:
        if self.heartbeat:
            lease.beat = asyncio.get_running_loop().call_later(self.vt / 3, self._beat, queue, lease)
        try:
            error = await self._handle(threads, message)
            async with lease.lock:  # an extend in flight finishes first: its receipt is the one to use
                if lease.over:
                    return
                lease.over = True
        finally:
            if lease.beat is not None:
                lease.beat.cancel()
        if error is None:
            await self._complete(completer, message, lease.receipt)
        else:
            await self._fail(queue, message, lease, error)

    async def _handle(self, threads: HandlerThreads | None, message: Message) -> Exception | None:
        if message.codec_error is not None:
            # The body cannot be decoded here (pgbroker.codecs): a failed delivery, so that the
            # policy retries it (another process may know the codec) and, in the end, dead-letters it.
            return message.codec_error
        try:
            if threads is None:
                await self.handler(message)
            else:
                await threads.run(self.handler, message)
        except Exception as exc:
            return exc
        return None

    def _beat(self, queue: AsyncQueue, lease: _Lease) -> None:
        lease.beat = asyncio.create_task(self._heartbeat(queue, lease))

    async def _heartbeat(self, queue: AsyncQueue, lease: _Lease) -> None:
        """Extend the lease every vt/3 seconds (the first extend is due now) until the outcome."""
        while True:
            async with lease.lock:
                if lease.over:
                    return
                held = lease.receipt
                try:
                    lease.receipt = await _retry_while_leased(
                        self.stats, held.lease / 1e6, partial(queue.extend, held, vt=self.vt)
                    )
                except Exception as exc:
                    lease.over = True
                    self.stats.stale += 1
                    _log(
                        logging.WARNING,
                        "worker.lease_lost",
                        queue=self.queue,
                        msg_id=held.msg_id,
                        delivery=held.read_ct,
                        error=exc.message if isinstance(exc, PgbrokerError) else exc,
                    )
                    return
            await asyncio.sleep(self.vt / 3)

    async def _complete(self, completer: _Completer, message: Message, receipt: Receipt) -> None:
        refused = await completer.complete(receipt)
        if refused is None:
            self.stats.completed += 1
            return
        self.stats.stale += 1
        _log(
            logging.WARNING,
            "worker.ack_refused",
            queue=self.queue,
            msg_id=message.msg_id,
            delivery=message.read_ct,
            reason=refused,
        )

    async def _fail(self, queue: AsyncQueue, message: Message, lease: _Lease, error: Exception) -> None:
        text = f"{type(error).__name__}: {error}"
        receipt = lease.receipt
        try:
            outcome = await _retry_while_leased(
                self.stats, receipt.lease / 1e6, lambda: queue.fail(receipt, error=text)
            )
        except Exception as exc:
            self.stats.stale += 1
            _log(
                logging.WARNING,
                "worker.failure_not_recorded",
                queue=self.queue,
                msg_id=message.msg_id,
                delivery=message.read_ct,
                error=text,
                why=exc.message if isinstance(exc, PgbrokerError) else exc,
            )
            return
        if outcome == "dead_lettered":
            self.stats.dead_lettered += 1
            level, event = logging.WARNING, "worker.dead_lettered"
        else:
            self.stats.retried += 1
            level, event = logging.INFO, "worker.retry"
        _log(level, event, queue=self.queue, msg_id=message.msg_id, delivery=message.read_ct, error=text)
        log.debug("handler traceback", exc_info=error)

    # -- stopping and maintenance ----------------------------------------------------------

    async def _drain(self, queue: AsyncQueue) -> None:
        """Wait up to the grace period for the handlers in flight, then give back the rest."""
        if self._in_flight and not self._hurry:
            _log(
                logging.INFO,
                "worker.draining",
                queue=self.queue,
                in_flight=self.in_flight,
                grace_period=self.grace_period,
            )
            with suppress(TimeoutError):
                async with asyncio.timeout(self.grace_period):
                    await self._until_drained()
        leftover = list(self._in_flight.items())
        receipts = []
        for task, lease in leftover:
            if not lease.over:  # still in its handler (otherwise its outcome is being recorded)
                lease.over = True
                receipts.append(lease.receipt)
            task.cancel()
        await asyncio.gather(*(task for task, _ in leftover), return_exceptions=True)
        if receipts:
            try:
                released = await queue.nack_many(receipts)
            except Exception as exc:
                released = []
                _log(logging.WARNING, "worker.release_failed", queue=self.queue, error=exc)
            self.stats.released += len(released)
            _log(
                logging.WARNING,
                "worker.released",
                queue=self.queue,
                messages=len(released),
                unfinished=len(receipts),
            )

    async def _until_drained(self) -> None:
        while self._in_flight and not self._hurry:
            self._changed.clear()
            await self._changed.wait()

    async def _maintain(self, queue: AsyncQueue) -> None:
        assert self.maintain_every is not None
        while True:
            await asyncio.sleep(self.maintain_every)
            trimmed = 0
            try:
                # Each batch is its own short transaction.
                while batch := await queue.trim_archive():
                    trimmed += batch
                while await queue.trim_dedup_keys():  # expired dedup keys (34_dedup.sql)
                    pass
            except Exception as exc:
                _log(logging.WARNING, "worker.maintenance_failed", queue=self.queue, error=exc)
            if trimmed:
                _log(logging.INFO, "worker.archive_trimmed", queue=self.queue, rows=trimmed)
