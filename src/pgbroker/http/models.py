"""The REST API's request and response models. The server validates every request body and query
by them (pgbroker.http.operations), answers with them, and the OpenAPI spec is derived from them
(pgbroker.http.openapi): what the spec promises is what the server checks. The rules they are built
from (strict numbers, limits from the settings, names, receipts, JSON as jsonb takes it) are in
pgbroker.http.validation.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    model_validator,
)

from pgbroker.codecs.json_view import json_view
from pgbroker.http import metrics as prom
from pgbroker.http import monitoring
from pgbroker.http.validation import (
    BIGINT_MAX,
    BatchOf,
    Int32,
    JsonObject,
    JsonValue,
    Limit,
    MsgId,
    QueueName,
    ReceiptText,
    query_digits,
)
from pgbroker.queues import _records as core

# -- request bodies -----------------------------------------------------------------------------


class Body(BaseModel):
    """A JSON object body: strict types, unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


def _excludes_in_schema(schema: dict[str, Any], cls: type) -> None:
    excluded = getattr(cls, "excludes", None)
    if excluded:
        schema["not"] = {"required": [excluded]}


class OneForm(Body):
    """One of two forms of a body that share a field name's stem: ``excludes`` names the other
    form's field, which this form refuses (and says so in its schema)."""

    model_config = ConfigDict(json_schema_extra=_excludes_in_schema)
    excludes: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _alone(cls, data: Any) -> Any:
        if isinstance(data, dict) and cls.excludes in data:
            stem = cls.excludes.removesuffix("s")
            raise ValueError(f"give either {stem} or {stem}s, not both")
        return data


def _one_or_batch(batch_field: str) -> Discriminator:
    """Picks the batch form when its field is present, else the single form."""
    return Discriminator(lambda data: "batch" if isinstance(data, dict) and batch_field in data else "single")


class CreateQueue(Body):
    name: QueueName
    unlogged: bool = False
    notify: bool = True


class Delayed(Body):
    """Visible only after ``delay`` seconds (a send, or a nack's return)."""

    delay: Int32 = 0


class Encoded(Body):
    """A send that may choose its codec (docs/codecs.md): the value is given as JSON and encoded."""

    codec: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=512,
            description="json, msgpack, protobuf:<message type> or avro:<schema full name> (the type "
            "registered in the server); the message is the value in its JSON form. Absent: the queue's "
            "policy codec",
        ),
    ] = None


class SendOne(OneForm, Delayed, Encoded):
    excludes: ClassVar[str] = "messages"
    message: Annotated[JsonValue, Field(description="any JSON value jsonb can store (no NUL character)")]
    headers: Annotated[JsonObject | None, Field(description="the message's headers")] = None
    # The job headers (pgbroker.queues._job_headers), as the clients' send() takes them.
    priority: Annotated[
        int | None, Field(ge=-999_999_999, le=999_999_999, description="higher is read first (0)")
    ] = None
    dedup_key: Annotated[
        str | None,
        Field(min_length=1, max_length=512, description="while taken, the first message's msg_id answers"),
    ] = None
    concurrency_key: Annotated[
        str | None, Field(min_length=1, max_length=512, description="what max_in_flight_per_key counts by")
    ] = None


class SendBatch(OneForm, Delayed, Encoded):
    excludes: ClassVar[str] = "message"
    messages: Annotated[list[JsonValue], Field(min_length=1), Limit("max_batch")]
    headers: Annotated[
        list[JsonObject | None] | None, Field(description="one entry (an object or null) per message")
    ] = None

    @model_validator(mode="after")
    def _headers_match(self) -> SendBatch:
        if self.headers is not None and len(self.headers) != len(self.messages):
            raise ValueError("headers must be an array of objects (or nulls), one per message")
        return self


SendBody = Annotated[
    Annotated[SendOne, Tag("single")] | Annotated[SendBatch, Tag("batch")],
    _one_or_batch("messages"),
    Field(description="With messages, headers (when given) has one entry per message."),
]


class ReadBody(Body):
    vt: Int32 = 30
    qty: BatchOf = 1
    wait: Annotated[float, Field(ge=0), Limit("max_wait_seconds")] = 0.0


class OneReceipt(OneForm):
    """A body with one receipt: a stale one answers 409."""

    excludes: ClassVar[str] = "receipts"
    receipt: ReceiptText

    def receipt_list(self) -> list[str]:
        return [self.receipt]


class ReceiptBatch(OneForm):
    """A body with a batch of receipts: stale ones are listed in the answer."""

    excludes: ClassVar[str] = "receipt"
    receipts: Annotated[list[ReceiptText], Field(min_length=1), Limit("max_batch")]

    def receipt_list(self) -> list[str]:
        return self.receipts


class AckOptions(Body):
    archive: bool = True


class AckOne(OneReceipt, AckOptions):
    pass


class AckBatch(ReceiptBatch, AckOptions):
    pass


class FailOptions(Body):
    error: Annotated[
        Text | None, Field(description="what went wrong, kept with the message (x-pgbroker-attempts)")
    ] = None
    traceback: Annotated[Text | None, Field(description="where it went wrong, kept with the error")] = None


class FailOne(OneReceipt, FailOptions):
    pass


class FailBatch(ReceiptBatch, FailOptions):
    pass


class NackOne(OneReceipt, Delayed):
    pass


class NackBatch(ReceiptBatch, Delayed):
    pass


class ExtendOptions(Body):
    vt: Int32


class ExtendOne(OneReceipt, ExtendOptions):
    pass


class ExtendBatch(ReceiptBatch, ExtendOptions):
    pass


AckBody = Annotated[
    Annotated[AckOne, Tag("single")] | Annotated[AckBatch, Tag("batch")], _one_or_batch("receipts")
]
NackBody = Annotated[
    Annotated[NackOne, Tag("single")] | Annotated[NackBatch, Tag("batch")], _one_or_batch("receipts")
]
FailBody = Annotated[
    Annotated[FailOne, Tag("single")] | Annotated[FailBatch, Tag("batch")], _one_or_batch("receipts")
]
ExtendBody = Annotated[
    Annotated[ExtendOne, Tag("single")] | Annotated[ExtendBatch, Tag("batch")], _one_or_batch("receipts")
]
MsgIdBatch = Annotated[list[MsgId], Field(min_length=1), Limit("max_batch")]


class MsgIds(Body):
    msg_ids: MsgIdBatch


class ReplayBody(Body):
    msg_ids: Annotated[MsgIdBatch, Field(description="absent: every dead letter of the queue")] = Field(
        default_factory=list
    )


class DeadLetterQuery(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    limit: Annotated[
        int, Field(ge=1, description="at most this many"), BeforeValidator(query_digits), Limit("max_batch")
    ] = 100
    after: Annotated[
        int,
        Field(ge=0, le=BIGINT_MAX, description="only dead letters with a larger id (paging)"),
        BeforeValidator(query_digits),
    ] = 0


# -- peek and schedules: queries and bodies (routes/peek.py, routes/schedules.py) ----------------


def _query_moment(value: Any) -> Any:
    """An ISO 8601 query string as its datetime; a time without a zone is refused (ambiguous)."""
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return value  # the strict datetime check refuses it, naming the parameter
        if moment.tzinfo is None:
            raise ValueError("give a time zone (e.g. 2025-01-31T12:00:00Z)")
        return moment
    return value


QueryMoment = Annotated[datetime | None, BeforeValidator(_query_moment)]


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


class PeekQuery(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    state: Annotated[
        Literal["waiting", "delayed", "in_flight", "dead"] | None,
        Field(description="only messages in this state (absent: every state but dead)"),
    ] = None
    limit: Annotated[
        int, Field(ge=1, description="at most this many"), BeforeValidator(query_digits), Limit("max_batch")
    ] = 20
    after: Annotated[
        int,
        Field(ge=0, le=BIGINT_MAX, description="only messages with a larger msg_id (paging: next_after)"),
        BeforeValidator(query_digits),
    ] = 0
    before: Annotated[
        int | None,
        Field(ge=0, le=BIGINT_MAX, description="only messages with this msg_id or a smaller one"),
        BeforeValidator(query_digits),
    ] = None
    header: Annotated[Text | None, Field(min_length=1, description="only messages with this header")] = None
    header_value: Annotated[Text | None, Field(description="...whose value, as text, is this")] = None
    enqueued_after: Annotated[QueryMoment, Field(description="enqueued at or after, ISO 8601")] = None
    enqueued_before: Annotated[QueryMoment, Field(description="enqueued before, ISO 8601")] = None
    contains: Annotated[
        Text | None,
        Field(description='only messages whose JSON body has these fields: a JSON object, {"sku": "A-001"}'),
    ] = None

    @model_validator(mode="after")
    def _contains_is_an_object(self) -> PeekQuery:
        if self.contains is not None and not isinstance(_json_or_none(self.contains), dict):
            raise ValueError('contains must be a JSON object, such as {"sku": "A-001"}')
        return self

    @property
    def body_fields(self) -> dict[str, Any] | None:
        fields: dict[str, Any] | None = None if self.contains is None else json.loads(self.contains)
        return fields

    @model_validator(mode="after")
    def _value_needs_header(self) -> PeekQuery:
        if self.header_value is not None and self.header is None:
            raise ValueError("header_value needs header")
        return self


ScheduleName = Annotated[str, StringConstraints(pattern="^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")]
# Text a database can store: no NUL character.
Text = Annotated[str, StringConstraints(pattern="^[^\\x00]*$")]


class AddSchedule(Body):
    name: Annotated[ScheduleName, Field(description="1 to 100 letters, digits, _ . : or -")]
    queue: QueueName
    cron: Annotated[Text, Field(description="5 fields, e.g. '*/5 * * * *', or @hourly, @daily, ...")]
    message: Annotated[JsonValue, Field(description="the message each tick sends")]
    headers: Annotated[JsonObject | None, Field(description="its headers")] = None
    timezone: Annotated[Text, Field(description="an IANA time zone")] = "UTC"
    replace: Annotated[bool, Field(description="redefine a schedule of that name")] = False


# -- answers ------------------------------------------------------------------------------------


class Answer(BaseModel):
    """A JSON answer. pgbroker's records (QueueInfo, Metrics, QueueStats: dataclasses) answer
    as they are, and their schemas are derived from them."""

    model_config = ConfigDict(from_attributes=True, frozen=True)


class Message(Answer):
    msg_id: int
    read_ct: int
    enqueued_at: datetime
    last_read_at: datetime | None
    vt: datetime
    message: Any
    headers: dict[str, Any] | None
    receipt: str | None

    @classmethod
    def of(cls, m: core.Message) -> Message:
        return cls(
            msg_id=m.msg_id,
            read_ct=m.read_ct,
            enqueued_at=m.enqueued_at,
            last_read_at=m.last_read_at,
            vt=m.vt,
            message=json_view(m.message),  # a binary codec's value in its JSON form
            headers=m.headers,
            receipt=str(m.receipt) if m.receipt else None,
        )


class Messages(Answer):
    messages: list[Message]


class QueueList(Answer):
    queues: list[core.QueueInfo]


class StatsList(Answer):
    queues: list[prom.QueueStats]
    replica_lag_seconds: float | None = Field(
        default=None,
        description="how far behind its primary the replica these figures come from is "
        "(pgbroker serve --replica-dsn); null when they come from the primary",
    )


class HistoryQuery(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    minutes: Annotated[
        int, Field(ge=1, le=43_200, description="the last this many minutes"), BeforeValidator(query_digits)
    ] = 60
    points: Annotated[
        int,
        Field(ge=1, le=2000, description="at most about this many samples per queue"),
        BeforeValidator(query_digits),
    ] = 300


class History(Answer):
    interval_seconds: float  # how often the server samples (0: it does not)
    retention_seconds: float  # how long samples are kept
    samples: list[monitoring.HistorySample]


class Workers(Answer):
    queue_workers: list[monitoring.QueueWorker]
    stream_consumers: list[monitoring.StreamConsumer]


class Created(Answer):
    queue_name: str


class Dropped(Answer):
    dropped: str


class MsgIdList(Answer):
    msg_ids: list[int]


class Acked(Answer):
    acked: list[int]
    stale: list[str]


class Nacked(Answer):
    nacked: list[int]
    stale: list[str]


class Failed(Answer):
    outcomes: Annotated[
        dict[str, str],
        Field(description="by msg_id: retry (back after the back-off) or dead_lettered (its last delivery)"),
    ]
    stale: list[str]


class Extended(Answer):
    receipts: Annotated[dict[str, str], Field(description="the new receipt of each msg_id renewed")]
    stale: list[str]


class Archived(Answer):
    archived: list[int]


class Deleted(Answer):
    deleted: list[int]


class Retried(Answer):
    retried: Annotated[list[int], Field(description="the msg_ids made visible (absent ones left out)")]


class Purged(Answer):
    purged: int


class PauseState(Answer):
    queue_name: str
    paused: bool
    changed: Annotated[bool, Field(description="false when the queue was in that state already")]


class ReplayedPair(Answer):
    dead_letter_id: int
    msg_id: int


class Replayed(Answer):
    replayed: list[ReplayedPair]


class KeyInfo(Answer):
    name: str
    scopes: list[str]
    queues: list[str]
    groups: Annotated[list[str], Field(description="the consumer groups of its streams it may use")]


class Health(Answer):
    status: str


# -- peek and schedules: answers -----------------------------------------------------------------


class PeekedMessage(Message):
    state: Annotated[str, Field(description="waiting, delayed, in_flight or dead")]


class PeekedMessages(Answer):
    messages: list[PeekedMessage]
    next_after: Annotated[int | None, Field(description="the after of the next page; null: no more")]


class ScheduleList(Answer):
    schedules: list[core.Schedule]


class ScheduleRemoved(Answer):
    removed: str
