"""The rules the REST API's models are built from (pgbroker.http.models).

Request models are strict (no "30" for 30, no 1 for true; an integral float such as 30.0 counts
as an integer, as JSON Schema says) and ignore unknown fields. Two bounds come from the server's
settings (the batch size, the long-poll wait): ``Limit`` checks them against the settings given as
the validation context and marks them in the JSON schema, where openapi.py writes the values in.

A refusal the API has always answered with its own status and code (an invalid queue name, a
malformed receipt) is raised as a pydantic error of that name: REFUSALS maps it to its answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from pgbroker.http.settings import Settings

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


def integral(value: Any) -> Any:
    """An integral float as the int it is (JSON Schema counts 30.0 as an integer); anything else
    as it came, for the strict int check to judge (bool is no integer here)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def query_digits(value: Any) -> Any:
    """A query string of at most 19 ASCII digits as its int (int() refuses past 4,300 digits)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19:
        return int(value)
    return value


# The constraints come before the conversions, so that pydantic sets them on the int itself (and
# writes them as minimum and maximum).
Int32 = Annotated[int, Field(ge=0, le=INT32_MAX), BeforeValidator(integral)]
MsgId = Annotated[int, Field(ge=1, le=BIGINT_MAX), BeforeValidator(integral)]
BatchOf = Annotated[int, Field(ge=1), BeforeValidator(integral), Limit("max_batch")]


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
