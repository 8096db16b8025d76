"""Outbound: a transactional outbox from a pgbroker queue into any broker a connector speaks.

Whatever is sent to the queue (in the same transaction as the data that caused it) is published
to the broker, and acked in Postgres only after the broker confirmed it.

One round, a "window", as "Publishing RabbitMQ messages from PostgreSQL" does it per row but
for a whole batch at once:
  1. read up to batch_size messages with a lease (pgbroker.read: SKIP LOCKED, fenced receipts),
     so that bridges running in parallel never hold the same message;
  2. hand them to the connector's Publisher, which publishes them all and awaits the broker's
     confirms together (hundreds in flight: one disk sync in the broker covers many);
  3. ack the confirmed ones in one call (pgbroker.ack_published: archived by default, the
     archive row keeping where and when it was published), and hand the others to
     pgbroker.fail (retry with the queue policy's back-off; dead letter after max_deliveries,
     with the reason the connector gave).
Several windows run at once on one connection (``windows``), so the next batch is read and
published while the previous one waits for its confirms.

Leases: a window that takes long (a broker under flow control) has its leases extended every
lease/3 seconds. A bridge that dies between the confirm and the ack leaves the lease to run
out; the message is then read again and published a second time, with the same message id:
that is the one duplicate this design allows (at-least-once; consumers de-duplicate by
message id). Nothing is lost: a message leaves the queue only after its confirm.

The message id is the message's identity, "<msg_id>@<enqueued_at in microseconds>"
(Message.identity), not the msg_id alone: after a failover that lost the tail of the WAL, the
new primary hands lost msg_ids out again, to other messages, which downstream de-duplication
by msg_id would drop. enqueued_at, set by the server at the send and kept by every redelivery,
tells them apart while a message keeps one id on every publish.

Wake-ups: reads wait on the queue's NOTIFY channel (pgbroker._db.listen), so an idle bridge
costs nothing and a new message is picked up within milliseconds; the first read on start
catches up with everything sent while no bridge ran.

Connection loss: the window's unconfirmed messages fail (retry), the bridge reconnects with
back-off and carries on. An ack or fail of a window that meets a passing database fault (a lost
connection, a lock or statement timeout) is tried again while the window's leases hold (fenced
receipts make a second try safe), so a database restart or a maintenance lock does not have a
confirmed window published again. A database call unanswered within the lease (a hung server, a
stuck pooler, a network that drops packets without a word: pgbroker._db.liveness.answered_within) is a
lost connection too, since the leases it acts on have run out by then; the bridge would otherwise
wait for the answer for as long as the hang lasts. The first connection is not retried: a wrong
URL, bad credentials or an unreachable broker is reported at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import TypeVar

from pgbroker._background import said_if_failed
from pgbroker._db.backoff import Backoff, Patience
from pgbroker._db.liveness import answered_within, is_denied, stop_requested, stops_with
from pgbroker.bridge import body
from pgbroker.bridge.connector import Confirmed, OutMessage, Publisher
from pgbroker.bridge.core.endpoints import outbound_endpoint
from pgbroker.bridge.core.reconnect import is_transient, run_connected
from pgbroker.bridge.errors import BrokerConnectionLost
from pgbroker.bridge.settings import OutboundSettings
from pgbroker.errors import PgbrokerError
from pgbroker.queues._client_async import AsyncBroker, AsyncQueue
from pgbroker.queues._records import Message, Receipt

__all__ = ["OutboundBridge", "OutboundSettings", "OutboundStats"]

log = logging.getLogger("pgbroker.bridge.out")

T = TypeVar("T")

# The FIFO group of a message (pgmq's header) is its key where the target orders per key.
KEY_HEADER = "x-pgmq-group"
# A failed lease extension is tried again after these pauses (doubling), at most lease/3 apart.
_EXTEND_RETRY = (0.2, 5.0)
# A failed ack or fail of a window is tried again after these pauses (doubling), within a lease.
_SETTLE_RETRY = (0.1, 2.0)


async def settled(what: str, call: Callable[[], Awaitable[T]], count: int, *, lease: float, source: str) -> T:
    """``call()``, the ack or fail of a window's messages (``count``, read from ``source``), each
    try failed as a lost connection when unanswered within ``lease``, tried again after a passing
    fault (bridge.out.ack_failed / fail_failed) for up to a lease: past it the receipts (a queue's)
    or the consumer's partitions (a stream's) may be another's, and a late ack only counts them
    stale. A second try is safe because both are fenced: a receipt or an epoch acks once. Giving
    up at once left a confirmed window to be published again; a bridge stopping does so all the
    same (a try made once stopping waits STOP_PATIENCE at most, and is not made again)."""
    retry = Patience(*_SETTLE_RETRY, within=lease)
    while True:
        try:
            return await answered_within(lease, call())
        except Exception as exc:
            # Once stopping, tried no more: the window is published again (at-least-once).
            pause = retry.next() if is_transient(exc) and not stop_requested() else None
            if pause is None:
                raise
            log.warning(
                "bridge.out.%s_failed %s count=%d retry_in=%.2f error=%s", what, source, count, pause, exc
            )
            await asyncio.sleep(pause)


@dataclass(slots=True)
class OutboundStats:
    published: int = 0  # confirmed and acked
    retried: int = 0  # failed, back in the queue after the policy's back-off
    dead_lettered: int = 0  # failed for the last allowed time
    stale: int = 0  # confirmed, but the lease had run out: another bridge may publish it again
    reconnects: int = 0
    windows: int = 0  # windows published (a window is one read, one publish, one ack)
    errors: dict[str, int] = field(default_factory=dict)  # failure texts, counted


class OutboundBridge:
    """Publishes one pgbroker queue to the broker at ``url`` until stop(): ``await bridge.run()``.

    The URL's scheme chooses the connector (amqp://, redis://, nats://, mqtt://, sqs://; see
    pgbroker.bridge.core.endpoints); where on the broker the messages go is in the URL too, by
    default a name equal to the queue's."""

    def __init__(
        self, broker: AsyncBroker, queue: str, url: str, settings: OutboundSettings | None = None
    ) -> None:
        self.settings = settings or OutboundSettings()
        self.stats = OutboundStats()
        self._queue: AsyncQueue = broker.queue(queue)
        # A malformed URL, an unknown scheme or a missing client library fails here.
        self._endpoint = outbound_endpoint(url, queue, self.settings)
        self._stopping = asyncio.Event()
        # Set once the bridge first connected to the broker and began its work (kept across reconnections).
        self.started = asyncio.Event()

    @property
    def where(self) -> str:
        """The broker and target, for logs (no password)."""
        return self._endpoint.where

    def stop(self) -> None:
        """Finish the windows in flight (publish, confirm, ack), then return from run()."""
        self._stopping.set()

    async def run(self) -> None:
        # Once stopping, a database call waits for its answer STOP_PATIENCE seconds at most.
        with stops_with(self._stopping):
            await self._run()

    async def _run(self) -> None:
        # QueueNotFound now rather than on the first read; a database that does not answer is
        # reported as one that cannot be reached (bounded as every call is).
        await self._answered(self._queue.policy())
        if self.settings.enable_notify:
            await self._enable_notify()
        await run_connected(
            self._endpoint,
            self._serve,
            stopping=self._stopping,
            log=log,
            on_reconnect=self._count_reconnect,
        )

    def _count_reconnect(self) -> None:
        self.stats.reconnects += 1

    async def _enable_notify(self) -> None:
        """Turn notify on. That is the owner's (a trigger on the queue's table): a role that may
        not, the consumer's, publishes all the same, as a worker does, waking on the notifications
        the owner turned on, or reading again every idle_wait."""
        try:
            await self._answered(self._queue.enable_notify(keep_existing=True))
        except PgbrokerError as exc:
            if not is_denied(exc):
                raise
            log.warning(
                "bridge.out.notify_unavailable queue=%s error=%s (the queue's owner may turn it on:"
                " pgmq.enable_notify_insert)",
                self._queue.name,
                exc.message,
            )

    async def _serve(self, publisher: Publisher) -> None:
        log.info("bridge.out.started queue=%s broker=%s", self._queue.name, self.where)
        self.started.set()
        aborting = asyncio.Event()
        pumps = [asyncio.create_task(self._pump(publisher, aborting)) for _ in range(self.settings.windows)]
        try:
            done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_EXCEPTION)
            failed = next((task.exception() for task in done if task.exception() is not None), None)
            if failed is not None:
                # The other windows finish what they hold (ack or fail it), then stop.
                aborting.set()
                await asyncio.wait(pumps)
                raise failed
        finally:
            for task in pumps:
                task.cancel()

    async def _pump(self, publisher: Publisher, aborting: asyncio.Event) -> None:
        while not (self._stopping.is_set() or aborting.is_set()):
            messages = await self._next_batch(aborting)
            if messages:
                await self._window(publisher, messages)

    async def _next_batch(self, aborting: asyncio.Event) -> list[Message]:
        """The next batch; when the queue is empty, wait for a notification (read again after
        idle_wait at most), or until stopped: a stop does not wait out an idle read."""

        async def read() -> list[Message]:
            # Bodies as stored: a binary one goes out as its codec's bytes, never decoded here.
            return await self._answered(
                self._queue.read_many(self.settings.batch_size, vt=self.settings.lease, decode=False)
            )

        found = await read()
        if found:
            return found
        subscription = await self._answered(self._queue.listen())  # it asks the server for the channel
        # Subscribed before this read: a send committed from here on wakes the wait below.
        while not (found := await read()):
            heard = asyncio.ensure_future(subscription.wait(self.settings.idle_wait))
            stopped = asyncio.ensure_future(self._stopping.wait())
            ended = asyncio.ensure_future(aborting.wait())
            await asyncio.wait((heard, stopped, ended), return_when=asyncio.FIRST_COMPLETED)
            for waiting in (heard, stopped, ended):
                waiting.cancel()
            if self._stopping.is_set() or aborting.is_set():
                break
        return found

    async def _window(self, publisher: Publisher, messages: list[Message]) -> None:
        receipts: dict[int, Receipt] = {m.msg_id: m.receipt for m in messages if m.receipt is not None}
        outgoing = [out_message(m) for m in messages]
        keeper_done = asyncio.Event()
        keeper = asyncio.create_task(self._keep_leases(receipts, keeper_done), name="pgbroker-bridge-leases")
        # Raised here only once the window's publish ends: said now (the leases run out meanwhile).
        keeper.add_done_callback(said_if_failed(log, "bridge.out.extend_ended", queue=self._queue.name))
        try:
            outcomes = await publisher.publish(outgoing, self.settings.confirm_timeout)
        finally:
            keeper_done.set()
            await keeper
        published_at = datetime.now(UTC).isoformat()
        self.stats.windows += 1

        confirmed: list[tuple[int, dict[str, object]]] = []
        failures: dict[str, list[int]] = defaultdict(list)
        lost: str | None = None
        for message, outcome in zip(outgoing, outcomes, strict=True):
            if isinstance(outcome, Confirmed):
                confirmed.append((message.msg_id, {"at": published_at, **outcome.record}))
                continue
            failures[outcome.reason].append(message.msg_id)
            if outcome.lost:
                lost = outcome.reason
        await self._ack(confirmed, receipts)
        await self._fail(failures, receipts)
        if lost is not None:
            raise BrokerConnectionLost(f"{lost} ({self.where})")

    async def _ack(
        self, confirmed: list[tuple[int, dict[str, object]]], receipts: dict[int, Receipt]
    ) -> None:
        held = [(msg_id, record) for msg_id, record in confirmed if msg_id in receipts]
        if not held:
            self.stats.stale += len(confirmed)
            return
        acking = partial(
            self._queue.ack_published_many,
            [receipts[msg_id] for msg_id, _ in held],
            [record for _, record in held],
        )
        acked = await self._settled("ack", acking, len(held))
        self.stats.published += len(acked)
        stale = len(confirmed) - len(acked)
        if stale:
            self.stats.stale += stale
            log.warning(
                "bridge.out.stale queue=%s count=%d: published, but the lease ran out before the ack;"
                " they may be published again (same message id)",
                self._queue.name,
                stale,
            )

    async def _fail(self, failures: dict[str, list[int]], receipts: dict[int, Receipt]) -> None:
        for error, msg_ids in failures.items():
            held = [receipts[i] for i in msg_ids if i in receipts]
            failing = partial(self._queue.fail_many, held, error=error)
            outcomes = await self._settled("fail", failing, len(held)) if held else {}
            retried = sum(1 for o in outcomes.values() if o == "retry")
            self.stats.retried += retried
            self.stats.dead_lettered += len(outcomes) - retried
            self.stats.errors[error] = self.stats.errors.get(error, 0) + len(msg_ids)
            log.warning(
                "bridge.out.failed queue=%s count=%d retry=%d dead_lettered=%d error=%s",
                self._queue.name,
                len(msg_ids),
                retried,
                len(outcomes) - retried,
                error,
            )

    async def _answered(self, call: Awaitable[T]) -> T:
        """A database call, failed as a lost connection when unanswered within the lease."""
        return await answered_within(self.settings.lease, call)

    async def _settled(self, what: str, call: Callable[[], Awaitable[T]], count: int) -> T:
        return await settled(what, call, count, lease=self.settings.lease, source=f"queue={self._queue.name}")

    async def _keep_leases(self, receipts: dict[int, Receipt], done: asyncio.Event) -> None:
        """Extend the window's leases every lease/3 seconds until done (never cut off mid-call:
        an extend whose new receipts were lost would make the window's acks stale).

        An extend that fails on a passing fault (a lost connection, a lock timeout) is tried
        again soon: the receipts still held ack what the broker confirms. Ending at the first
        failure instead left the leases to run out while the window waited for its confirms, and
        the whole window unacked and published again, although the database was back in time."""
        retry = Backoff(*_EXTEND_RETRY)
        pause = self.settings.lease / 3
        while True:
            with suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await done.wait()
            if done.is_set():
                return
            try:
                renewed = await self._answered(
                    self._queue.extend_many(list(receipts.values()), vt=self.settings.lease)
                )
            except Exception as exc:
                if not is_transient(exc):
                    raise
                pause = min(retry.next(), self.settings.lease / 3)
                log.warning(
                    "bridge.out.extend_failed queue=%s count=%d retry_in=%.2f error=%s",
                    self._queue.name,
                    len(receipts),
                    pause,
                    exc,
                )
                continue
            retry.reset()
            pause = self.settings.lease / 3
            for msg_id in set(receipts) - set(renewed):
                del receipts[msg_id]  # its lease already ran out: another bridge may have it now
            receipts.update(renewed)


def out_message(message: Message) -> OutMessage:
    """What a connector is given to publish for a message: its body and content type
    (pgbroker.bridge.body), its identity "<msg_id>@<enqueued_at>" as message id, its headers,
    its FIFO group as key."""
    encoded = body.encode(message.message)  # as stored: read with decode=False
    headers = message.headers or {}
    key = headers.get(KEY_HEADER)
    return OutMessage(
        msg_id=message.msg_id,
        message_id=message.identity,
        body=encoded.data,
        content_type=encoded.content_type,
        headers=headers,
        key=key if isinstance(key, str) else None,
    )
