"""The REST API's request and response models. The server validates every request body and query
by them (pgbroker.http.operations), answers with them, and the OpenAPI spec is derived from them
(pgbroker.http.openapi): what the spec promises is what the server checks.

Request models are strict (no "30" for 30, no 1 for true; an integral float such as 30.0 counts
as an integer, as JSON Schema says) and ignore unknown fields. Two bounds come from the server's
settings (the batch size, the long-poll wait): ``Limit`` checks them against the settings given as
the validation context and marks them in the JSON schema, where openapi.py writes the values in.

A refusal the API has always answered with its own status and code (an invalid queue name, a
malformed receipt) is raised as a pydantic error of that name: REFUSALS maps it to its answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StringConstraints,
    Tag,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
    model_validator,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from pgbroker.codecs.json_view import json_view
from pgbroker.http import metrics as prom
from pgbroker.http import monitoring
from pgbroker.http.settings import Settings
from pgbroker.queues import _records as core

INT32_MAX = 2**31 - 1
BIGINT_MAX = 2**63 - 1

# The names every pgbroker accepts: letters, digits, _ and - (never two - in a row: SQL's comment),
# at most 47. The SQL API takes some others too (non-ASCII letters, up to 47 bytes) and judges the
# names in a path; what the HTTP API creates, and what the spec promises, is the portable set.
QUEUE_NAME_PATTERN = "^-?[A-Za-z0-9_]+(-[A-Za-z0-9_]+)*-?$"
QUEUE_NAME_MAX = 47
RECEIPT_PATTERN = "^[0-9]{1,18}:[0-9]{1,9}:-?[0-9]{1,18}$"

#: The answers to the refusals raised under their own names: (status, code, hint).
REFUSALS: dict[str, tuple[int, str, str | None]] = {
    "invalid_queue_name": (
        400,
        "invalid_queue_name",
        "Use 1 to 47 letters, digits, _ and - (never two - in a row).",
    ),
    "invalid_receipt": (400, "invalid_argument", "Pass the receipt exactly as the read returned it."),
}

# The tags of the one-or-batch bodies: left out of an error's location.
FORMS = ("single", "batch")


@dataclass(frozen=True)
class RequestContext:
    """What validation needs beyond the data: the server's limits, and whether the raw body held
    an escaped NUL at all (when it did not, no string can hold one and nothing is walked)."""

    settings: Settings
    nul_escape: bool = True


def _context(info: ValidationInfo) -> RequestContext:
    context = info.context
    return context if isinstance(context, RequestContext) else RequestContext(Settings())


LIMIT_MARK = "x-pgbroker-limit"


@dataclass(frozen=True)
class Limit:
    """An upper bound set by the server's settings: the items of an array or a number's maximum.

    Checked against the settings of the validation context; in the JSON schema it is the mark
    ``x-pgbroker-limit``, which openapi.py replaces with maxItems or maximum of that value.
    """

    setting: Literal["max_batch", "max_wait_seconds"]

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.with_info_after_validator_function(self._check, handler(source))

    def _check(self, value: Any, info: ValidationInfo) -> Any:
        bound: float = getattr(_context(info).settings, self.setting)
        if isinstance(value, list):
            if len(value) > bound:
                raise PydanticCustomError("too_long", "at most {bound} items", {"bound": f"{bound:g}"})
        elif value > bound:
            raise PydanticCustomError("less_than_equal", "at most {bound}", {"bound": f"{bound:g}"})
        return value

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema[LIMIT_MARK] = self.setting
        return json_schema


def _integral(value: Any) -> Any:
    """An integral float as the int it is (JSON Schema counts 30.0 as an integer); anything else
    as it came, for the strict int check to judge (bool is no integer here)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _query_digits(value: Any) -> Any:
    """A query string of at most 19 ASCII digits as its int (int() refuses past 4,300 digits)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        return int(value)
    return value


# The constraints come before the conversions, so that pydantic sets them on the int itself (and
# writes them as minimum and maximum).
Int32 = Annotated[int, Field(ge=0, le=INT32_MAX), BeforeValidator(_integral)]
MsgId = Annotated[int, Field(ge=1, le=BIGINT_MAX), BeforeValidator(_integral)]
BatchOf = Annotated[int, Field(ge=1), BeforeValidator(_integral), Limit("max_batch")]


def _renamed_refusal(code: str, message: str) -> Callable[[Any, ValidatorFunctionWrapHandler], Any]:
    """A wrap validator raising the refusal ``code`` when a string breaks its constraints (a value
    of another type keeps the ordinary type error)."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if not isinstance(value, str):
            return handler(value)
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError(code, message, {"value": repr(value)}) from None

    return validate


QueueName = Annotated[
    str,
    StringConstraints(pattern=QUEUE_NAME_PATTERN, max_length=QUEUE_NAME_MAX),
    WrapValidator(_renamed_refusal("invalid_queue_name", "queue name {value} is not allowed over HTTP")),
]
ReceiptText = Annotated[
    str,
    StringConstraints(pattern=RECEIPT_PATTERN),
    WrapValidator(
        _renamed_refusal("invalid_receipt", "malformed receipt {value}: expected <msg_id>:<read_ct>:<lease>")
    ),
    Field(description="<msg_id>:<read_ct>:<lease>, exactly as a read returned it"),
]


class SchemaWriter(GenerateJsonSchema):
    """pydantic's JSON Schema without titles: a name says nothing its property does not."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        json_schema = super().model_schema(schema)
        json_schema.pop("title", None)
        return json_schema

    def dataclass_schema(self, schema: core_schema.DataclassSchema) -> JsonSchemaValue:
        json_schema = super().dataclass_schema(schema)
        json_schema.pop("title", None)
        return json_schema

    def generate(self, schema: CoreSchema, mode: Any = "validation") -> JsonSchemaValue:
        json_schema = super().generate(schema, mode)
        json_schema.pop("title", None)
        return json_schema


# -- JSON documents as jsonb stores them ---------------------------------------------------------

_NUL_FREE: dict[str, Any] = {"type": "string", "pattern": "^[^\\u0000]*$"}
#: JSON as PostgreSQL's jsonb takes it: the NUL character is the one thing it refuses.
JSON_SCHEMAS: dict[str, Any] = {
    "JsonValue": {
        "anyOf": [
            _NUL_FREE,
            {"type": ["number", "boolean", "null"]},
            {"type": "array", "items": {"$ref": "#/components/schemas/JsonValue"}},
            {"$ref": "#/components/schemas/JsonObject"},
        ]
    },
    "JsonObject": {
        "type": "object",
        "propertyNames": _NUL_FREE,
        "additionalProperties": {"$ref": "#/components/schemas/JsonValue"},
    },
}


def _holds_nul(document: Any) -> bool:
    # A stack, not recursion: json.loads takes documents nested deeper than the frames left here.
    pending = [document]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return True
        elif isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return False


def _storable(value: Any, info: ValidationInfo) -> Any:
    # The body came through json.loads: only a NUL (written \u0000) can make it unstorable.
    if _context(info).nul_escape and _holds_nul(value):
        raise PydanticCustomError("nul_character", "jsonb cannot store the NUL character (\\u0000)")
    return value


#: Marks the place of a reference to JSON_SCHEMAS, which openapi.py writes as the $ref (pydantic
#: would look a $ref up among its own definitions).
DOCUMENT_MARK = "x-pgbroker-document"


JsonValue = Annotated[
    Any, AfterValidator(_storable), WithJsonSchema({DOCUMENT_MARK: "JsonValue"}, mode="validation")
]
JsonObject = Annotated[
    dict[str, Any],
    AfterValidator(_storable),
    WithJsonSchema({DOCUMENT_MARK: "JsonObject"}, mode="validation"),
]


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
        int, Field(ge=1, description="at most this many"), BeforeValidator(_query_digits), Limit("max_batch")
    ] = 100
    after: Annotated[
        int,
        Field(ge=0, le=BIGINT_MAX, description="only dead letters with a larger id (paging)"),
        BeforeValidator(_query_digits),
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
        int, Field(ge=1, description="at most this many"), BeforeValidator(_query_digits), Limit("max_batch")
    ] = 20
    after: Annotated[
        int,
        Field(ge=0, le=BIGINT_MAX, description="only messages with a larger msg_id (paging: next_after)"),
        BeforeValidator(_query_digits),
    ] = 0
    before: Annotated[
        int | None,
        Field(ge=0, le=BIGINT_MAX, description="only messages with this msg_id or a smaller one"),
        BeforeValidator(_query_digits),
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


class HistoryQuery(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)
    minutes: Annotated[
        int, Field(ge=1, le=43_200, description="the last this many minutes"), BeforeValidator(_query_digits)
    ] = 60
    points: Annotated[
        int, Field(ge=1, le=2000, description="at most about this many samples per queue"),
        BeforeValidator(_query_digits),
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
