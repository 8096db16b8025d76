"""Inbound: a RabbitMQ queue consumed into a pgbroker queue, nothing lost and nothing doubled.

Deliveries are consumed with manual acks and written in batches: one call of
pgbroker.receive_many per batch sends them and records their AMQP message_ids in one
transaction, and only after it committed are they acked in RabbitMQ (one basic.ack with
``multiple`` for the batch). A crash before the commit loses nothing: the deliveries were never
acked, so RabbitMQ delivers them again. A crash between the commit and the ack makes RabbitMQ
deliver them again too, and then receive_many finds their message_ids among those seen within
``seen_within`` seconds and sends nothing: they are acked without a second send. Ids older than
the window are forgotten (pruned every ``prune_every`` seconds), so the window should be longer
than any redelivery can take; a day by default.

Messages without a message_id cannot be recognised when redelivered: they are received
at-least-once (sent every time they come). Publishers that need exactly-once set message_id,
as the outbound bridge does (the msg_id).

A message pgbroker refuses (too large for pgbroker.max_message_bytes, say) would be redelivered
forever: it is rejected without requeue, so RabbitMQ dead-letters it if the queue has a
dead-letter exchange, and logged. A full pgbroker queue (max_depth) holds the batch unacked and
retries it after a pause: backpressure reaches RabbitMQ, which stops delivering once
``prefetch`` deliveries are unacked. A batch is sent whole or not at all, so max_depth must be
larger than batch_size.

The RabbitMQ queue must exist unless ``declare`` is set (then it is declared durable).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from pgbroker.aio import AsyncBroker, AsyncQueue
from pgbroker.backoff import SEND_RETRY, Backoff
from pgbroker.bridge import amqp
from pgbroker.bridge.errors import AmqpNotFound
from pgbroker.bridge.mapping import Incoming, incoming
from pgbroker.bridge.reconnect import run_connected
from pgbroker.errors import InvalidMessage, QueueFull

__all__ = ["InboundBridge", "InboundSettings", "InboundStats"]

log = logging.getLogger("pgbroker.bridge.in")


@dataclass(frozen=True, slots=True)
class InboundSettings:
    """How an inbound bridge receives; the CLI's options of the same names."""

    batch_size: int = 500  # deliveries per transaction
    prefetch: int = 1000  # unacked deliveries RabbitMQ may send ahead (>= batch_size)
    linger: float = 0.005  # seconds to wait for more deliveries before writing a partial batch
    seen_within: float = 86_400.0  # seconds a message_id is remembered for de-duplication
    prune_every: float = 60.0  # seconds between prunings of older message_ids
    connect_timeout: float = 10.0
    declare: bool = False  # declare the RabbitMQ queue (durable) instead of requiring it


@dataclass(slots=True)
class InboundStats:
    received: int = 0  # sent to the pgbroker queue
    duplicates: int = 0  # redeliveries of message_ids already received: acked, not sent again
    rejected: int = 0  # refused by pgbroker (invalid or too large): rejected without requeue
    reconnects: int = 0


class InboundBridge:
    """Receives one RabbitMQ queue into one pgbroker queue until stop(): ``await bridge.run()``."""

    def __init__(
        self,
        broker: AsyncBroker,
        rabbit_queue: str,
        queue: str,
        amqp_url: str,
        settings: InboundSettings | None = None,
    ) -> None:
        self.settings = settings or InboundSettings()
        self.stats = InboundStats()
        self._broker = broker
        self._queue: AsyncQueue = broker.queue(queue)
        self._source = rabbit_queue
        self._url = amqp_url
        self._stopping = asyncio.Event()
        amqp.where(amqp_url)  # a malformed URL fails here, not at the first connect

    def stop(self) -> None:
        """Write and ack the batch in hand, then return from run(); unwritten deliveries go back."""
        self._stopping.set()

    async def run(self) -> None:
        await self._queue.policy()  # QueueNotFound now rather than on the first batch
        pruner = asyncio.create_task(self._prune())
        try:
            await run_connected(
                self._url,
                self._serve,
                stopping=self._stopping,
                connect_timeout=self.settings.connect_timeout,
                log=log,
                on_reconnect=self._count_reconnect,
            )
        finally:
            pruner.cancel()

    def _count_reconnect(self) -> None:
        self.stats.reconnects += 1

    async def _serve(self, connection: amqp.Connection) -> None:
        try:
            channel = await connection.channel()
            await self._check_source(channel)
            inbox: asyncio.Queue[amqp.Delivery] = asyncio.Queue()
            prefetch = max(self.settings.prefetch, self.settings.batch_size)
            await channel.consume(self._source, prefetch, inbox.put_nowait)
        except amqp.ChannelClosed as exc:
            raise amqp.lost(exc, f"starting to consume {self._source!r}") from exc
        log.info(
            "bridge.in.started from=%s queue=%s broker=%s",
            self._source,
            self._queue.name,
            amqp.where(self._url),
        )
        while not self._stopping.is_set():
            batch = await self._collect(inbox, channel)
            if batch:
                await self._write(channel, batch)

    async def _check_source(self, channel: amqp.Channel) -> None:
        try:
            await channel.queue_declare(self._source, passive=not self.settings.declare)
        except amqp.ChannelClosed as exc:
            if not exc.not_found:
                raise
            raise AmqpNotFound(
                f"RabbitMQ has no queue {self._source!r} at {amqp.where(self._url)}",
                hint="Declare it in RabbitMQ, or run the bridge with --declare (declare=True).",
            ) from None

    async def _collect(
        self, inbox: asyncio.Queue[amqp.Delivery], channel: amqp.Channel
    ) -> list[amqp.Delivery]:
        """The next batch: wait for a first delivery (or a stop, or the channel closing), then
        take what else arrives within ``linger``, up to batch_size."""
        first = asyncio.ensure_future(inbox.get())
        stopped = asyncio.ensure_future(self._stopping.wait())
        # channel.closed is shared: waited on, never cancelled.
        await asyncio.wait((first, stopped, channel.closed), return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not first.done():
            first.cancel()
            if channel.is_closed:
                raise amqp.lost(channel.closed.result(), "waiting for deliveries")
            return []
        batch = [first.result()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.linger
        while len(batch) < self.settings.batch_size:
            if not inbox.empty():
                batch.append(inbox.get_nowait())
                continue
            try:
                async with asyncio.timeout(max(0.0, deadline - loop.time())):
                    batch.append(await inbox.get())
            except TimeoutError:
                break
        return batch

    async def _write(self, channel: amqp.Channel, batch: list[amqp.Delivery]) -> None:
        items = [incoming(m, self._source) for m in batch]
        try:
            await self._send(items)
        except InvalidMessage:
            if len(batch) == 1:
                await self._reject(channel, batch[0])
                return
            # One message spoils its batch: write them one by one to find it.
            for message in batch:
                await self._write(channel, [message])
            return
        await self._ack(channel, batch[-1], multiple=True)

    async def _send(self, items: list[Incoming]) -> None:
        """Send a batch in one transaction, retrying while the queue is full (the deliveries wait unacked)."""
        pause = Backoff(*SEND_RETRY)
        waited = 0
        while True:
            try:
                sent = await self._queue.receive_many(
                    [i.message_id for i in items],
                    [i.payload for i in items],
                    [i.headers for i in items],
                    seen_within=self.settings.seen_within,
                )
            except QueueFull as exc:
                if waited == 0:  # once per batch: the pauses grow to a second, the log would not
                    log.warning("bridge.in.queue_full queue=%s error=%s", self._queue.name, exc.message)
                waited += 1
                await asyncio.sleep(pause.next())
                continue
            self.stats.received += len(sent)
            self.stats.duplicates += len(items) - len(sent)
            return

    async def _ack(self, channel: amqp.Channel, last: amqp.Delivery, *, multiple: bool) -> None:
        try:
            channel.ack(last.delivery_tag, multiple=multiple)
        except amqp.ChannelClosed as exc:
            # Committed but not acked: RabbitMQ delivers these again, and they are recognised.
            raise amqp.lost(exc, "acking deliveries written to Postgres") from exc

    async def _reject(self, channel: amqp.Channel, message: amqp.Delivery) -> None:
        log.error(
            "bridge.in.rejected from=%s message_id=%s: pgbroker refused it (invalid or too large);"
            " rejected without requeue (RabbitMQ dead-letters it if the queue has a dead-letter exchange)",
            self._source,
            message.properties.message_id,
        )
        self.stats.rejected += 1
        try:
            channel.reject(message.delivery_tag)
        except amqp.ChannelClosed as exc:
            raise amqp.lost(exc, "rejecting a delivery") from exc

    async def _prune(self) -> None:
        """Forget message_ids older than the window, every prune_every seconds."""
        while True:
            await asyncio.sleep(self.settings.prune_every)
            try:
                while await self._broker.prune_inbound_seen(self.settings.seen_within):
                    pass
            except Exception as exc:  # the next round tries again; receiving goes on meanwhile
                log.warning("bridge.in.prune_failed error=%s", exc)
