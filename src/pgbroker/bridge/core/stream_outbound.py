"""Outbound from a pgbroker stream: a consumer group's messages published to any broker a
connector speaks, the group advanced only after the broker confirmed them.

The same connectors and reconnect loop as a queue's outbound bridge (pgbroker.bridge.core.outbound);
what differs is how messages are taken and settled. A stream is read through a consumer group
(pgbroker.streams._client_async): a window is one batch read by this bridge's consumer, published whole,
and acked (the group's cursors move past it) once every message in it was confirmed. So:

- at-least-once: a bridge killed between the confirm and the ack leaves the batch unacked; the
  consumer that takes its partitions over (this bridge restarted, after the consumer lease, or
  another bridge of the group) reads it again and publishes it a second time. Those are the only
  duplicates, and they carry the same message id: "<stream>:<partition>:<id>@<enqueued_at>",
  the message's position in the stream and when it was appended (StreamMessage.identity: a
  failover that lost appended ids reissues them, the time tells them apart), for consumers
  downstream to de-duplicate.
- a lost connection (or a database error) mid-window acks nothing: after reconnecting, the
  consumer rewinds (what it read and did not ack is handed out again) and publishes again. The
  ack of a confirmed window is the exception: met by a passing database fault (a lost connection,
  a lock or statement timeout) it is tried again within the consumer lease
  (pgbroker.bridge.core.outbound.settled), since a stream ack made again changes nothing and one
  from a consumer whose partitions changed hands is fenced by their epochs; so a database restart
  or a maintenance lock does not have a confirmed window published again. A database call
  unanswered within the consumer lease (a hung server, a stuck pooler, a network
  that drops packets without a word) counts as a lost connection (pgbroker._db.liveness.
  answered_within): past the lease the partitions may be another's, and the bridge would
  otherwise wait for as long as the hang lasts. A read given up that runs later is refused (the
  consumer's generation, docs/streams.md), so it moves no cursor past a batch no one published.
- order: one window at a time per bridge (a stream's ack moves a cursor, so a later batch must
  never be acked before an earlier one), published in stream order, so the messages of a key
  (one partition) reach the broker in their order. Parallelism is more bridges in the same group:
  they share the partitions, each key staying with one of them.
- a message the broker refuses (unroutable, too large: not a lost connection) is failed in its
  batch: the group's retry queue (<stream>_<group>_retry, an ordinary queue with its policy's
  back-off, max deliveries and dead letters) takes it, and the batch is acked. That message then
  leaves its key's order; bridge the retry queue out like any queue to publish it later.

Each message goes with its key (OutMessage.key: a Redis field, a NATS header, an MQTT user
property, the SQS FIFO MessageGroupId) and the header x-pgmq-group (RabbitMQ's AMQP header).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from functools import partial
from typing import TypeVar

from pgbroker._db.backoff import Backoff
from pgbroker._db.liveness import answered_within, stops_with
from pgbroker.bridge import body
from pgbroker.bridge.connector import Confirmed, OutMessage, Publisher
from pgbroker.bridge.core.endpoints import outbound_endpoint
from pgbroker.bridge.core.outbound import KEY_HEADER, OutboundStats, settled
from pgbroker.bridge.core.reconnect import run_connected
from pgbroker.bridge.errors import BrokerConnectionLost
from pgbroker.bridge.settings import OutboundSettings
from pgbroker.errors import StreamConsumerSuperseded
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.streams._client_async import AsyncStream, AsyncStreamConsumer, consumer_name
from pgbroker.streams._records import StreamBatch, StreamMessage

__all__ = ["StreamOutboundBridge", "stream_out_message"]

log = logging.getLogger("pgbroker.bridge.out")

# A read waits at most this long for messages, then looks whether the bridge was stopped.
_POLL = 1.0
# Pauses before rewinding after a read refused as superseded (doubling).
_SUPERSEDED_RETRY = (0.1, 5.0)

T = TypeVar("T")


class StreamOutboundBridge:
    """Publishes a stream, as consumer group ``group``, to the broker at ``url`` until stop():
    ``await bridge.run()``. ``consumer`` names this bridge in the group (default: host, process
    and a random part); a bridge restarted with the same name takes its partitions back at once
    instead of after the consumer lease (settings.lease). With settings.declare the group is
    created (at the start of the stream) if missing."""

    def __init__(
        self,
        broker: AsyncBroker,
        stream: str,
        group: str,
        url: str,
        settings: OutboundSettings | None = None,
        *,
        consumer: str | None = None,
    ) -> None:
        self.settings = settings or OutboundSettings()
        self.stats = OutboundStats()
        self._stream = AsyncStream(broker, stream)
        self._group = group
        self._consumer: AsyncStreamConsumer = self._stream.consumer(
            group, name=consumer or consumer_name(), lease=self.settings.lease
        )
        # A malformed URL, an unknown scheme or a missing client library fails here.
        self._endpoint = outbound_endpoint(url, stream, self.settings)
        self._stopping = asyncio.Event()
        # Set once the bridge first connected to the broker and began its work (kept across reconnections).
        self.started = asyncio.Event()

    @property
    def where(self) -> str:
        return self._endpoint.where

    def stop(self) -> None:
        """Finish the window in flight (publish, confirm, ack), then return from run()."""
        self._stopping.set()

    async def run(self) -> None:
        # Once stopping, a database call waits for its answer STOP_PATIENCE seconds at most.
        with stops_with(self._stopping):
            await self._run()

    async def _run(self) -> None:
        if self.settings.declare:
            await self._answered(self._stream.create_group(self._group, start="start"))
        else:
            await self._answered(self._consumer.rewind())  # StreamNotFound / StreamGroupNotFound now
        try:
            await run_connected(
                self._endpoint,
                self._serve,
                stopping=self._stopping,
                log=log,
                on_reconnect=self._count_reconnect,
            )
        finally:
            try:
                # The partitions go to the group's others at once.
                await self._answered(self._consumer.release())
            except Exception as exc:  # the lease runs out instead
                log.warning("bridge.out.release_failed stream=%s error=%s", self._stream.name, exc)

    @property
    def _source(self) -> str:
        return f"stream={self._stream.name} group={self._group}"

    def _count_reconnect(self) -> None:
        self.stats.reconnects += 1

    async def _answered(self, call: Awaitable[T], *, waiting: float = 0) -> T:
        """A database call, failed as a lost connection when unanswered within the consumer lease
        (plus ``waiting``, the time a read may spend waiting for messages)."""
        return await answered_within(self.settings.lease + waiting, call)

    async def _serve(self, publisher: Publisher) -> None:
        log.info(
            "bridge.out.started stream=%s group=%s consumer=%s broker=%s",
            self._stream.name,
            self._group,
            self._consumer.name,
            self.where,
        )
        # What was read and not acked before (a lost connection, a failed ack) comes again.
        await self._answered(self._consumer.rewind())
        self.started.set()
        superseded = Backoff(*_SUPERSEDED_RETRY)
        while not self._stopping.is_set():
            try:
                reading = self._consumer.read(self.settings.batch_size, wait=_POLL)
                batch = await self._answered(reading, waiting=_POLL)
                if batch:
                    await self._window(publisher, batch)
            except StreamConsumerSuperseded as exc:
                # A rewind of its own given up unanswered that ran later (a hung session going
                # on), or another process under this consumer's name: settled by a rewind under a
                # new generation, as a lost read (its batch, if any, is published again).
                pause = superseded.next()
                log.warning(
                    "bridge.out.superseded stream=%s consumer=%s retry_in=%.2f error=%s",
                    self._stream.name,
                    self._consumer.name,
                    pause,
                    exc.message,
                )
                await asyncio.sleep(pause)  # (two processes under one name take turns)
                await self._answered(self._consumer.rewind())
                continue
            superseded.reset()

    async def _window(self, publisher: Publisher, batch: StreamBatch) -> None:
        outgoing = [stream_out_message(m) for m in batch]
        outcomes = await publisher.publish(outgoing, self.settings.confirm_timeout)
        self.stats.windows += 1
        lost = next((o.reason for o in outcomes if not isinstance(o, Confirmed) and o.lost), None)
        if lost is not None:
            # Nothing is acked: after the reconnect the batch is read again and published again
            # (the confirmed part of it a second time, with the same message ids).
            raise BrokerConnectionLost(f"{lost} ({self.where})")
        refused = 0
        for message, outcome in zip(batch, outcomes, strict=True):
            if not isinstance(outcome, Confirmed):
                batch.fail(message, outcome.reason)
                self.stats.errors[outcome.reason] = self.stats.errors.get(outcome.reason, 0) + 1
                refused += 1
        # Tried again after a passing database fault: a stream ack made again changes nothing, and
        # one whose partitions changed hands meanwhile says so (held False: counted stale).
        acking = partial(self._consumer.ack, batch)
        held = await settled("ack", acking, len(batch), lease=self.settings.lease, source=self._source)
        lost_partitions = {p for p, kept in held.items() if not kept}
        stale = sum(1 for m in batch if m.partition in lost_partitions)
        self.stats.stale += stale
        self.stats.published += len(batch) - refused - stale
        self.stats.retried += refused
        if refused:
            log.warning(
                "bridge.out.failed stream=%s count=%d: the broker refused them; they went to the"
                " group's retry queue",
                self._stream.name,
                refused,
            )
        if stale:
            log.warning(
                "bridge.out.stale stream=%s count=%d: published, but their partitions changed hands"
                " before the ack; they will be published again (same message ids)",
                self._stream.name,
                stale,
            )


def stream_out_message(message: StreamMessage) -> OutMessage:
    """What a connector is given for a stream message: its body and content type
    (pgbroker.bridge.body), its identity "<stream>:<partition>:<id>@<enqueued_at>" as message
    id, its key (also as header x-pgmq-group, for brokers that carry only headers), its
    headers."""
    encoded = body.encode(message.message)
    headers = dict(message.headers or {})
    if message.key is not None:
        headers[KEY_HEADER] = message.key
    return OutMessage(
        msg_id=message.id,
        message_id=message.identity,
        body=encoded.data,
        content_type=encoded.content_type,
        headers=headers,
        key=message.key,
    )
