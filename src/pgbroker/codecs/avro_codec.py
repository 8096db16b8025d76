"""Avro (the fastavro package): a body is one datum of a named schema the user gives.

Bytes are Avro's single-object encoding: the marker C3 01, the schema's 8-byte CRC-64-AVRO
fingerprint, then the datum in binary. A reader therefore notices a body written with another
schema (CorruptBody) instead of misreading it, and Avro libraries of other languages read it as it
is. The codec's name is "avro:<the schema's full name>"; register it once per process:
pgbroker.codecs.register(AvroCodec(schema)).
"""

from __future__ import annotations

import io
import json
from typing import Any

from pgbroker.codecs.base import Codec, require
from pgbroker.codecs.errors import CorruptBody, EncodeError, UnknownCodec

FAMILY = "avro"
MEDIA_TYPE = "application/avro"
MEDIA_TYPES = (MEDIA_TYPE, "avro/binary", "application/vnd.apache.avro+binary")
MARKER = b"\xc3\x01"


class AvroCodec(Codec):
    """Encodes dicts that match ``schema`` (a dict, or its JSON text) and decodes to dicts."""

    def __init__(self, schema: dict[str, Any] | str) -> None:
        fastavro = require("fastavro", FAMILY)
        from fastavro.schema import fingerprint, to_parsing_canonical_form

        try:
            given = json.loads(schema) if isinstance(schema, str) else schema
            self.schema = fastavro.parse_schema(given)
        except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
            raise UnknownCodec(f"not a valid Avro schema: {exc}") from None
        full_name = self.schema.get("name") if isinstance(self.schema, dict) else None
        if not isinstance(full_name, str):
            raise UnknownCodec(
                "an Avro codec needs a named schema (a record, enum or fixed)",
                hint='Wrap the type in a record: {"type": "record", "name": "...", "fields": [...]}.',
            )
        self.type_name = full_name
        self.name = f"{FAMILY}:{full_name}"
        self.content_type = f"{MEDIA_TYPE}; type={full_name}"
        canonical = to_parsing_canonical_form(self.schema)
        self.header = MARKER + bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))

    def encode(self, value: Any) -> bytes:
        from fastavro import schemaless_writer
        from fastavro.validation import ValidationError, validate

        try:
            validate(value, self.schema, raise_errors=True)
        except ValidationError as exc:
            raise EncodeError(
                f"message does not match the Avro schema {self.type_name}: {exc}",
                hint="Give every field of the schema a value of its type.",
            ) from None
        out = io.BytesIO()
        out.write(self.header)
        try:
            schemaless_writer(out, self.schema, value)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise EncodeError(f"message cannot be encoded as {self.type_name}: {exc}") from None
        return out.getvalue()

    def decode(self, data: bytes) -> Any:
        from fastavro import schemaless_reader

        if data[:2] != MARKER:
            raise CorruptBody(f"body is not Avro single-object encoded (it starts {data[:2]!r})")
        if data[: len(self.header)] != self.header:
            raise CorruptBody(
                f"body was written with another Avro schema than this process's {self.type_name} "
                f"(fingerprint {data[2:10].hex()}, expected {self.header[2:].hex()})",
                hint="Register the schema the producer wrote with (AvroCodec(schema)).",
            )
        body = io.BytesIO(data)
        body.seek(len(self.header))
        try:
            value = schemaless_reader(body, self.schema, None)
        except (EOFError, StopIteration, ValueError, IndexError, UnicodeDecodeError, TypeError) as exc:
            raise CorruptBody(f"body is not a valid {self.type_name} datum: {exc!r}") from None
        if body.tell() != len(data):
            raise CorruptBody(f"body has {len(data) - body.tell()} bytes after its {self.type_name} datum")
        return value
