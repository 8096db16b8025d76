"""Inbound: messages from any broker a connector speaks, written into a pgbroker queue or stream
(pgbroker.bridge.core.inbound_targets), nothing lost and nothing doubled.

The connector's Receiver hands over messages unacked; they are written in batches: one call of
pgbroker.receive_many per batch sends them and records their message ids in one transaction, and
only after it committed are they acked on the broker. A crash before the commit loses nothing:
the messages were never acked, so the broker delivers them again. A crash between the commit and
the ack makes the broker deliver them again too, and then receive_many finds their message ids
among those seen within ``seen_within`` seconds and sends nothing: they are acked without a
second send. Ids older than the window are forgotten (pruned every ``prune_every`` seconds), so
the window should be longer than any redelivery can take; a day by default.

Messages without a message id cannot be recognised when delivered again: they are received
at-least-once (sent every time they come). Each connector takes the id from where its broker
keeps it (AMQP message_id, Nats-Msg-Id, a stream entry's id, ...; pgbroker.bridge.connector).

A message pgbroker refuses (too large for pgbroker.max_message_bytes, say) would come back
forever: it is rejected (the broker dead-letters it where it can) and logged. A full pgbroker
queue (max_depth) holds the batch unacked and retries it after a pause: backpressure reaches the
broker, which stops delivering once ``prefetch`` messages are unacked. A batch is sent whole or
not at all, so max_depth must be larger than batch_size. A stop() meanwhile gives the batch up
unacked (the broker delivers it again), rather than waiting for room.

A write unanswered within ``ack_wait`` (a hung server, a stuck pooler, a network that drops packets
without a word: pgbroker._db.liveness.answered_within) counts as a lost connection: the bridge
reconnects, and the broker delivers the batch again (it would give it to another consumer by then
anyway); should the write given up commit after all, its message ids are recognised. The bridge
would otherwise wait for the answer for as long as the hang lasts.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from dataclasses import dataclass

from pgbroker._background import said_if_failed
from pgbroker._db.backoff import SEND_RETRY, Backoff
from pgbroker._db.liveness import answered_within, stops_with
from pgbroker.bridge import body
from pgbroker.bridge.connector import Received, Receiver
from pgbroker.bridge.core.endpoints import inbound_endpoint
from pgbroker.bridge.core.inbound_targets import InboundTarget, QueueTarget, StreamTarget
from pgbroker.bridge.core.reconnect import run_connected
from pgbroker.bridge.settings import InboundSettings
from pgbroker.errors import InvalidMessage, QueueFull
from pgbroker.queues._client_async import AsyncBroker

__all__ = ["InboundBridge", "InboundSettings", "InboundStats", "StreamInboundBridge"]

log = logging.getLogger("pgbroker.bridge.in")

# A receive waits this long for a first message, then looks whether the bridge was stopped.
_POLL = 0.5


@dataclass(slots=True)
class InboundStats:
    received: int = 0  # sent to the pgbroker queue (appended to the stream)
    duplicates: int = 0  # message ids already received: acked, not sent again
    rejected: int = 0  # refused by pgbroker (invalid or too large): rejected on the broker
    reconnects: int = 0
    batches: int = 0  # transactions written


class InboundBridge:
    """Receives from the broker at ``url`` into one pgbroker queue until stop():
    ``await bridge.run()``.

    ``source`` names what to receive on the broker (a RabbitMQ queue, a Redis stream, a NATS
    subject, an MQTT topic filter, an SQS queue); None takes it from the URL, else the pgbroker
    queue's name."""

    def __init__(
        self,
        broker: AsyncBroker,
        source: str | None,
        queue: str,
        url: str,
        settings: InboundSettings | None = None,
    ) -> None:
        self.settings = settings or InboundSettings()
        self.stats = InboundStats()
        self._target: InboundTarget = self._make_target(broker, queue)
        # A malformed URL, an unknown scheme or a missing client library fails here.
        self._endpoint = inbound_endpoint(url, source, queue, self.settings)
        self._stopping = asyncio.Event()
        # Set while connected and receiving (an MQTT subscription, say, exists from then on).
        self.receiving = asyncio.Event()
        # Set once the bridge first connected to the broker and began its work (kept across reconnections).
        self.started = asyncio.Event()

    @staticmethod
    def _make_target(broker: AsyncBroker, name: str) -> InboundTarget:
        return QueueTarget(broker, name)

    @property
    def where(self) -> str:
        return self._endpoint.where

    def stop(self) -> None:
        """Write and ack the batch in hand, then return from run(); unwritten messages go back."""
        self._stopping.set()

    async def run(self) -> None:
        # Once stopping, a database call waits for its answer STOP_PATIENCE seconds at most.
        with stops_with(self._stopping):
            await self._run()

    async def _run(self) -> None:
        # QueueNotFound (StreamNotFound) now rather than on the first batch, within the bound of
        # every database call.
        await answered_within(self.settings.ack_wait, self._target.check())
        pruner = asyncio.create_task(self._prune(), name="pgbroker-bridge-prune")
        pruner.add_done_callback(said_if_failed(log, "bridge.in.prune_ended"))
        try:
            await run_connected(
                self._endpoint,
                self._serve,
                stopping=self._stopping,
                log=log,
                on_reconnect=self._count_reconnect,
            )
        finally:
            pruner.cancel()

    def _count_reconnect(self) -> None:
        self.stats.reconnects += 1

    async def _serve(self, receiver: Receiver) -> None:
        log.info("bridge.in.started %s=%s broker=%s", self._target.kind, self._target.name, self.where)
        self.receiving.set()
        self.started.set()
        try:
            while not self._stopping.is_set():
                batch = await receiver.receive(self.settings.batch_size, _POLL)
                if batch:
                    await self._write(receiver, batch)
        finally:
            self.receiving.clear()

    async def _write(self, receiver: Receiver, batch: list[Received]) -> None:
        try:
            if not await self._send(receiver, batch):
                return  # stopped while the queue was full: unacked, the broker delivers it again
        except InvalidMessage:
            if len(batch) == 1:
                await self._reject(receiver, batch[0])
                return
            # One message spoils its batch: write them one by one to find it.
            for message in batch:
                await self._write(receiver, [message])
            return
        # Committed: a lost ack now only makes the broker deliver them again, and they are recognised.
        await receiver.ack(batch)

    async def _send(self, receiver: Receiver, batch: list[Received]) -> bool:
        """Send a batch in one transaction, retrying while the queue is full (the messages wait
        unacked) unless stopped meanwhile; returns whether it was sent."""
        payloads = []
        headers = []
        for message in batch:
            payload, kind = body.decode(message.body, message.content_type)
            payloads.append(payload)
            headers.append(
                message.headers
                if kind in body.SELF_DESCRIBED
                else {**message.headers, f"{receiver.header_prefix}body": kind}
            )
        pause = Backoff(*SEND_RETRY)
        waited = 0
        while True:
            try:
                sent = await answered_within(
                    self.settings.ack_wait,
                    self._target.append(batch, payloads, headers, self.settings.seen_within),
                )
            except QueueFull as exc:
                if waited == 0:  # once per batch: the pauses grow to a second, the log would not
                    log.warning("bridge.in.queue_full queue=%s error=%s", self._target.name, exc.message)
                waited += 1
                with suppress(TimeoutError):
                    async with asyncio.timeout(pause.next()):
                        await self._stopping.wait()
                if self._stopping.is_set():
                    log.warning(
                        "bridge.in.stopped_while_full queue=%s count=%d: the batch goes back to the"
                        " broker unacked",
                        self._target.name,
                        len(batch),
                    )
                    return False
                continue
            self.stats.batches += 1
            self.stats.received += sent
            self.stats.duplicates += len(batch) - sent
            return True

    async def _reject(self, receiver: Receiver, message: Received) -> None:
        log.error(
            "bridge.in.rejected broker=%s message_id=%s: pgbroker refused it (invalid or too large);"
            " rejected on the broker (dead-lettered where the broker can)",
            self.where,
            message.message_id,
        )
        self.stats.rejected += 1
        await receiver.reject(message)

    async def _prune(self) -> None:
        """Forget message ids older than the window, every prune_every seconds."""
        while True:
            await asyncio.sleep(self.settings.prune_every)
            try:
                pruning = self._target.prune
                while await answered_within(self.settings.prune_every, pruning(self.settings.seen_within)):
                    pass
            except Exception as exc:  # the next round tries again; receiving goes on meanwhile
                log.warning("bridge.in.prune_failed error=%s", exc)


class StreamInboundBridge(InboundBridge):
    """Receives from the broker at ``url`` into a pgbroker stream: each message appended with the
    key the broker carried, de-duplicated by message id (pgbroker.stream_receive_many).
    ``StreamInboundBridge(broker, source, stream, url, settings)``; the rest as InboundBridge."""

    @staticmethod
    def _make_target(broker: AsyncBroker, name: str) -> InboundTarget:
        return StreamTarget(broker, name)
