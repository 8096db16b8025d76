"""The worker runtime: a handler consumes a queue with N messages in flight per process.

A Worker reads batches sized to its free slots and runs each message's handler: an async
handler on the event loop, a sync one on the worker's threads. The outcome goes through the
queue's policy, in SQL: success -> pgbroker.complete (archive or delete), an exception ->
pgbroker.fail (back in the queue after the back-off, or dead-lettered after max_deliveries).

Round trips are few: a handler's outcome waits in the outbox (pgbroker.runtime._outbox) for the next
read, and the outcomes of a batch and that read go in one transaction and one round trip
(pgbroker.runtime._round_trips); outcomes that no read takes along within 50 ms (every slot
busy with slow handlers, or the queue empty) are sent on their own. On the common success path
a message costs no round trip of its own.

While handlers run, one heartbeat extends, in one call, the leases of all those past a third
of their vt. Each extend hands out a new receipt and spends the old one, so the heartbeat and
the outcome of a message take turns on its lease. A handler that outlives its lease (no
heartbeat, or the database away for longer than the lease) cannot ack: another consumer has
the message by then. That is counted as ``stale`` and logged, never retried here.

The leases and their heartbeat's calls are in pgbroker.runtime._leases; what the server made
of the outcomes (counted, logged, the reason of a refusal) in pgbroker.runtime._outcomes.

Calls that fail because the connection is lost (a restart, a terminated session, a server gone
read-only), or that go unanswered for a lease (a hung server or pooler, a connection cut without a
word: _db.liveness.answered_within), are retried while the lease still holds; fenced receipts make a
retried ack safe, so a restart of Postgres in place costs no duplicate handling. Every such
failure, a failed LISTEN set-up included, leads to a bounded wait and another read. A failover to a
standby is followed when the DSN names it; what each replication mode can lose is in
docs/operations.md.

An empty queue is waited on with LISTEN/NOTIFY; polls are the fallback, less frequent the
longer the queue stays empty (``poll_min`` doubling up to ``poll_max``). Worker.stop() (or
SIGTERM/SIGINT under pgbroker.runtime._app.serve) stops reading, lets the handlers in flight (and the
messages read ahead for them) finish within ``grace_period``, sends the outcomes still waiting,
and gives back (nacks) the messages that could not be handled in time; once stopping, each of
its database calls waits 3 s at most (pgbroker._db.liveness.stops_with), so that a database in
trouble does not hold the stop: what such a call held comes back after its lease. A read-ahead message
counts as delivered (read_ct), as one in flight does: a worker killed outright leaves both to
come back after their vt, one delivery further towards the queue's max_deliveries.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from contextlib import suppress
from functools import partial
from typing import Any, TypeAlias, TypeVar

from pgbroker import _tracing as tracing
from pgbroker._db.backoff import Backoff
from pgbroker._db.listen_async import AsyncSubscription, nap
from pgbroker._db.liveness import STOP_PATIENCE, answered_within, is_lost_connection, is_transient, stops_with
from pgbroker._db.schema_watch import SCHEMA_CHANGED_HINT, SchemaChanged, SchemaWatch
from pgbroker._event_loop import running_loop
from pgbroker.errors import InvalidArgument, PgbrokerError, QueueNotFound
from pgbroker.queues import _queries as q
from pgbroker.queues._client_async import AsyncBroker, AsyncQueue
from pgbroker.queues._query import Query
from pgbroker.queues._records import Message
from pgbroker.queues._refusal_watch import RefusalWatch
from pgbroker.runtime._handler_threads import HandlerThreads, handler_failure
from pgbroker.runtime._leases import (
    RECONNECT,
    Lease,
    WorkerCall,
    extend_leases,
    release_leases,
    retry_while_leased,
)
from pgbroker.runtime._log_events import log as worker_log
from pgbroker.runtime._log_events import log_event, log_failure, on_bug
from pgbroker.runtime._maintenance import maintenance_bound, maintenance_rounds
from pgbroker.runtime._outbox import Outbox, Outcome, batch_of
from pgbroker.runtime._outcomes import not_recorded, record_outcomes
from pgbroker.runtime._registration import Registration
from pgbroker.runtime._round_trips import run_together
from pgbroker.runtime._worker_stats import WorkerStats

__all__ = ["DEFAULT_MAX_DELIVERIES", "WORKER_REFUSALS", "Handler", "Worker", "WorkerStats"]

# Called with each message; a coroutine function is awaited, anything else runs on a thread.
# Returning normally is success; raising is a failure (see pgbroker.fail).
Handler: TypeAlias = Callable[[Message], Any]
T = TypeVar("T")

# Says at ERROR that the server refuses the connections of a process's workers (a password changed).
WORKER_REFUSALS = RefusalWatch(worker_log, "worker.database_refused", "worker")

# Deliveries a message gets from a worker when its queue's policy sets no max_deliveries: the
# count River and Sidekiq retry with, so finite that a poison message (or a first handler's bug)
# ends as a dead letter instead of coming back for ever, and, with the default policy's
# exponential back-off (1 s doubling to 300 s, jittered), spread over 42 to 84 minutes: long
# enough to ride out a deploy or a dependency's outage. The policy's max_deliveries wins if set.
DEFAULT_MAX_DELIVERIES = 25

# How long to wait for the LISTEN to be in place before the first read; reads do not need it.
_LISTEN_TIMEOUT = 1.0
# The throttle a worker turns notify on with, on a queue without it: a send more than 5 ms after
# the last announced one wakes the workers at once, where pgmq's 250 ms left most sends of a
# steady trickle to the polls (1,000 jobs a second, 10 a send, W = 16 in two processes: claim
# p50 / p99 7.9 / 21.7 ms with 250, 3.4 / 9.4 with 5). A notifying commit waits for Postgres'
# notify lock, so at most 200 a second: 15 senders of single messages made 12,500 sends a
# second against 12,900 with 250 (10,900 with 1 ms).
_NOTIFY_THROTTLE_MS = 5
# Pauses between tries to turn notify on after a refusal that passes: doubling up to a minute.
_NOTIFY_RETRY = (1.0, 60.0)
# While calls keep failing (the database away, or every read past a lock or statement timeout:
# the latter may last for good), the worker warns again this often, so that a worker that never
# gets through does not look idle after its first warning.
_UNAVAILABLE_REMINDER = 60.0
# Seconds an outcome waits for the next read to carry it before it is sent on its own.
_ACK_LINGER = 0.05
# Read-ahead: messages read beyond the free slots, held (leased) until a slot frees. As many as
# the handlers get through in _AHEAD_SECONDS at their measured pace, at most _MOST_AHEAD; none
# until a handler has finished, and none for handlers that take longer than that. Handlers
# faster than that get as many as they go through in _READS_AHEAD reads' measured round trips,
# if that is longer: a read's round trip on a loaded server (a commit's flush, say) must not
# leave the slots waiting for it. The most is four reads of _READ_MOST: with 1,000, a worker of
# 64 slots of 1 ms on a machine whose reads took 25 ms kept its slots 75-77% busy, with 2,000
# 94-97% (19,800 -> 21,600-23,100 messages a second).
_AHEAD_SECONDS = 0.05
_MOST_AHEAD = 2000
# Most messages a read asks for, unless batch_size says otherwise.
_READ_MOST = 500
_READS_AHEAD = 3
# Reads in flight at once, each on its own connection: the server serves one while the handlers
# go through what the last one brought.
_READS_AT_ONCE = 2
# Messages a slot handles one after the other before it lets the event loop run others.
_SLOT_TURN = 32
# Why an outcome was not recorded when the stop's patience ran out before the database answered.
_STOPPED_UNANSWERED = (
    f"stopped with no answer from the database within {STOP_PATIENCE:g} s: delivered again after its lease"
)
# Messages handled between two sizings of the capacity (_size_capacity; reads size it too): each
# moves the handlers' average by a tenth of the way, so a few change little.
_SIZE_EVERY = 32


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

    concurrency: messages in flight at once. Fast handlers also get a read-ahead: as many more
    messages as they handle in about 50 ms, or in three reads' round trips if longer (at most
    2,000, none for slow handlers), held leased until a slot frees, so that even one slot shares
    its reads and acks among many messages and never waits for a slow read.
    batch_size: most messages per read (default: the larger of concurrency and 500); a read is
    made once half of what may be held is free, so that reads are shared. vt: lease seconds.
    heartbeat: extend leases of slow handlers (and of read-ahead messages) every vt/3 seconds.
    Without it, a read-ahead message whose lease runs out before a slot takes it is not handled:
    it comes back through a read (stats.stale counts it).
    notify: enable notify on the queue if it has none (with a 5 ms throttle: a send wakes an
    idle worker within milliseconds; a queue's own throttle is kept), so an idle worker sleeps
    until a send. poll_min and
    poll_max: the fallback polls of an empty queue, doubling from one to the other.
    max_deliveries: a failed message's last delivery when the queue's policy sets none (default
    25; None: retry for ever): it is then dead-lettered, to the policy's dead-letter queue or,
    without one, to the queue's archive (`pgbroker dlq list QUEUE`), with a WARNING.
    grace_period: seconds a stopping worker waits for its handlers. maintain_every: apply
    the archive retention and forget expired dedup keys every so many seconds (None: leave it
    to `pgbroker maintain`); a role that may not (the consumer role) logs a warning once and the
    worker goes on without it.
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
        poll_min: float = 0.01,
        poll_max: float = 5.0,
        grace_period: float = 30.0,
        maintain_every: float | None = None,
        max_deliveries: int | None = DEFAULT_MAX_DELIVERIES,
    ) -> None:
        if not callable(handler):
            raise InvalidArgument(f"handler must be callable, got {handler!r}")
        self.queue = queue
        self.handler = handler
        self.concurrency = _check_count(concurrency, "concurrency")
        self.batch_size = _check_count(
            batch_size if batch_size is not None else max(concurrency, _READ_MOST), "batch_size"
        )
        self.vt = _check_count(vt, "vt")
        self.heartbeat = heartbeat
        self.notify = notify
        self.poll_min = _check_seconds(poll_min, "poll_min")
        self.poll_max = max(self.poll_min, _check_seconds(poll_max, "poll_max"))
        self.grace_period = _check_seconds(grace_period, "grace_period", positive=False)
        self.maintain_every = (
            None if maintain_every is None else _check_seconds(maintain_every, "maintain_every")
        )
        self.max_deliveries = (
            None if max_deliveries is None else _check_count(max_deliveries, "max_deliveries")
        )
        self.stats = WorkerStats()
        call = getattr(handler, "__call__", None)  # noqa: B004 - a callable object with an async __call__
        self._is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)
        self._in_flight: dict[asyncio.Task[None], Lease] = {}
        # Read ahead, not started yet: started as slots free, given back at stop.
        self._ahead: deque[tuple[Message, Lease]] = deque()
        self._handler_seconds: float | None = None  # moving average of the handlers' time
        self._read_seconds = 0.0  # moving average of a read's round trip
        # What may be held (the slots and a read-ahead), and the room a read waits for: sized
        # again as the averages move
        self._held_most = self._read_room = 0
        self._size_capacity()
        self._handled = 0
        self._threads: HandlerThreads | None = None
        self._asked = 0  # messages asked for by the reads in flight
        self._unavailable = False  # the last call lost its connection
        self._schema = SchemaWatch()  # tells an upgrade from a bug when the schema is found wanting
        self._warned_at = 0.0  # when worker.database_unavailable was last logged at WARNING
        self._stopping = asyncio.Event()
        self._hurry = False
        self._changed = asyncio.Event()  # a slot came free, or stop() was called
        self._outbox = Outbox(queue)
        self._closing = asyncio.Event()  # the outbox's sender sends what is left, then ends
        self._bug = on_bug("worker.bug", queue=queue)  # a task of the worker's that ended in error

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
        # Once stopping, a call (a read, an ack, a release, the deregistration) waits for its
        # answer STOP_PATIENCE seconds at most, whatever the database does.
        with stops_with(self._stopping):
            async with WORKER_REFUSALS.watching(broker):  # joins serve()'s, one per pool
                await self._run(broker)

    async def _run(self, broker: AsyncBroker) -> None:
        queue = broker.queue(self.queue)
        self._unavailable = False
        notify_later = self.notify and await self._enable_notify(queue)
        threads = None if self._is_async else HandlerThreads(self.concurrency, f"pgbroker-{self.queue}")
        self._threads = threads
        flusher = asyncio.create_task(self._send_lingering(broker), name=f"pgbroker-ack-{self.queue}")
        helpers = []
        if notify_later:
            helpers.append(
                asyncio.create_task(self._enable_notify_later(queue), name=f"pgbroker-notify-{self.queue}")
            )
        if self.heartbeat:
            beats = self._heartbeats(queue, partial(self._call, broker))
            helpers.append(asyncio.create_task(beats, name=f"pgbroker-beat-{self.queue}"))
        if self.maintain_every is not None:
            maintaining = self._maintain(queue, self.maintain_every)
            helpers.append(asyncio.create_task(maintaining, name=f"pgbroker-maintain-{self.queue}"))
        registration = Registration(self.queue, self.concurrency)
        helpers.append(
            asyncio.create_task(registration.keep(broker, self._beat), name=f"pgbroker-register-{self.queue}")
        )
        for task in (flusher, *helpers):
            task.add_done_callback(self._bug)
        log_event(
            logging.INFO,
            "worker.started",
            queue=self.queue,
            concurrency=self.concurrency,
            vt=self.vt,
            heartbeat=self.heartbeat,
            default_max_deliveries=self.max_deliveries,
            pid=os.getpid(),
            loop=running_loop(),
        )
        try:
            await self._consume(broker, queue, threads)
        finally:
            self._stopping.set()
            await self._wait_for_handlers()
            # The heartbeat ends first: an extend in flight on a hung server would hold the release.
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            # Side by side: each waits up to STOP_PATIENCE on a database in trouble.
            await asyncio.gather(
                self._give_back(queue, partial(self._call, broker)),
                self._send_the_rest(flusher),
                registration.end(broker),
            )
            if threads is not None:
                threads.close()
            log_event(logging.INFO, "worker.stopped", queue=self.queue, **self._counts())

    def _beat(self) -> tuple[int, WorkerStats]:
        """What the worker holds now (handlers running, messages read ahead), and its stats."""
        return len(self._in_flight) + len(self._ahead), self.stats

    def _counts(self) -> dict[str, int]:
        s = self.stats
        return {
            "completed": s.completed,
            "retried": s.retried,
            "dead_lettered": s.dead_lettered,
            "stale": s.stale,
            "released": s.released,
        }

    async def _enable_notify(self, queue: AsyncQueue) -> bool:
        """Turn notify on; whether to try again later. A lost connection (the database restarting
        as the worker starts) is waited out as for reads: it stopped the worker, or left it without
        notify; so is a call unanswered within the lease (a hung server: the worker never started).
        A refusal that passes (a lock or statement timeout, a deadlock) is not: the worker reads
        meanwhile, without notify, and tries again later (_enable_notify_later), where it stayed
        without notify for good, each send waiting for a poll."""
        trouble = Backoff(*RECONNECT)
        while not self._stopping.is_set():
            try:
                await answered_within(self.vt, queue.enable_notify(_NOTIFY_THROTTLE_MS, keep_existing=True))
                return False
            except QueueNotFound:
                raise
            except Exception as exc:
                if is_lost_connection(exc) and self._lost_connection(exc, []):
                    await self._nap(None, trouble.next())
                    continue
                if not isinstance(exc, PgbrokerError):
                    raise
                # A refusal that passes is tried again later. A role that may not turn notify on (a
                # consumer's): the worker still works, by polling; its owner's notify, once on, wakes it.
                later = is_transient(exc)
                hint = (
                    "tried again later"
                    if later
                    else f"Sends reach this worker at its next poll, {self.poll_max:g} s at most; the "
                    "queue's owner can turn notify on once: "
                    f"SELECT pgmq.enable_notify_insert('{self.queue}', {_NOTIFY_THROTTLE_MS})"
                )
                log_event(
                    logging.WARNING,
                    "worker.notify_unavailable",
                    queue=self.queue,
                    poll_max=self.poll_max,
                    error=exc,
                    hint=hint,
                )
                return later
        return False

    async def _enable_notify_later(self, queue: AsyncQueue) -> None:
        """Try to turn notify on again, less often each time, until it is on (or refused for good)."""
        retry = Backoff(*_NOTIFY_RETRY)
        while True:
            await self._nap(None, retry.next())
            if self._stopping.is_set() or not await self._enable_notify(queue):
                return

    # -- reading, with the outcomes of the last messages -----------------------------------

    async def _consume(self, broker: AsyncBroker, queue: AsyncQueue, threads: HandlerThreads | None) -> None:
        """Read while there is room, up to _READS_AT_ONCE reads in flight (on their own
        connections), so that the server serves one while the handlers go through the last."""
        idle = Backoff(self.poll_min, self.poll_max)
        trouble = Backoff(*RECONNECT)
        subscription: AsyncSubscription | None = None
        # A read in flight: how many it asks for, the outcomes it carries, when it was asked for.
        reads: dict[asyncio.Task[list[Message]], tuple[int, list[Outcome], float]] = {}
        pause: float | None = None  # an empty queue or a lost connection: sleep once the reads are back
        try:
            while not self._stopping.is_set():
                await self._until(partial(self._read_due, reads, pause is None))
                if self._stopping.is_set():
                    return
                for task in [t for t in reads if t.done()]:
                    qty, outcomes, asked_at = reads.pop(task)
                    self._asked -= qty
                    found = self._read_back(task, outcomes, asked_at)
                    if found is None:
                        pause, subscription = trouble.next(), None
                    elif found:
                        idle.reset()
                        trouble.reset()
                        pause = None
                        if subscription is not None:
                            subscription.confirm()  # the wake-up, if one led here, was news
                    elif pause is None:
                        pause = idle.next()
                        trouble.reset()
                if pause is not None:
                    if reads:
                        continue  # first what they bring
                    await self._nap(subscription, pause)
                    pause = None
                    continue
                if not self._may_read(reads):
                    continue
                if subscription is None:
                    try:
                        # Bounded as every call: its set-up asks the server for the channel.
                        subscription = await self._call(broker, queue.listen(_LISTEN_TIMEOUT))
                    except Exception as exc:
                        if not self._lost_connection(exc, []):
                            raise
                        pause = trouble.next()
                        continue
                qty = min(self.batch_size, self._room() - self._asked)
                if qty <= 0:
                    continue  # the room went while subscribing: the handlers' pace moves it
                outcomes = self._outbox.take()
                self._asked += qty
                self.stats.reads += 1
                asked_at = time.monotonic()
                task = asyncio.create_task(self._read(broker, outcomes, qty))
                task.add_done_callback(lambda _: self._changed.set())
                reads[task] = (qty, outcomes, asked_at)
        finally:
            # Reads still in flight (cut short at the stop's patience, stops_with): their messages are
            # held, and given back by _give_back.
            await asyncio.gather(*reads, return_exceptions=True)
            for task, (qty, outcomes, asked_at) in reads.items():
                self._asked -= qty
                with suppress(Exception):
                    self._read_back(task, outcomes, asked_at)

    def _read_due(self, reads: Mapping[asyncio.Task[list[Message]], object], may_read: bool) -> bool:
        """A read came back, or there is room for another; when napping, once no read is left
        in flight (the nap comes next: waiting for a read that was never sent would be for good)."""
        if any(task.done() for task in reads):
            return True
        return self._may_read(reads) if may_read else not reads

    def _may_read(self, reads: Mapping[asyncio.Task[list[Message]], object]) -> bool:
        """Room for a read: half of what may be held is free (so that reads are shared)."""
        if len(reads) >= _READS_AT_ONCE:
            return False
        return self._room_for_read()

    def _room_for_read(self) -> bool:
        # Asked after every message handled: the threshold is kept by _size_capacity.
        return self._room() - self._asked >= self._read_room

    def _read_back(
        self, task: asyncio.Task[list[Message]], outcomes: list[Outcome], asked_at: float
    ) -> list[Message] | None:
        """Take in what a read asked for at ``asked_at`` (monotonic) brought: its messages (held,
        and started as slots free), or None after a lost connection (its outcomes go back to the
        outbox). Raises any other error."""
        try:
            messages = task.result()
        except Exception as exc:
            if not self._lost_connection(exc, outcomes):
                raise
            return None
        if self._unavailable:
            log_event(logging.WARNING, "worker.database_available", queue=self.queue)
            self._unavailable = False
        self.stats.received += len(messages)
        ends = asked_at + self.vt  # the server started the leases later, on its own clock
        for message in messages:
            assert message.receipt is not None  # pgbroker.read hands out receipts
            self._ahead.append((message, Lease(message.receipt, ends)))
        self._start_ahead()
        return messages

    def _lost_connection(self, exc: Exception, outcomes: list[Outcome]) -> bool:
        """Whether ``exc`` is a lost connection (logged; the call is worth another try later).
        The outcomes the call carried go back to the outbox either way: its sender tries them
        again (fenced receipts make a second ack safe)."""
        self._outbox.put_back(outcomes)
        if isinstance(exc, SchemaChanged):
            log_event(
                logging.WARNING,
                "worker.schema_changed",
                queue=self.queue,
                error=exc,
                hint=SCHEMA_CHANGED_HINT,
            )
            return True
        if not is_transient(exc):
            return False
        self.stats.connection_errors += 1
        if outcomes:
            log_event(logging.INFO, "worker.retrying", error=exc, outcomes=len(outcomes))
        # At WARNING once per outage, and again every _UNAVAILABLE_REMINDER seconds while it lasts;
        # the retries in between at DEBUG.
        now = time.monotonic()
        warn = not self._unavailable or now - self._warned_at >= _UNAVAILABLE_REMINDER
        if warn:
            self._warned_at = now
        log_event(
            logging.WARNING if warn else logging.DEBUG,
            "worker.database_unavailable",
            queue=self.queue,
            error=exc,
        )
        self._unavailable = True
        return True

    def _call(self, broker: AsyncBroker, call: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """A call on the leases the worker holds (a read and its acks, an extend, a give-back):
        through the SchemaWatch, which tells an upgrade from a bug, its answer awaited at most vt
        (a lease: past it the call is of no use)."""
        return answered_within(self.vt, self._schema.call(broker, call))

    async def _read(self, broker: AsyncBroker, outcomes: list[Outcome], qty: int) -> list[Message]:
        """An exchange that reads, its round trip timed (the read-ahead covers a few)."""
        started = time.perf_counter()
        found = await self._exchange(broker, outcomes, qty)
        took = time.perf_counter() - started
        self._read_seconds = 0.9 * self._read_seconds + 0.1 * took if self._read_seconds else took
        self._size_capacity()
        return found

    async def _exchange(self, broker: AsyncBroker, outcomes: list[Outcome], qty: int) -> list[Message]:
        """One round trip and one transaction: record ``outcomes`` and read up to ``qty`` messages
        (a span of them, when tracing: pgbroker.tracing)."""
        started = tracing.clock()
        read = await self._call(broker, self._round_trip(broker, outcomes, qty))
        tracing.exchanged(self.queue, started, read, len(outcomes))
        return read

    async def _round_trip(self, broker: AsyncBroker, outcomes: list[Outcome], qty: int) -> list[Message]:
        """The common case, successes and a read, is one statement; failures (one statement per
        error text) go with them in pipeline mode."""
        batch = batch_of(self.queue, outcomes, self.max_deliveries)
        async with broker.connection() as conn:
            if qty and batch.successes and not batch.failures:
                [(acked, found)] = await run_together(
                    conn,
                    [
                        q.message_complete_and_read(
                            self.queue, [o.receipt for o in batch.successes], qty, vt=self.vt
                        )
                    ],
                )
                await record_outcomes(broker.queue(self.queue), batch, set(acked), {}, self.stats)
                read: list[Message] = found
                return read
            queries: list[Query[Any]] = batch.queries()
            if qty:
                queries.append(q.message_read_many(self.queue, qty, vt=self.vt))
            results = await run_together(conn, queries, shared=broker.single_connection)
        messages: list[Message] = results.pop() if qty else []
        if outcomes:
            await record_outcomes(broker.queue(self.queue), batch, *batch.results(results), self.stats)
        return messages

    async def _send_lingering(self, broker: AsyncBroker) -> None:
        """Send the outcomes that no read took along within _ACK_LINGER seconds; at the end, all."""
        outbox = self._outbox
        while True:
            if not outbox:
                if self._closing.is_set():
                    return
                outbox.changed.clear()
                await outbox.changed.wait()
                continue
            wait = _ACK_LINGER - outbox.waited()
            if wait > 0 and not self._closing.is_set():
                # Not woken by each outcome added meanwhile: one wake-up a linger at most.
                with suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._closing.wait()
                continue
            outcomes = outbox.take()
            lease_ends = max(outcome.lease_ends for outcome in outcomes)
            try:
                await retry_while_leased(self.stats, lease_ends, partial(self._exchange, broker, outcomes, 0))
            except Exception as exc:
                for outcome in outcomes:
                    not_recorded(self.queue, outcome, f"the ack failed: {exc}", self.stats)
            except asyncio.CancelledError:  # the stop's patience ran out (_send_the_rest)
                for outcome in [*outcomes, *outbox.take()]:
                    not_recorded(self.queue, outcome, _STOPPED_UNANSWERED, self.stats)
                raise

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not (ready() or self._stopping.is_set()):
            self._changed.clear()
            await self._changed.wait()

    async def _nap(self, subscription: AsyncSubscription | None, seconds: float) -> None:
        """Sleep until a notification of a send, stop(), or ``seconds`` have passed."""
        await nap(self._stopping, subscription, seconds)

    # -- one message -----------------------------------------------------------------------

    def _size_capacity(self) -> None:
        """Size what may be held (the slots, and the read-ahead the handlers' pace allows) from
        the handlers' pace and the reads' round trip (their averages), and the room a read
        waits for: half of it, so that reads are shared, at most a batch."""
        self._held_most = self.concurrency + self._read_ahead()
        self._read_room = min(self.batch_size, max(1, self._held_most // 2))

    def _read_ahead(self) -> int:
        pace = self._handler_seconds
        if pace is None:
            return 0
        if pace <= 0:
            return _MOST_AHEAD
        horizon = (
            _AHEAD_SECONDS
            if pace > _AHEAD_SECONDS
            else max(_AHEAD_SECONDS, _READS_AHEAD * self._read_seconds)
        )
        return min(_MOST_AHEAD, int(horizon * self.concurrency / pace))

    def _room(self) -> int:
        return self._held_most - len(self._in_flight) - len(self._ahead)

    def _start_ahead(self) -> None:
        """Start a slot for read-ahead messages while slots are free."""
        while self.in_flight < self.concurrency and not self._hurry:
            taken = self._next_ahead()
            if taken is None:
                return
            task = asyncio.create_task(self._slot(*taken))
            self._in_flight[task] = taken[1]
            task.add_done_callback(self._finished)

    def _next_ahead(self) -> tuple[Message, Lease] | None:
        """The next read-ahead message whose lease still runs.

        Those whose lease ran out while they waited (no heartbeat, and handlers slower than the
        read-ahead was sized for: a loaded machine, say) are left to come back through a read:
        handled now, their outcome could only be refused, and another consumer may have them
        already. Handled all the same, they kept every message read after them waiting past its
        own lease in turn, and a worker of one slot made no progress at all.
        """
        now = time.monotonic()
        expired = 0
        taken = None
        while self._ahead:
            message, lease = self._ahead.popleft()
            if lease.ends > now:
                taken = (message, lease)
                break
            lease.over = True
            expired += 1
        if expired:
            self.stats.stale += expired
            self._changed.set()  # room for a read
            log_event(
                logging.WARNING, "worker.read_ahead_expired", queue=self.queue, messages=expired, vt=self.vt
            )
        return taken

    async def _slot(self, message: Message, lease: Lease) -> None:
        """One slot: handle ``message``, then the next read-ahead one while there is one.

        A slot lives as long as there is work for it, rather than a task per message: each
        task costs its creation and two turns of the event loop, a fair share of a fast
        handler's time. It yields every _SLOT_TURN messages, so that a handler that never
        suspends does not starve the reads and the heartbeat.
        """
        task = asyncio.current_task()
        assert task is not None
        handled = 0
        while True:
            await self._process(self._threads, message, lease)
            if self._room_for_read():  # the reader waits for that alone: not woken for less
                self._changed.set()
            if not self._ahead or self._hurry:
                return
            handled += 1
            if handled % _SLOT_TURN == 0:
                await asyncio.sleep(0)
                if not self._ahead or self._hurry:
                    return
            taken = self._next_ahead()
            if taken is None:
                return
            message, lease = taken
            self._in_flight[task] = lease

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._in_flight.pop(task, None)
        self._start_ahead()
        self._changed.set()
        self._bug(task)

    async def _process(self, threads: HandlerThreads | None, message: Message, lease: Lease) -> None:
        started = time.perf_counter()
        error = await self._handle(threads, message)
        took = time.perf_counter() - started
        pace = self._handler_seconds
        self._handler_seconds = took if pace is None else 0.9 * pace + 0.1 * took
        self._handled += 1
        if pace is None or self._handled % _SIZE_EVERY == 0:
            self._size_capacity()
        if lease.extending is not None:  # an extend in flight finishes first: its receipt is the one to use
            await asyncio.shield(lease.extending)
        if lease.over:  # lost, or given back at shutdown
            return
        lease.over = True
        if error is None:
            self._outbox.add(Outcome.success(message, lease.receipt, lease.ends))
        else:
            self._outbox.add(Outcome.failure(message, lease.receipt, lease.ends, error))

    async def _handle(self, threads: HandlerThreads | None, message: Message) -> Exception | None:
        if message.codec_error is not None:
            # The body cannot be decoded here (pgbroker.codecs): a failed delivery, so that the
            # policy retries it (another process may know the codec) and, in the end, dead-letters it.
            return message.codec_error
        try:
            with tracing.processing(self.queue, message.headers, message.msg_id):
                if threads is None:
                    await self.handler(message)
                else:
                    await threads.run(self.handler, message)
        except (Exception, asyncio.CancelledError) as raised:
            exc = handler_failure(raised)
            # At WARNING, traceback included: a first handler's bug must show without -v, or
            # the worker looks idle while every message fails.
            log_failure(
                "worker.handler_failed",
                exc,
                queue=self.queue,
                msg_id=message.msg_id,
                delivery=message.read_ct,
                error=f"{type(exc).__name__}: {exc}",
            )
            return exc
        return None

    async def _heartbeats(self, queue: AsyncQueue, worker_call: WorkerCall) -> None:
        """Extend, in one call, every lease of a handler still running past a third of its vt.

        Each extend hands out a new receipt and spends the old one: a handler that returns
        meanwhile waits for it (``lease.extending``) and records its outcome with the new one.
        """
        while True:
            await asyncio.sleep(self.vt / 6)
            now = time.monotonic()
            held = [*self._in_flight.values(), *(lease for _, lease in self._ahead)]
            due = [lease for lease in held if not lease.over and lease.ends - now < 2 * self.vt / 3]
            if due:
                await extend_leases(queue, due, self.vt, self.stats, worker_call)

    # -- stopping and maintenance ----------------------------------------------------------

    async def _wait_for_handlers(self) -> None:
        """Wait up to the grace period for the handlers in flight and what was read ahead (fast
        handlers, by construction: handling it spares its message a delivery count)."""
        if (self._in_flight or self._ahead) and not self._hurry:
            log_event(
                logging.INFO,
                "worker.draining",
                queue=self.queue,
                in_flight=self.in_flight,
                read_ahead=len(self._ahead),
                grace_period=self.grace_period,
            )
            with suppress(TimeoutError):
                async with asyncio.timeout(self.grace_period):
                    await self._until_drained()

    async def _give_back(self, queue: AsyncQueue, worker_call: WorkerCall) -> None:
        """Nack what was read ahead and the handlers still running (then cancelled)."""
        ahead = [lease for _, lease in self._ahead]
        self._ahead.clear()
        leftover = list(self._in_flight.items())
        await release_leases(queue, ahead + [lease for _, lease in leftover], self.stats, worker_call)
        for task, _ in leftover:
            task.cancel()
        await asyncio.gather(*(task for task, _ in leftover), return_exceptions=True)

    async def _send_the_rest(self, flusher: asyncio.Task[None]) -> None:
        """Let the outbox's sender send the outcomes still waiting, then end: within STOP_PATIENCE,
        then it is cancelled (the database away or hung: those messages come back after their
        lease, handled again: at-least-once)."""
        self._closing.set()
        self._outbox.changed.set()
        done, _ = await asyncio.wait([flusher], timeout=STOP_PATIENCE)
        if not done:
            flusher.cancel()
        await asyncio.gather(flusher, return_exceptions=True)

    async def _until_drained(self) -> None:
        while (self._in_flight or self._ahead) and not self._hurry:
            self._changed.clear()
            await self._changed.wait()

    async def _maintain(self, queue: AsyncQueue, every: float) -> None:
        within = maintenance_bound(every, self.vt)

        async def one_round() -> None:
            trimmed = 0
            try:
                # Each batch is its own short transaction.
                while batch := await answered_within(within, queue.trim_archive()):
                    trimmed += batch
                while await answered_within(within, queue.trim_dedup_keys()):  # expired keys (34_dedup.sql)
                    pass
            finally:
                if trimmed:
                    log_event(logging.INFO, "worker.archive_trimmed", queue=self.queue, rows=trimmed)

        command = f"pgbroker maintain {self.queue}"
        await maintenance_rounds(every, one_round, "worker.maintenance", command, queue=self.queue)
