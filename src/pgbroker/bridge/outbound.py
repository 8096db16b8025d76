"""Outbound: a transactional outbox from a pgbroker queue into RabbitMQ.

Whatever is sent to the queue (in the same transaction as the data that caused it) is
published to RabbitMQ, and acked in Postgres only after the broker confirmed it.

One round, a "window", as "Publishing RabbitMQ messages from PostgreSQL" does it per row but
for a whole batch at once:
  1. read up to batch_size messages with a lease (pgbroker.read: SKIP LOCKED, fenced receipts),
     so that bridges running in parallel never hold the same message;
  2. publish them all on a confirm channel, mandatory, persistent, message_id = msg_id, and
     await the confirms together (hundreds in flight: one disk sync in RabbitMQ covers many);
  3. ack the confirmed ones in one call (pgbroker.ack_published: archived by default, the
     archive row keeping where and when it was published), and hand the others to
     pgbroker.fail (retry with the queue policy's back-off; dead letter after max_deliveries,
     with the error). Unroutable (returned), nacked, not confirmed in time and lost with the
     connection are all failures.
Several windows run at once on one channel (``windows``), so the next batch is read and
published while the previous one waits for its confirms.

Leases: a window that takes long (RabbitMQ under flow control) has its leases extended every
lease/3 seconds. A bridge that dies between the confirm and the ack leaves the lease to run
out; the message is then read again and published a second time, with the same message_id:
that is the one duplicate this design allows (at-least-once; consumers de-duplicate by
message_id). Nothing is lost: a message leaves the queue only after its confirm.

Wake-ups: reads wait on the queue's NOTIFY channel (pgbroker.listen), so an idle bridge
costs nothing and a new message is picked up within milliseconds; the first read on start
catches up with everything sent while no bridge ran.

Exchanges are never declared unless ``declare`` is set. Before its first publish to an
exchange the bridge checks that it exists (a passive declare on a separate channel, since a
missing exchange closes the channel it was used on); messages for a missing exchange fail
with an error saying so, and go through the retry policy like any other failure.

Connection loss: the window's unconfirmed messages fail (retry), the bridge reconnects with
back-off and carries on. The first connection is not retried: a wrong URL, bad credentials or
an unreachable broker is reported at once (AmqpUnreachable, AmqpAccessRefused).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pgbroker.aio import AsyncBroker, AsyncQueue
from pgbroker.bridge import amqp
from pgbroker.bridge.errors import AmqpConnectionLost, AmqpNotFound, Unpublishable
from pgbroker.bridge.mapping import Outgoing, Route, outgoing
from pgbroker.bridge.reconnect import run_connected
from pgbroker.models import Message, Receipt

__all__ = ["OutboundBridge", "OutboundSettings", "OutboundStats"]

log = logging.getLogger("pgbroker.bridge.out")

# An exchange found to exist is checked again after this many seconds (it may be deleted).
_EXCHANGE_RECHECK = 30.0


@dataclass(frozen=True, slots=True)
class OutboundSettings:
    """How an outbound bridge publishes; the CLI's options of the same names."""

    exchange: str = ""  # for messages without x-amqp-exchange; "" is RabbitMQ's default exchange
    routing_key: str | None = None  # for messages without x-amqp-routing-key; None: the queue's name
    batch_size: int = 500  # messages per window
    windows: int = 2  # windows in flight at once
    lease: int = 30  # seconds a window's messages stay invisible to other bridges (extended as needed)
    idle_wait: float = 1.0  # an idle bridge reads again after this long without a notification
    confirm_timeout: float = 30.0  # a publish not confirmed within this fails (retried later)
    connect_timeout: float = 10.0
    declare: bool = False  # declare exchanges (durable, exchange_type) instead of requiring them
    exchange_type: str = "topic"
    enable_notify: bool = True  # enable NOTIFY on the queue if it is off


@dataclass(slots=True)
class OutboundStats:
    published: int = 0  # confirmed and acked
    retried: int = 0  # failed, back in the queue after the policy's back-off
    dead_lettered: int = 0  # failed for the last allowed time
    stale: int = 0  # confirmed, but the lease had run out: another bridge may publish it again
    reconnects: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # failure texts, counted


class OutboundBridge:
    """Publishes one pgbroker queue to RabbitMQ until stop(): ``await bridge.run()``."""

    def __init__(
        self, broker: AsyncBroker, queue: str, amqp_url: str, settings: OutboundSettings | None = None
    ) -> None:
        self.settings = settings or OutboundSettings()
        self.stats = OutboundStats()
        self._queue: AsyncQueue = broker.queue(queue)
        self._url = amqp_url
        self._default = Route(self.settings.exchange, self.settings.routing_key or queue)
        self._stopping = asyncio.Event()
        amqp.where(amqp_url)  # a malformed URL fails here, not at the first connect

    def stop(self) -> None:
        """Finish the windows in flight (publish, confirm, ack), then return from run()."""
        self._stopping.set()

    async def run(self) -> None:
        await self._queue.policy()  # QueueNotFound now rather than on the first read
        if self.settings.enable_notify:
            await self._queue.enable_notify(keep_existing=True)
        await run_connected(
            self._url,
            self._serve,
            stopping=self._stopping,
            connect_timeout=self.settings.connect_timeout,
            log=log,
            on_reconnect=self._count_reconnect,
        )

    def _count_reconnect(self) -> None:
        self.stats.reconnects += 1

    async def _serve(self, connection: amqp.Connection) -> None:
        try:
            channel = await connection.channel(confirms=True)
        except amqp.ChannelClosed as exc:
            raise amqp.lost(exc, "opening a channel") from exc
        exchanges = _Exchanges(connection, self.settings.declare, self.settings.exchange_type)
        missing = await exchanges.check([self._default.exchange])
        if missing:
            raise AmqpNotFound(missing[self._default.exchange], hint=_EXCHANGE_HINT)
        log.info("bridge.out.started queue=%s broker=%s", self._queue.name, amqp.where(self._url))
        aborting = asyncio.Event()
        pumps = [
            asyncio.create_task(self._pump(channel, exchanges, aborting))
            for _ in range(self.settings.windows)
        ]
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

    async def _pump(self, channel: amqp.Channel, exchanges: _Exchanges, aborting: asyncio.Event) -> None:
        while not (self._stopping.is_set() or aborting.is_set()):
            if channel.is_closed:
                raise amqp.lost(channel.closed.result(), "idle")
            messages = await self._next_batch(aborting)
            if messages:
                await self._window(channel, exchanges, messages)

    async def _next_batch(self, aborting: asyncio.Event) -> list[Message]:
        """The next batch; when the queue is empty, wait for a notification (read again after
        idle_wait at most), or until stopped: a stop does not wait out an idle read."""

        async def read() -> list[Message]:
            return await self._queue.read_many(self.settings.batch_size, vt=self.settings.lease)

        found = await read()
        if found:
            return found
        subscription = await self._queue.listen()
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

    async def _window(self, channel: amqp.Channel, exchanges: _Exchanges, messages: list[Message]) -> None:
        receipts: dict[int, Receipt] = {m.msg_id: m.receipt for m in messages if m.receipt is not None}
        failures: dict[str, list[int]] = defaultdict(list)
        ready: list[Outgoing] = []
        for message in messages:
            try:
                ready.append(outgoing(message, self._default))
            except Unpublishable as exc:
                failures[f"unpublishable: {exc.message}"].append(message.msg_id)
        try:
            missing = await exchanges.check({o.route.exchange for o in ready})
        except AmqpConnectionLost:
            failures[_LOST].extend(o.msg_id for o in ready)
            await self._fail(failures, receipts)
            raise
        for o in [o for o in ready if o.route.exchange in missing]:
            failures[missing[o.route.exchange]].append(o.msg_id)
        ready = [o for o in ready if o.route.exchange not in missing]

        keeper_done = asyncio.Event()
        keeper = asyncio.create_task(self._keep_leases(receipts, keeper_done))
        try:
            results = await self._publish_all(channel, ready)
        finally:
            keeper_done.set()
            await keeper
        published_at = datetime.now(UTC).isoformat()

        confirmed: list[Outgoing] = []
        lost: BaseException | None = None
        for o, result in zip(ready, results, strict=True):
            if result is None:
                confirmed.append(o)
                continue
            failures[_failure_text(o, result)].append(o.msg_id)
            if isinstance(result, amqp.ChannelClosed):
                lost = result
                if result.not_found:
                    exchanges.forget(o.route.exchange)
        await self._ack(confirmed, receipts, published_at)
        await self._fail(failures, receipts)
        if lost is not None:
            raise amqp.lost(lost, "waiting for publisher confirms")

    async def _publish_all(self, channel: amqp.Channel, ready: list[Outgoing]) -> list[BaseException | None]:
        """Publish a window and await its confirms together: None for each message the broker
        confirmed, else what went wrong (TimeoutError if no confirm came within confirm_timeout)."""
        futures: list[asyncio.Future[None]] = []
        for o in ready:
            try:
                futures.append(channel.publish(o.route.exchange, o.route.routing_key, o.body, o.properties))
            except Exception as exc:  # pika refuses to encode it (a header value, say)
                refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                refused.set_exception(exc)
                futures.append(refused)
        if futures:
            await asyncio.wait(futures, timeout=self.settings.confirm_timeout)
        return [_outcome(f) for f in futures]

    async def _ack(self, confirmed: Sequence[Outgoing], receipts: dict[int, Receipt], at: str) -> None:
        held = [o for o in confirmed if o.msg_id in receipts]
        if not held:
            return
        records = [{"at": at, "exchange": o.route.exchange, "routing_key": o.route.routing_key} for o in held]
        acked = await self._queue.ack_published_many([receipts[o.msg_id] for o in held], records)
        self.stats.published += len(acked)
        stale = len(confirmed) - len(acked)
        if stale:
            self.stats.stale += stale
            log.warning(
                "bridge.out.stale queue=%s count=%d: published, but the lease ran out before the ack;"
                " they may be published again (same message_id)",
                self._queue.name,
                stale,
            )

    async def _fail(self, failures: dict[str, list[int]], receipts: dict[int, Receipt]) -> None:
        for error, msg_ids in failures.items():
            held = [receipts[i] for i in msg_ids if i in receipts]
            outcomes = await self._queue.fail_many(held, error=error) if held else {}
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

    async def _keep_leases(self, receipts: dict[int, Receipt], done: asyncio.Event) -> None:
        """Extend the window's leases every lease/3 seconds until done (never cut off mid-call:
        an extend whose new receipts were lost would make the window's acks stale)."""
        while True:
            with suppress(TimeoutError):
                async with asyncio.timeout(self.settings.lease / 3):
                    await done.wait()
            if done.is_set():
                return
            renewed = await self._queue.extend_many(list(receipts.values()), vt=self.settings.lease)
            for msg_id in set(receipts) - set(renewed):
                del receipts[msg_id]  # its lease already ran out: another bridge may have it now
            receipts.update(renewed)


_LOST = "not published: the RabbitMQ connection was lost"
_EXCHANGE_HINT = "Declare it in RabbitMQ, or run the bridge with --declare (declare=True) to declare it."


def _outcome(future: asyncio.Future[None]) -> BaseException | None:
    if not future.done():
        future.cancel()  # a late confirm finds nothing waiting
        return TimeoutError()
    return future.exception()


def _failure_text(o: Outgoing, exc: BaseException) -> str:
    where = f"exchange {o.route.exchange!r} routing key {o.route.routing_key!r}"
    if isinstance(exc, amqp.Returned):
        return f"unroutable: no queue bound to {where} (returned as mandatory: {exc})"
    if isinstance(exc, amqp.Nacked):
        return f"RabbitMQ refused the message (basic.nack) for {where}"
    if isinstance(exc, TimeoutError):
        return f"not confirmed by RabbitMQ within the confirm timeout, for {where}"
    if isinstance(exc, amqp.ChannelClosed):
        if exc.not_found:
            return f"RabbitMQ has no exchange {o.route.exchange!r} (it was deleted while in use)"
        return _LOST
    return f"publish failed for {where}: {type(exc).__name__}: {exc}"


class _Exchanges:
    """Which exchanges exist (or were declared), checked on a probe channel of their own."""

    def __init__(self, connection: amqp.Connection, declare: bool, exchange_type: str) -> None:
        self._connection = connection
        self._declare = declare
        self._type = exchange_type
        self._checked: dict[str, float] = {"": float("inf")}  # the default exchange always exists
        self._probe: amqp.Channel | None = None
        self._lock = asyncio.Lock()

    def forget(self, name: str) -> None:
        self._checked.pop(name, None)

    async def check(self, names: Iterable[str]) -> dict[str, str]:
        """{name: why it cannot be used} for those of ``names`` that do not exist (or cannot be declared)."""
        now = asyncio.get_running_loop().time()
        wanted = [n for n in names if now - self._checked.get(n, -_EXCHANGE_RECHECK) >= _EXCHANGE_RECHECK]
        if not wanted:
            return {}
        missing: dict[str, str] = {}
        async with self._lock:
            for name in wanted:
                why = await self._check_one(name)
                if why is None:
                    self._checked[name] = now
                else:
                    missing[name] = why
        return missing

    async def _check_one(self, name: str) -> str | None:
        # amq.* names are RabbitMQ's own: they exist, and declaring them is refused.
        passive = not self._declare or name.startswith("amq.")
        try:
            if self._probe is None or self._probe.is_closed:
                self._probe = await self._connection.channel()
            await self._probe.exchange_declare(name, self._type, passive=passive)
        except amqp.ChannelClosed as exc:
            if exc.not_found:
                return f"RabbitMQ has no exchange {name!r}; declare it, or run the bridge with --declare"
            if exc.reply_code:
                return f"exchange {name!r} cannot be declared as a durable {self._type} exchange: {exc}"
            raise amqp.lost(exc, f"checking exchange {name!r}") from exc
        return None
