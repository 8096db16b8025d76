"""The request and answer models of the stream operations (pgbroker.http.routes.streams): what
they validate, and, through pydantic, their part of the OpenAPI spec."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, StringConstraints

from pgbroker.http import stream_metrics

# integral: a JSON number with no fraction (64.0) is an integer, as JSON Schema says.
from pgbroker.http.models import Answer, Body
from pgbroker.http.validation import BIGINT_MAX, BatchOf, JsonObject, JsonValue, Limit, QueueName, integral
from pgbroker.streams import _records as core

STREAM_NAME_PATTERN = "^[a-z0-9_][a-z0-9_-]{0,39}$"
GROUP_NAME_PATTERN = "^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$"
CONSUMER_PATTERN = "^[A-Za-z0-9_.:@-]{1,200}$"

StreamName = Annotated[str, StringConstraints(pattern=STREAM_NAME_PATTERN)]
GroupName = Annotated[str, StringConstraints(pattern=GROUP_NAME_PATTERN)]
ConsumerName = Annotated[
    str,
    StringConstraints(pattern=CONSUMER_PATTERN),
    Field(description="unique among the group's consumers; it owns partitions while it reads once a lease"),
]
Id = Annotated[int, Field(ge=0, le=BIGINT_MAX), BeforeValidator(integral)]
Partitions = Annotated[int, Field(ge=1, le=256), BeforeValidator(integral)]
Partition = Annotated[int, Field(ge=0, le=255), BeforeValidator(integral)]
Positive = Annotated[int, Field(ge=1, le=BIGINT_MAX), BeforeValidator(integral)]
RetentionSeconds = Annotated[int, Field(ge=1, le=3_153_600_000), BeforeValidator(integral)]  # 100 years
LeaseSeconds = Annotated[int, Field(ge=1, le=86400), BeforeValidator(integral)]


class CreateStream(Body):
    name: StreamName
    partitions: Partitions = 4
    retention_seconds: RetentionSeconds | None = None
    retention_bytes: Positive | None = None
    truncate_consumed: bool = True
    notify: bool = False


class StreamSend(Body):
    message: JsonValue
    key: Annotated[str | None, StringConstraints(max_length=1000, pattern="^[^\\x00]*$")] = None
    headers: JsonObject | None = None


class StreamSendBatch(Body):
    messages: Annotated[list[StreamSend], Field(min_length=1), Limit("max_batch")]


class CreateGroup(Body):
    group: GroupName
    start: Literal["start", "end"] | Annotated[datetime, Field(strict=False)] = "end"
    retry_queue: Annotated[
        QueueName | None,
        Field(
            description="where the group's failed messages go (<stream>_<group>_retry by default); no other"
            " group's retry queue"
        ),
    ] = None


class StreamRead(Body):
    consumer: ConsumerName
    qty: BatchOf = 100
    lease_seconds: LeaseSeconds = 30
    wait: Annotated[float, Field(ge=0), Limit("max_wait_seconds")] = 0.0


class StreamHeartbeat(Body):
    consumer: ConsumerName
    lease_seconds: LeaseSeconds = 30


class PartitionAck(Body):
    partition: Partition
    epoch: Id
    last_id: Id


class FailedMessage(Body):
    id: Id
    error: Annotated[str, StringConstraints(max_length=2000, pattern="^[^\\x00]*$")]


class StreamAck(Body):
    consumer: ConsumerName
    acks: Annotated[list[PartitionAck], Field(min_length=1, max_length=256)]
    failed: Annotated[list[FailedMessage], Limit("max_batch")] = []


class StreamList(Answer):
    streams: list[core.StreamInfo]


class StreamIds(Answer):
    ids: list[int]


class GroupInfo(Answer):
    """A consumer group (pgbroker.StreamGroupInfo), its retry queue named only to a key that sees it."""

    name: str
    lag: int
    oldest_unacked_at: datetime | None
    consumers: int
    retry_queue: Annotated[str | None, Field(description=stream_metrics.RETRY_QUEUE_UNSEEN)]
    created_at: datetime


class GroupList(Answer):
    groups: list[GroupInfo]


class GroupCreated(Answer):
    group: str
    retry_queue: Annotated[str | None, Field(description=stream_metrics.RETRY_QUEUE_UNSEEN)]


class StreamBatch(Answer):
    messages: list[core.StreamMessage]


class AckResult(Answer):
    partition: int
    acked: bool


class StreamAcked(Answer):
    partitions: list[AckResult]


class OwnedPartition(Answer):
    partition: int
    epoch: int


class HeartbeatAnswer(Answer):
    partitions: Annotated[
        list[OwnedPartition],
        Field(description="what the consumer owns: a batch read under another epoch can no longer be acked"),
    ]


class StreamDropped(Answer):
    dropped: str


class GroupDropped(Answer):
    dropped: str


class StreamStatsList(Answer):
    groups: list[stream_metrics.StreamGroupStats]
