"""The worker runtime for streams: a handler on a stream and a consumer group.

A StreamWorker is one consumer of the group. It reads batches from the partitions it owns and
runs the handler on every message, up to ``concurrency`` at once: the messages of one key one
after another, in the log's order, and different keys side by side, even in one partition and
across batches (pgbroker.runtime._stream_dispatch: a batch read ahead starts on its other keys
while the one before finishes its last ones, so a slow message holds up its own key only). A
message without a key has no order to keep and runs beside any other. Batches are acked in the
order read, each as a whole, in the call that reads the next: one statement and one commit a
batch. After a full batch (a backlog) the next one is read at once, with at most two batches in
hand, so the handlers never wait for a round trip. Beyond its share of the partitions (a
consumer has joined) the worker reads no more from those it must give up: what it holds of them
is acked, and they change hands at its next read. A message whose handler raised is marked
failed in its batch; the ack sends it to the group's retry queue, where the queue's policy
applies (back-off, max deliveries, dead-letter queue). The worker also runs a queue Worker on
that retry queue with the same handler, which gets the message as a StreamMessage again (from
its x-pgbroker-stream header), so the handler sees one kind of message either way.

A read renews the consumer's lease. While batches are in hand a heartbeat renews it every
quarter lease, so batches that take longer to handle than the lease keep their partitions (the
others would find the lease over, take them and have the batches again while they are
handled). A beat that finds partitions of a batch taken all the same (the database was out of
reach for longer than the lease) drops what is left of them unhandled: their new owner has those
messages again, and handling them here too would run a key in two places at once. A call left
unanswered for a lease (a hung server or pooler, a connection cut without a word) is given up as
a lost connection, warned, and made again on a new session. A read that failed so may still run
once its session goes on: the rewind that settles it starts a new generation of the consumer, and
that late read is refused (docs/streams.md, "Generations").

A worker that dies acks nothing more: what it held is delivered again to whoever takes its
partitions over (at-least-once): at the other consumers' next read once its connections are
gone, at the end of its lease if it hangs connected. stop() reads no more, finishes the batches
in hand within the grace period, acks those done (in order) and releases the partitions, so
that the others take them over at once; what was not finished in time is delivered again to
them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Coroutine
from contextlib import suppress
from datetime import datetime
from functools import partial
from typing import Any, TypeAlias, TypeVar

from pgbroker import _tracing as tracing
from pgbroker._db.backoff import Backoff
from pgbroker._db.listen_async import AsyncSubscription, nap
from pgbroker._db.liveness import answered_within, is_transient, stops_with
from pgbroker._db.schema_watch import SCHEMA_CHANGED_HINT, SchemaChanged, SchemaWatch
from pgbroker._event_loop import running_loop
from pgbroker.errors import InvalidArgument, StreamConsumerSuperseded
from pgbroker.queues._client_async import AsyncBroker, blocking_sessions
from pgbroker.queues._records import Message
from pgbroker.runtime._handler_threads import HandlerThreads, awaited_result, handler_failure
from pgbroker.runtime._log_events import log_event, log_failure, on_bug
from pgbroker.runtime._maintenance import maintenance_bound, maintenance_rounds
from pgbroker.runtime._stream_dispatch import HeldBatch, KeyedDispatch, joined

# The queue worker's classification of connection errors and its log format, shared so that
# both runtimes log and retry alike.
from pgbroker.runtime._worker import Worker, WorkerStats
from pgbroker.streams._client_async import AsyncStream, AsyncStreamConsumer, consumer_name, list_streams
from pgbroker.streams._records import StreamBatch, StreamMessage

__all__ = ["StreamHandler", "StreamWorker", "stream_message_of"]

T = TypeVar("T")

# Called with each message; a coroutine function is awaited, anything else runs on a thread.
StreamHandler: TypeAlias = Callable[[StreamMessage], Any]

_RECONNECT = (0.05, 2.0)
_LISTEN_TIMEOUT = 1.0
# What to do about a session that holds the stream's tables up (docs/operations.md, "Long
# transactions").
_HELD_UP_HINT = (
    "its transaction, open longer than a lease, holds the stream's tables: retention cannot empty "
    "them nor the ring of positions rotate until it ends; see `pgbroker sessions`, end it with "
    "SELECT pg_terminate_backend(pid)"
)


def stream_message_of(message: Message) -> StreamMessage:
    """The stream message a retry-queue message was made from (its x-pgbroker-stream header)."""
    origin = (message.headers or {}).get("x-pgbroker-stream")
    if not isinstance(origin, dict):
        raise InvalidArgument(
            f"message {message.msg_id} did not come from a stream (no x-pgbroker-stream header)"
        )
    headers = {k: v for k, v in (message.headers or {}).items() if k != "x-pgbroker-stream"} or None
    return StreamMessage(
        stream=origin["stream"],
        partition=origin["partition"],
        id=origin["id"],
        epoch=-1,  # not read under a lease of the stream: it cannot ack the stream
        key=origin.get("key"),
        enqueued_at=datetime.fromisoformat(origin["enqueued_at"]),
        headers=headers,
        message=message.message,
    )


class StreamWorker:
    """One consumer of ``group`` on ``stream``, running ``handler``; ``await run(broker)``.

    batch_size: most messages a read. concurrency: handlers running at once (keys side by side, the
    messages of a key one after another); make batch_size several times it, since a batch is
    acked once its last message is handled.
    lease: seconds a consumer owns its partitions without reading (a killed one's move as soon as
    its connections are gone). poll_min/poll_max: the polls of an idle stream (sooner when the stream
    notifies). retries: also run the group's retry queue with the handler. grace_period:
    seconds a stopping worker waits for the batches in hand (what is not done is left unacked, to be
    delivered again). maintain_every: apply the stream's retention that often (seconds; None:
    leave it to `pgbroker stream maintain`); it empties child tables without waiting for locks,
    so several workers doing it cost little. A role that may not (the consumer role: retention is
    the owner's) logs a warning once and the worker goes on without it.
    """

    def __init__(
        self,
        stream: str,
        group: str,
        handler: StreamHandler,
        *,
        batch_size: int = 100,
        concurrency: int = 1,
        lease: int = 30,
        poll_min: float = 0.02,
        poll_max: float = 1.0,
        retries: bool = True,
        grace_period: float = 30.0,
        consumer: str | None = None,
        maintain_every: float | None = 60.0,
    ) -> None:
        if not callable(handler):
            raise InvalidArgument(f"handler must be callable, got {handler!r}")
        for value, what in ((batch_size, "batch_size"), (concurrency, "concurrency"), (lease, "lease")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{what} must be a whole number >= 1, got {value!r}")
        self.stream = stream
        self.group = group
        self.queue = f"{stream}/{group}"  # what serve() logs and reports it by
        self.handler = handler
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.lease = lease
        self.poll_min, self.poll_max = poll_min, max(poll_min, poll_max)
        self.retries = retries
        self.grace_period = grace_period
        self.consumer = consumer or consumer_name()
        self.maintain_every = maintain_every
        self.stats = WorkerStats()
        self._schema = SchemaWatch()  # tells an upgrade from a bug when the schema is found wanting
        call = getattr(handler, "__call__", None)  # noqa: B004 - a callable object with an async __call__
        self._is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)
        self._stopping = asyncio.Event()
        self._dispatch = KeyedDispatch()
        self._retry_worker: Worker | None = None
        self._retries_failure: BaseException | None = None  # what ended the retry worker, if not a stop

    def __repr__(self) -> str:
        return f"StreamWorker({self.stream!r}, {self.group!r}, consumer={self.consumer!r})"

    @property
    def in_flight(self) -> int:
        return self._dispatch.in_flight

    def stop(self, *, grace_period: float | None = None) -> None:
        """Stop reading; the batches in hand are finished and acked (within the grace period)."""
        if grace_period is not None:
            self.grace_period = grace_period
        self._stopping.set()
        self._dispatch.changed.set()  # wakes the loop
        if self._retry_worker is not None:
            self._retry_worker.stop(grace_period=grace_period)

    async def run(self, broker: AsyncBroker) -> None:
        # Once stopping, a call waits for its answer STOP_PATIENCE seconds at most.
        with stops_with(self._stopping):
            await self._run(broker)

    async def _run(self, broker: AsyncBroker) -> None:
        stream = AsyncStream(broker, self.stream)
        consumer = stream.consumer(self.group, name=self.consumer, lease=self.lease)
        self._retries_failure = None
        # The look-ups first: one that fails leaves no thread or task behind. Bounded by the lease
        # as the reads are: on a hung server the worker never started, saying nothing.
        trouble = Backoff(*_RECONNECT)
        while True:
            try:
                announced = await answered_within(self.lease, self._announced(broker))
                retry_queue = None
                if self.retries:
                    retry_queue = await answered_within(self.lease, self._retry_queue(stream))
                break
            except Exception as exc:
                await self._ride_out(exc, trouble)  # a lost connection is waited out, as for reads
            if self._stopping.is_set():
                return
        threads = None if self._is_async else HandlerThreads(self.concurrency, f"pgbroker-{self.stream}")
        retry_task = maintain_task = None
        if retry_queue is not None:
            self._retry_worker = Worker(retry_queue, self._retry, concurrency=self.concurrency)
            if self._stopping.is_set():
                self._retry_worker.stop()
            retry_task = asyncio.create_task(self._retry_worker.run(broker))
            retry_task.add_done_callback(self._retries_ended)
        if self.maintain_every is not None:
            maintain_task = asyncio.create_task(self._maintain(stream, self.maintain_every))
        heartbeat_task = asyncio.create_task(self._heartbeats(consumer), name=f"pgbroker-beat-{self.stream}")
        for task in (heartbeat_task, maintain_task):
            if task is not None:
                task.add_done_callback(on_bug("stream_worker.bug", stream=self.stream, group=self.group))
        log_event(
            logging.INFO,
            "stream_worker.started",
            stream=self.stream,
            group=self.group,
            consumer=self.consumer,
            loop=running_loop(),
        )
        try:
            await self._consume(broker, stream, consumer, threads, announced)
        finally:
            heartbeat_task.cancel()
            with suppress(Exception, asyncio.CancelledError):
                await heartbeat_task
            with suppress(Exception):  # else the lease runs out: the partitions go to others then
                await answered_within(self.lease, consumer.release())
            if maintain_task is not None:
                maintain_task.cancel()
            if self._retry_worker is not None:
                self._retry_worker.stop()
            for task in (retry_task, maintain_task):
                if task is not None:
                    with suppress(Exception, asyncio.CancelledError):
                        await task
            if threads is not None:
                threads.close()
            log_event(
                logging.INFO,
                "stream_worker.stopped",
                stream=self.stream,
                group=self.group,
                completed=self.stats.completed,
                retried=self.stats.retried,
            )
        if self._retries_failure is not None:
            raise self._retries_failure

    def _retries_ended(self, task: asyncio.Task[None]) -> None:
        """The retry queue's worker ends at stop, or on an error it cannot ride out (its queue
        dropped, a grant taken away): failed messages would then wait for ever, so the stream
        worker stops too (run raises that error) and says so now."""
        if task.cancelled() or (failure := task.exception()) is None:
            return
        log_failure("stream_worker.retries_failed", failure, stream=self.stream, group=self.group)
        self._retries_failure = failure
        self.stop()

    async def _consume(
        self,
        broker: AsyncBroker,
        stream: AsyncStream,
        consumer: AsyncStreamConsumer,
        threads: HandlerThreads | None,
        announced: bool,
    ) -> None:
        """Read, and, after a full batch, read again at once (at most two batches in hand); each
        read carries the ack of the batches done before it. The slots go through the batches'
        keys meanwhile (pgbroker.runtime._stream_dispatch)."""
        self._dispatch = dispatch = KeyedDispatch(low_water=self.concurrency)
        idle = Backoff(self.poll_min, self.poll_max)
        trouble = Backoff(*_RECONNECT)
        subscription: AsyncSubscription | None = None
        handle = partial(self._handle, threads)
        slots = [asyncio.create_task(dispatch.slot(handle)) for _ in range(self.concurrency)]
        reading: asyncio.Task[StreamBatch] | None = None  # the next batch's read, in flight
        riding: list[HeldBatch] = []  # the batches whose ack that read carries
        done: list[HeldBatch] = []  # handled, to be acked, oldest first
        # How full the last read was: full (a backlog: read again at once), at least half full (a
        # producer ahead: read again once fewer keys wait than there are slots), or less (caught
        # up: read again once the batches in hand are done, one call a batch with their ack,
        # where reads ahead would mostly come back empty: 286 reads a second against 191 at 1,000
        # messages a second, W = 16; and, on a stream that notifies, not before the next send is
        # announced, below).
        full = busy = False
        # Caught up (the last read less than half full) with every batch in hand done, on a
        # stream that announces its sends: the ack of those waits, up to the idle poll, for the
        # next send's notification, to go with the read of what it announces, where reading at
        # once came back empty and cost a call more a batch (a send every 10 ms: 80 reads for 40
        # sends, now 39-41).
        lingered = False
        # A read failed in flight: it may have committed without its answer arriving, moving the
        # group past rows never handled. No read may run until a rewind has settled that, however
        # many calls fail in between (a failover can take several); the batches in hand are
        # finished and acked first, or the rewind would hand them out again.
        unsettled = False
        deadline: float | None = None  # of the grace period, once stopping
        try:
            while True:
                done += dispatch.take_completed()
                stopping = self._stopping.is_set()
                if stopping and deadline is None:
                    deadline = time.monotonic() + self.grace_period
                ahead = len(dispatch.held) < 2 and (full or (busy and dispatch.slots_short))
                if reading is None and (stopping or unsettled) and not dispatch.held:
                    try:
                        # Acked on their own, oldest first: before stopping, or before the
                        # rewind, which then hands out again only what was read after (an ack
                        # again is harmless).
                        while done:
                            await self._answered(broker, consumer.ack(done[0].batch))
                            self._count(done.pop(0))
                        if stopping:
                            return
                        await self._answered(broker, consumer.rewind())
                    except Exception as exc:
                        await self._ride_out(exc, trouble)
                        if stopping:  # tried once since the stop: the partitions' next owner has them
                            self._unacked(done)
                            return
                        continue
                    unsettled = False
                    continue
                elif reading is None and not stopping and not unsettled and (not dispatch.held or ahead):
                    try:
                        if subscription is None:
                            subscription = await self._answered(broker, stream.listen(_LISTEN_TIMEOUT))
                    except Exception as exc:
                        await self._ride_out(exc, trouble)
                        continue
                    # The linger above; not busy, no read runs ahead, so every batch in hand is done.
                    lingers = announced and subscription.announced and done and not busy and not lingered
                    if lingers and not subscription.has_news():
                        lingered = True
                        await self._nap(subscription, idle.next())
                        continue
                    subscription.catch_up()  # the read covers what was announced so far
                    lingered = False
                    acked, count = joined(done)
                    riding, done = done[:count], done[count:]
                    self.stats.reads += 1
                    # Unanswered for a lease, a read is given up as a lost connection (a hung
                    # server or pooler, a connection cut without a word): its partitions are
                    # another's by then, and it might never be answered.
                    reading = asyncio.create_task(
                        self._answered(broker, consumer.ack_and_read(acked, self.batch_size))
                    )
                    reading.add_done_callback(lambda _: dispatch.changed.set())
                if reading is None or not reading.done():
                    # Something to wait for: a batch done, the read's answer, a stop; the end of
                    # the grace period, for batches still in hand once stopping.
                    timeout = None
                    if deadline is not None and dispatch.held:
                        timeout = deadline - time.monotonic()
                        if timeout <= 0:
                            self._give_up(slots)
                            continue
                    with suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(dispatch.changed.wait(), timeout)
                    dispatch.changed.clear()
                    continue
                task, reading = reading, None
                try:
                    batch = task.result()
                except Exception as exc:
                    unsettled = True
                    done, riding = riding + done, []
                    if isinstance(exc, StreamConsumerSuperseded):
                        # A rewind of its own that ran late, or another process under its name:
                        # settled by a rewind under a new generation, as a lost read.
                        log_event(logging.WARNING, "stream_worker.superseded", stream=self.stream, error=exc)
                        await self._nap(None, trouble.next())  # (two processes under one name take turns)
                        continue
                    await self._ride_out(exc, trouble)
                    continue
                trouble.reset()
                for held in riding:
                    self._count(held)
                riding = []
                full, busy = len(batch) >= self.batch_size, 2 * len(batch) >= self.batch_size
                if not batch:
                    if not done and not dispatch.held:  # else read again at once, with its ack
                        await self._nap(subscription, idle.next())
                    continue
                idle.reset()
                if subscription is not None:
                    subscription.confirm()  # the wake-up, if one led here, was news
                if self._stopping.is_set():
                    # Read ahead, not started: delivered again to whoever takes the partitions
                    # (released on the way out, or once the lease ends).
                    continue
                self.stats.received += len(batch)
                dispatch.add(batch)
        finally:
            unfinished: list[asyncio.Task[Any]] = [*slots, *([reading] if reading is not None else [])]
            for pending in unfinished:
                pending.cancel()
            for pending in unfinished:
                with suppress(Exception, asyncio.CancelledError):
                    await pending

    async def _answered(self, broker: AsyncBroker, call: Coroutine[Any, Any, T]) -> T:
        """A call of the consuming loop, bounded by the lease; an upgrade's errors told (SchemaWatch)."""
        return await answered_within(self.lease, self._schema.call(broker, call))

    async def _retry_queue(self, stream: AsyncStream) -> str | None:
        return next((g.retry_queue for g in await stream.groups() if g.name == self.group), None)

    async def _announced(self, broker: AsyncBroker) -> bool:
        """Whether the stream announces its sends: only then does a caught-up worker wait for
        the next one before it reads again (without, reading at once finds them soonest)."""
        return any(s.name == self.stream and s.notify for s in await list_streams(broker))

    async def _ride_out(self, exc: Exception, trouble: Backoff) -> None:
        """A call failed: a lost connection is counted, logged and waited out, as is a function
        or column an upgrade just moved (SchemaChanged); anything else stops the worker."""
        if isinstance(exc, SchemaChanged):
            log_event(
                logging.WARNING,
                "stream_worker.schema_changed",
                stream=self.stream,
                error=exc,
                hint=SCHEMA_CHANGED_HINT,
            )
            await self._nap(None, trouble.next())
            return
        if not is_transient(exc):
            raise exc
        self.stats.connection_errors += 1
        log_event(logging.WARNING, "stream_worker.database_unavailable", stream=self.stream, error=exc)
        await self._nap(None, trouble.next())

    def _give_up(self, slots: list[asyncio.Task[None]]) -> None:
        """The grace period is over: the handlers still running are cancelled and the batches
        not done are left unacked, to be delivered again."""
        for task in slots:
            task.cancel()
        left = self._dispatch.in_flight
        self._dispatch.held.clear()
        log_event(logging.WARNING, "stream_worker.grace_period_over", stream=self.stream, unhandled=left)

    def _unacked(self, done: list[HeldBatch]) -> None:
        """The stop gave up acking the batches handled (the database away or hung): whoever
        takes their partitions has them again (at-least-once)."""
        if done:
            messages = sum(len(held.batch) for held in done)
            log_event(logging.WARNING, "stream_worker.unacked_at_stop", stream=self.stream, messages=messages)

    def _count(self, held: HeldBatch) -> None:
        batch = held.batch
        self.stats.stale += held.dropped
        self.stats.retried += len(batch.failures)
        self.stats.completed += len(batch) - len(batch.failures) - held.dropped

    async def _handle(self, threads: HandlerThreads | None, message: StreamMessage, held: HeldBatch) -> None:
        """Run the handler on ``message``; an exception marks it failed in its batch."""
        try:
            with tracing.processing(self.stream, message.headers, message.id, group=self.group):
                if threads is None:
                    await self.handler(message)
                else:
                    await threads.run(self.handler, message)  # type: ignore[arg-type]
        except (Exception, asyncio.CancelledError) as raised:
            exc = handler_failure(raised)
            # At WARNING, traceback included, as a queue worker's: at INFO a handler's bug showed
            # only with -v, and the worker looked idle while its messages went to the retry queue.
            log_failure(
                "stream_worker.handler_failed",
                exc,
                stream=self.stream,
                group=self.group,
                id=message.id,
                error=f"{type(exc).__name__}: {exc}",
            )
            held.batch.fail(message, f"{type(exc).__name__}: {exc}")

    async def _retry(self, message: Message) -> None:
        """The handler, on a message of the retry queue (a Worker's handler: raising fails it)."""
        converted = stream_message_of(message)
        if self._is_async:
            await self.handler(converted)
        else:
            await awaited_result(await asyncio.to_thread(self.handler, converted))

    async def _heartbeats(self, consumer: AsyncStreamConsumer) -> None:
        """Renew the lease every quarter lease while batches are in hand: at least a quarter lease
        before a read's renewal runs out (a read renews once half the lease has gone). A partition
        of a batch that the answer does not name under the epoch the batch was read with was
        taken since the read: its part of the batch can never be acked. Only an answer to a beat
        sent while that batch was in hand says so; an older one may predate the batch's read."""
        while True:
            await asyncio.sleep(self.lease / 4)
            in_hand = list(self._dispatch.held)
            if not in_hand:
                continue
            try:
                owned = await answered_within(self.lease / 2, consumer.heartbeat())
            except Exception as exc:  # the next beat, or the next read, tries again
                log_event(logging.WARNING, "stream_worker.heartbeat_failed", stream=self.stream, error=exc)
                continue
            lost: set[int] = set()
            for held in in_hand:
                taken = {p for p, epoch in held.epochs.items() if owned.get(p) != epoch} - held.lost
                held.lost |= taken
                lost |= taken
            if lost:
                log_event(
                    logging.WARNING,
                    "stream_worker.partitions_lost",
                    stream=self.stream,
                    group=self.group,
                    consumer=self.consumer,
                    partitions=sorted(lost),
                )

    async def _maintain(self, stream: AsyncStream, every: float) -> None:
        within = maintenance_bound(every, self.lease)

        async def one_round() -> None:
            if emptied := await answered_within(within, stream.maintain()):
                log_event(logging.INFO, "stream_worker.retention", stream=self.stream, emptied=emptied)
            # Retention skips a child table another transaction holds, and the ring's rotation
            # gives up: without a word, the log and the ring grew for as long as a client left a
            # read open (idle in transaction). Name such a session, once a round.
            for held in await answered_within(within, blocking_sessions(stream, self.lease, self.stream)):
                log_event(
                    logging.WARNING,
                    "stream_worker.held_up",
                    stream=self.stream,
                    pid=held.pid,
                    state=held.state,
                    transaction_age_sec=round(held.transaction_age_sec),
                    application=held.application_name,
                    hint=_HELD_UP_HINT,
                )

        command = f"pgbroker stream maintain {self.stream}"
        await maintenance_rounds(every, one_round, "stream_worker.maintenance", command, stream=self.stream)

    async def _nap(self, subscription: AsyncSubscription | None, seconds: float) -> None:
        """Sleep until a notification of a send, stop(), or ``seconds`` have passed."""
        await nap(self._stopping, subscription, seconds)
