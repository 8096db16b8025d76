"""The shape of queue data in Spark: the read schema, its Arrow twin, and what a write accepts.

A message and its headers are JSON in Postgres and JSON text in Spark (Spark has no JSON type:
from_json and get_json_object read it, to_json makes it). Timestamps are UTC instants.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pgbroker.spark.options import BodyOptions, OptionError

SPARK_TYPES = {
    "msg_id": "BIGINT",
    "read_ct": "INT",
    "enqueued_at": "TIMESTAMP",
    "last_read_at": "TIMESTAMP",
    "vt": "TIMESTAMP",
    "message": "STRING",
    "headers": "STRING",
    "archived_at": "TIMESTAMP",
    # Streams (pgbroker.spark.stream.options.STREAM_COLUMNS).
    "partition": "INT",
    "id": "BIGINT",
    "key": "STRING",
}

WRITE_COLUMNS = ("message", "headers", "delay")


class SchemaMismatch(OptionError):
    """A DataFrame written to a queue has columns the sink cannot take."""


def spark_ddl(columns: Sequence[str], body: BodyOptions | None = None) -> str:
    """The read schema as Spark DDL, for example 'msg_id BIGINT, message STRING'."""
    message = SPARK_TYPES["message"] if body is None else column_type("message", body)
    return ", ".join(f"{name} {message if name == 'message' else SPARK_TYPES[name]}" for name in columns)


def column_type(name: str, body: BodyOptions | None = None) -> str:
    """A column's Spark type as Spark writes it (simpleString): the message's follows the codec."""
    if name == "message" and body is not None:
        from pgbroker.spark.bodies import message_type

        return str(message_type(body).simpleString())
    return SPARK_TYPES[name].lower()


def arrow_types(columns: Sequence[str]) -> dict[str, Any]:
    """The Arrow type of each column, as Spark converts the read schema (timestamps in UTC)."""
    import pyarrow as pa

    timestamp = pa.timestamp("us", tz="UTC")
    by_name = {
        "msg_id": pa.int64(),
        "read_ct": pa.int32(),
        "message": pa.string(),
        "headers": pa.string(),
        "partition": pa.int32(),
        "id": pa.int64(),
        "key": pa.string(),
    }
    return {name: by_name.get(name, timestamp) for name in columns}


@dataclass(frozen=True)
class WriteLayout:
    """Which optional columns a DataFrame written to a queue has."""

    headers: bool
    delay: Literal["seconds", "until"] | None
    body: BodyOptions | None = None  # how to encode the message column (pgbroker.spark.bodies)

    @property
    def columns(self) -> tuple[str, ...]:
        return ("message", *(["headers"] if self.headers else []), *(["delay"] if self.delay else []))


def write_layout(schema: Any, body: BodyOptions | None = None) -> WriteLayout:
    """Check a DataFrame's schema (a pyspark StructType) against what a queue takes.

    message: JSON text (STRING), required. headers: a JSON object as text (STRING), optional.
    delay: seconds (an integer type) or the time the message becomes visible (TIMESTAMP),
    optional. Nothing else: a column that would be silently dropped is more likely a mistake.
    """
    from pyspark.sql import types as T

    fields = {field.name.lower(): field.dataType for field in schema.fields}
    extra = [name for name in fields if name not in WRITE_COLUMNS]
    if extra:
        raise SchemaMismatch(
            f"cannot write column{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))} to a queue: "
            "a message is the columns message (JSON text), headers (JSON object text, optional) "
            "and delay (seconds or a timestamp, optional)",
            hint="Select them first, for example df.select(to_json(struct('*')).alias('message')).",
        )
    if "message" not in fields:
        raise SchemaMismatch(
            "a DataFrame written to a queue needs a column 'message' (JSON text)",
            hint="For example df.select(to_json(struct('*')).alias('message')).",
        )
    struct_body = body is not None and body.codec in ("avro", "protobuf")
    if not isinstance(fields["message"], T.StringType) and not (
        struct_body and isinstance(fields["message"], T.StructType)
    ):
        raise SchemaMismatch(
            f"column 'message' must be a STRING holding JSON, not {fields['message'].simpleString()}",
            hint="Turn it into JSON text with to_json(...) (or to_json(struct(...)) for several columns).",
        )
    if "headers" in fields and not isinstance(fields["headers"], T.StringType):
        raise SchemaMismatch(
            "column 'headers' must be a STRING holding a JSON object, "
            f"not {fields['headers'].simpleString()}",
            hint="Turn a map or struct into JSON text with to_json(...).",
        )
    delay: Literal["seconds", "until"] | None = None
    if "delay" in fields:
        kind = fields["delay"]
        if isinstance(kind, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
            delay = "seconds"
        elif isinstance(kind, T.TimestampType | T.TimestampNTZType):
            delay = "until"
        else:
            raise SchemaMismatch(
                f"column 'delay' must be whole seconds (an integer type) or a TIMESTAMP, "
                f"not {kind.simpleString()}",
                hint="For example col('delay').cast('int').",
            )
    return WriteLayout(headers="headers" in fields, delay=delay, body=body)
