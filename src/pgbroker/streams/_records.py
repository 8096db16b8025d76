"""Typed records of streams: a message read from a stream, the batch it came in, a stream's
settings, a group's lag."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pgbroker._frozen import builder
from pgbroker.queues._records import message_identity


@dataclass(frozen=True, slots=True)
class StreamMessage:
    """One message of a stream as a consumer of a group got it."""

    stream: str
    partition: int
    id: int
    epoch: int  # the partition's lease epoch it was read under (what the ack is fenced by)
    key: str | None
    enqueued_at: datetime
    headers: dict[str, Any] | None
    message: Any

    @property
    def identity(self) -> str:
        """The message's identity for de-duplication downstream,
        ``<stream>:<partition>:<id>@<enqueued_at>`` (pgbroker.queues._records.message_identity):
        the same each time the message is read again, different for another message that got
        the same id after a failover."""
        return message_identity(f"{self.stream}:{self.partition}:{self.id}", self.enqueued_at)


#: StreamMessage(...) from every field in order, made fast for the reads (pgbroker._frozen)
build_stream_message = builder(StreamMessage)


@dataclass(slots=True)
class StreamBatch:
    """The messages of one read, acknowledged together: ack() moves the group's cursor of each
    partition to the last id read there. Mark those that failed with fail(); they go to the
    group's retry queue when the batch is acked."""

    messages: list[StreamMessage]
    failures: dict[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.messages)

    def __iter__(self) -> Any:
        return iter(self.messages)

    def __bool__(self) -> bool:
        return bool(self.messages)

    def fail(self, message: StreamMessage | int, error: str) -> None:
        self.failures[message if isinstance(message, int) else message.id] = error

    def ack_ranges(self) -> tuple[list[int], list[int], list[int]]:
        """(partitions, epochs, last ids): the cursor moves an ack of this batch asks for."""
        last: dict[int, tuple[int, int]] = {}
        for m in self.messages:
            epoch, top = last.get(m.partition, (m.epoch, 0))
            last[m.partition] = (epoch, max(top, m.id))
        parts = sorted(last)
        return parts, [last[p][0] for p in parts], [last[p][1] for p in parts]


@dataclass(frozen=True, slots=True)
class StreamInfo:
    name: str
    partitions: int
    retention_seconds: int | None
    retention_bytes: int | None
    truncate_consumed: bool
    segment_rows: int
    segments: int
    notify: bool
    created_at: datetime


@dataclass(frozen=True, slots=True)
class StreamGroupInfo:
    """A consumer group: its lag (messages kept beyond its cursors), the age of its oldest
    unacknowledged message, its live consumers and its retry queue."""

    name: str
    lag: int
    oldest_unacked_at: datetime | None
    consumers: int
    retry_queue: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class PartitionLag:
    group: str
    partition: int
    acked_id: int
    delivered_id: int
    lag: int
    oldest_unacked_at: datetime | None
    owner: str | None
    owner_alive: bool


def ack_failures(failures: Mapping[int, str]) -> tuple[list[int] | None, list[str] | None]:
    if not failures:
        return None, None
    ids = sorted(failures)
    return ids, [failures[i] for i in ids]
