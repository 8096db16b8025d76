"""Where an inbound bridge writes: a pgbroker queue or a pgbroker stream. The core
(pgbroker.bridge.core.inbound) is the same for both; a target only checks that it exists, appends a
batch with de-duplication by message id in one transaction, and forgets old message ids.

Queue: pgbroker.receive_many (table pgbroker.inbound_seen). Stream: pgbroker.stream_receive_many
(table pgbroker.stream_inbound_seen), each message appended with the key the broker carried (so
per-key order holds in the stream as it came)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from pgbroker.bridge.connector import Received
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.streams._client_async import AsyncStream


class InboundTarget(Protocol):
    name: str  # for logs
    kind: str  # "queue" or "stream"

    async def check(self) -> None:
        """Raise the client's NotFound error when the target does not exist."""
        ...

    async def append(
        self,
        batch: Sequence[Received],
        payloads: Sequence[Any],
        headers: Sequence[Mapping[str, Any]],
        seen_within: float,
    ) -> int:
        """Write the batch in one transaction, skipping message ids seen within ``seen_within``
        seconds; returns how many were written (the others were duplicates)."""
        ...

    async def prune(self, seen_within: float) -> int:
        """Forget one batch of message ids older than the window; returns how many."""
        ...


class QueueTarget:
    kind = "queue"

    def __init__(self, broker: AsyncBroker, queue: str) -> None:
        self.name = queue
        self._broker = broker
        self._queue = broker.queue(queue)

    async def check(self) -> None:
        # The bridge's own write, of no message: QueueNotFound, or a refusal naming what this login
        # lacks. It is all an inbound bridge needs, so a producer login runs it (policy() is a
        # consumer's).
        await self._queue.receive_many([], [], [], seen_within=0)

    async def append(
        self,
        batch: Sequence[Received],
        payloads: Sequence[Any],
        headers: Sequence[Mapping[str, Any]],
        seen_within: float,
    ) -> int:
        ids = [m.message_id for m in batch]
        return len(await self._queue.receive_many(ids, payloads, headers, seen_within=seen_within))

    async def prune(self, seen_within: float) -> int:
        # Its own queue's: another bridge's may keep its ids longer (its own --dedup-window).
        return await self._broker.prune_inbound_seen(seen_within, queue=self.name)


class StreamTarget:
    kind = "stream"

    def __init__(self, broker: AsyncBroker, stream: str) -> None:
        self.name = stream
        self._stream = AsyncStream(broker, stream)

    async def check(self) -> None:
        # As QueueTarget's: StreamNotFound, or what this login lacks (a producer has all it needs).
        await self._stream.receive_many([], [], [], [], seen_within=0)

    async def append(
        self,
        batch: Sequence[Received],
        payloads: Sequence[Any],
        headers: Sequence[Mapping[str, Any]],
        seen_within: float,
    ) -> int:
        ids = [m.message_id for m in batch]
        keys = [m.key for m in batch]
        return len(await self._stream.receive_many(ids, payloads, headers, keys, seen_within=seen_within))

    async def prune(self, seen_within: float) -> int:
        return await self._stream.prune_inbound_seen(seen_within)
