"""Message bodies beyond JSON: JSON, MessagePack, Protobuf and Avro, chosen per queue or per send.

A codec has a name ("json", "msgpack", "protobuf:<message type>", "avro:<schema full name>") and a
content type ("application/json", "application/msgpack",
"application/x-protobuf; messageType=<type>", "application/avro; type=<name>"); it turns a value
into bytes and back. The libraries of the binary codecs are optional (pip install
'pgbroker[codecs]') and imported only when such a codec is used.

Storage. pgmq's ``message`` column is jsonb and every pgmq client JSON-decodes it, so a binary
body is stored there inside a documented JSON envelope (envelope.py):

    {"$pgbroker": {"codec": "msgpack", "content_type": "application/msgpack", "data": "<base64>"}}

A pgmq client in any language still reads valid JSON and can take the bytes out of ``data``; every
door that moves messages (archive, dead letters, replay, topics, partitions, Spark, bridges) carries
them unchanged. The cost is base64's third plus about 80 bytes a message. A column beside
``message`` was rejected: pgmq.read's result has no place for it (a pgmq client would see a NULL or
a placeholder body), and every function that moves a message would have to carry it. A JSON body
is stored as itself, as before, so a queue that never uses a binary codec is untouched (an object
whose only key is "$pgbroker" is read as an envelope: that key is reserved). docs/codecs.md says
more.

A queue's default codec is its policy's ``codec`` setting (set_policy(codec=...), `pgbroker
policy set Q --codec msgpack`); a send may name another. Reads decode whatever each message was
written with.

For the bridges (bytes on the wire + content type):
    encode(value, codec) -> (bytes, content_type)      decode(bytes, content_type) -> value
    wire_body(stored) -> (bytes, content_type)          stored_from_wire(bytes, content_type) -> stored
the last two pass binary bodies through without decoding them (no schema needed).
"""

from __future__ import annotations

from typing import Any

from pgbroker.codecs.avro_codec import AvroCodec
from pgbroker.codecs.base import Codec
from pgbroker.codecs.envelope import envelope_codec, is_envelope, open_envelope
from pgbroker.codecs.errors import CodecError, CodecNotInstalled, CorruptBody, EncodeError, UnknownCodec
from pgbroker.codecs.json_codec import JsonCodec
from pgbroker.codecs.json_view import json_view
from pgbroker.codecs.msgpack_codec import MsgpackCodec
from pgbroker.codecs.protobuf_codec import ProtobufCodec
from pgbroker.codecs.registry import (
    CodecLike,
    CodecRegistry,
    Decoded,
    codec_name,
    stored_from_wire,
    wire_body,
)

__all__ = [
    "AvroCodec",
    "Codec",
    "CodecError",
    "CodecLike",
    "CodecNotInstalled",
    "CodecRegistry",
    "CorruptBody",
    "Decoded",
    "EncodeError",
    "JsonCodec",
    "MsgpackCodec",
    "ProtobufCodec",
    "UnknownCodec",
    "codec_name",
    "decode",
    "default_registry",
    "encode",
    "envelope_codec",
    "from_stored",
    "get",
    "is_envelope",
    "json_view",
    "open_envelope",
    "register",
    "stored_from_wire",
    "to_stored",
    "to_stored_text",
    "wire_body",
]

_DEFAULT = CodecRegistry()


def default_registry() -> CodecRegistry:
    """The registry the clients, the worker and Spark use."""
    return _DEFAULT


def register(codec: Codec) -> Codec:
    """Make a codec known to this process by its name (an Avro schema, a Protobuf class, yours)."""
    return _DEFAULT.register(codec)


def get(codec: CodecLike) -> Codec:
    return _DEFAULT.get(codec)


def encode(value: Any, codec: CodecLike = "json") -> tuple[bytes, str]:
    """(bytes, content type) of a value: what a bridge puts on the wire."""
    return _DEFAULT.encode(value, codec)


def decode(data: bytes, content_type: str) -> Any:
    """The value in bytes received with ``content_type``."""
    return _DEFAULT.decode(data, content_type)


def to_stored(value: Any, codec: CodecLike = "json") -> Any:
    """The JSON value to store in ``message`` (the value itself for JSON, else an envelope)."""
    return _DEFAULT.to_stored(value, codec)


def to_stored_text(value: Any, codec: CodecLike = "json") -> str:
    """to_stored() as JSON text, for a jsonb parameter."""
    return _DEFAULT.to_stored_text(value, codec)


def from_stored(stored: Any) -> Decoded:
    """A stored body decoded, with the name of its codec."""
    return _DEFAULT.from_stored(stored)
