"""Message bodies in Spark by codec (option codec; pgbroker.codecs, docs/codecs.md).

codec=json or msgpack: ``message`` stays JSON text, the existing representation; a binary body
is decoded and shown as JSON (bytes as base64). codec=avro (option avroSchema) or protobuf (option
protobufClass): ``message`` is a struct column whose type follows the schema or message type; a
plain JSON object in the queue fills it by field name. A body that cannot be read fails the task,
naming its msg_id and why: a pipeline does not drop data quietly. Writing encodes the other way:
JSON text or a struct in, the codec's envelope stored.
"""

from __future__ import annotations

import importlib
import json
from functools import cache
from typing import Any

from pgbroker import codecs
from pgbroker.codecs import Codec, CodecError, CorruptBody
from pgbroker.codecs.protobuf_codec import to_python
from pgbroker.spark.options import BodyOptions, OptionError

STRUCT_CODECS = ("avro", "protobuf")


@cache
def codec_of(body: BodyOptions) -> Codec:
    """The codec the options name, made once per process (driver or executor) and registered."""
    if body.codec == "avro":
        assert body.avro_schema is not None
        return codecs.register(codecs.AvroCodec(body.avro_schema))
    if body.codec == "protobuf":
        assert body.protobuf_class is not None
        return codecs.register(codecs.ProtobufCodec(_import_class(body.protobuf_class)))
    return codecs.get(body.codec)


def _import_class(path: str) -> type[Any]:
    module, _, name = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        found: type[Any] = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise OptionError(
            f"option protobufClass: cannot import {path!r} ({exc})",
            hint="Give 'module:Class' of a module the driver and the executors can import.",
        ) from None
    return found


def message_type(body: BodyOptions | None) -> Any:
    """The Spark type of the message column: STRING, or a struct for avro and protobuf."""
    from pyspark.sql import types as T

    if body is None or body.codec not in STRUCT_CODECS:
        return T.StringType()
    codec = codec_of(body)
    if isinstance(codec, codecs.AvroCodec):
        return _avro_type(codec.schema, {}, ())
    assert isinstance(codec, codecs.ProtobufCodec)
    return _protobuf_type(codec.message_class.DESCRIPTOR, ())


def _avro_type(schema: Any, named: dict[str, Any], within: tuple[str, ...]) -> Any:
    from pyspark.sql import types as T

    primitive = {
        "null": T.NullType(),
        "boolean": T.BooleanType(),
        "int": T.IntegerType(),
        "long": T.LongType(),
        "float": T.FloatType(),
        "double": T.DoubleType(),
        "bytes": T.BinaryType(),
        "string": T.StringType(),
    }
    if isinstance(schema, str):
        if schema in primitive:
            return primitive[schema]
        if schema in within:
            raise OptionError(f"Avro type {schema} is recursive: it cannot be a Spark column")
        return _avro_type(named[schema], named, within)
    if isinstance(schema, list):
        kinds = [s for s in schema if s != "null"]
        if len(kinds) != 1:
            raise OptionError(f"an Avro union of several types cannot be a Spark column: {schema}")
        return _avro_type(kinds[0], named, within)
    kind, logical = schema["type"], schema.get("logicalType")
    if logical in ("timestamp-millis", "timestamp-micros"):
        return T.TimestampType()
    if logical == "date":
        return T.DateType()
    if logical == "decimal":
        return T.DecimalType(schema["precision"], schema.get("scale", 0))
    if kind in ("record", "enum", "fixed"):
        named[schema["name"]] = schema
    if kind == "record":
        inner = (*within, schema["name"])
        fields = [T.StructField(f["name"], _avro_type(f["type"], named, inner)) for f in schema["fields"]]
        return T.StructType(fields)
    if kind == "enum":
        return T.StringType()
    if kind == "fixed":
        return T.BinaryType()
    if kind == "array":
        return T.ArrayType(_avro_type(schema["items"], named, within))
    if kind == "map":
        return T.MapType(T.StringType(), _avro_type(schema["values"], named, within))
    return _avro_type(kind, named, within)


def _protobuf_type(descriptor: Any, within: tuple[str, ...]) -> Any:
    from google.protobuf.descriptor import FieldDescriptor as F
    from pyspark.sql import types as T

    if descriptor.full_name in within:
        raise OptionError(f"Protobuf type {descriptor.full_name} is recursive: it cannot be a Spark column")
    inner = (*within, descriptor.full_name)
    scalars = {
        F.TYPE_DOUBLE: T.DoubleType(),
        F.TYPE_FLOAT: T.FloatType(),
        F.TYPE_BOOL: T.BooleanType(),
        F.TYPE_STRING: T.StringType(),
        F.TYPE_BYTES: T.BinaryType(),
        F.TYPE_ENUM: T.StringType(),  # its value's name
        **dict.fromkeys((F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32), T.IntegerType()),
        # uint64 beyond 2**63 does not fit; Spark has no unsigned type.
        **dict.fromkeys(
            (
                F.TYPE_INT64,
                F.TYPE_SINT64,
                F.TYPE_SFIXED64,
                F.TYPE_UINT32,
                F.TYPE_FIXED32,
                F.TYPE_UINT64,
                F.TYPE_FIXED64,
            ),
            T.LongType(),
        ),
    }

    def of(field: Any) -> Any:
        if field.message_type is not None:
            return _protobuf_type(field.message_type, inner)
        return scalars[field.type]

    fields: list[Any] = []
    kind: Any
    for field in descriptor.fields:
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            kind = T.MapType(of(entry.fields_by_name["key"]), of(entry.fields_by_name["value"]))
        elif hasattr(field, "is_repeated") and field.is_repeated:
            kind = T.ArrayType(of(field))
        else:
            kind = of(field)
        fields.append(T.StructField(field.name, kind))
    return T.StructType(fields)


# -- executors: batches out of and into queues ---------------------------------------------------


def decode_batch(batch: Any, body: BodyOptions) -> Any:
    """A RecordBatch read from a queue with its message column decoded as ``body`` says."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    index = batch.schema.get_field_index("message")
    if index < 0:
        return batch
    ids = batch.column("msg_id").to_pylist() if "msg_id" in batch.schema.names else [None] * batch.num_rows
    struct = body.codec in STRUCT_CODECS
    values = [
        _decoded(text, body, struct, msg_id)
        for text, msg_id in zip(batch.column(index).to_pylist(), ids, strict=True)
    ]
    kind = to_arrow_type(message_type(body), timezone="UTC")
    try:
        column = pa.array(values, type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise CorruptBody(
            f"a message does not fit the column type {message_type(body).simpleString()}: {exc}"
        ) from None
    return batch.set_column(index, pa.field("message", kind), column)


def _decoded(text: str | None, body: BodyOptions, struct: bool, msg_id: int | None) -> Any:
    if text is None:
        return None
    stored = json.loads(text)
    if not codecs.is_envelope(stored):
        return stored if struct else text
    try:
        if struct:
            envelope_codec = codecs.envelope_codec(stored)
            if envelope_codec != codec_of(body).name:
                raise CorruptBody(f"its body is {envelope_codec}, not {codec_of(body).name}")
            value = codec_of(body).decode(codecs.open_envelope(stored).data)
            return to_python(value) if body.codec == "protobuf" else value
        return json.dumps(codecs.json_view(codecs.from_stored(stored).value), separators=(",", ":"))
    except CodecError as exc:
        raise type(exc)(f"message {msg_id}: {exc.message}", hint=exc.hint) from None


def encode_column(column: Any, body: BodyOptions) -> Any:
    """The message column of rows to send (JSON text, or a struct) as the stored JSON text."""
    import pyarrow as pa

    codec = codec_of(body)
    struct = pa.types.is_struct(column.type)
    stored = []
    for value in column.to_pylist():
        item = value if struct or value is None else json.loads(value)
        stored.append(codecs.to_stored_text(item, codec))
    return pa.array(stored, type=pa.string())
