"""Codecs by name and by content type; the process-wide default registry.

"json" and "msgpack" are always there (msgpack's library is imported on first use); a Protobuf
type resolves from the default descriptor pool once its generated module is imported; an Avro
schema (or any Codec of your own) is registered once per process with register().
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from pgbroker.codecs import avro_codec, protobuf_codec
from pgbroker.codecs.base import Codec, parse_content_type
from pgbroker.codecs.envelope import Envelope, is_envelope, open_envelope
from pgbroker.codecs.errors import UnknownCodec
from pgbroker.codecs.json_codec import JsonCodec, dump_text
from pgbroker.codecs.msgpack_codec import CONTENT_TYPES as MSGPACK_TYPES
from pgbroker.codecs.msgpack_codec import MsgpackCodec

CodecLike = str | Codec
JSON = "json"


@dataclass(frozen=True, slots=True)
class Decoded:
    """A stored body decoded: the value and the name of the codec it was written with."""

    value: Any
    codec: str


class CodecRegistry:
    """Codecs by name; thread-safe. Most programs use the default one (module functions)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, Codec] = {JSON: JsonCodec()}

    def register(self, codec: Codec) -> Codec:
        """Make ``codec`` known by its name (replacing one of the same name); returns it."""
        if not isinstance(codec, Codec):
            raise UnknownCodec(f"expected a Codec, got {type(codec).__name__}")
        with self._lock:
            self._by_name[codec.name] = codec
        return codec

    def get(self, codec: CodecLike) -> Codec:
        """The codec named (a Codec passes through), or UnknownCodec saying how to make it known."""
        if isinstance(codec, Codec):
            return codec
        if not isinstance(codec, str):
            raise UnknownCodec(f"a codec is a name or a Codec, got {type(codec).__name__}")
        found = self._by_name.get(codec)
        if found is not None:
            return found
        family, _, type_name = codec.partition(":")
        if codec == MsgpackCodec.name:
            return self.register(MsgpackCodec())
        if family == protobuf_codec.FAMILY and type_name:
            return self.register(protobuf_codec.resolve(type_name))
        if family == avro_codec.FAMILY and type_name:
            raise UnknownCodec(
                f"no Avro schema registered for {codec!r}",
                hint="Register it once per process: pgbroker.codecs.register(AvroCodec(schema)).",
            )
        raise UnknownCodec(
            f"unknown codec {codec!r}",
            hint="Codecs: json, msgpack, protobuf:<message type>, avro:<schema full name>, "
            "or one registered with pgbroker.codecs.register().",
        )

    def for_content_type(self, content_type: str) -> Codec:
        """The codec of a Content-Type (as a broker or HTTP carries it), or UnknownCodec."""
        return self.get(codec_name(content_type))

    # -- bytes on the wire ------------------------------------------------------------------

    def encode(self, value: Any, codec: CodecLike = JSON) -> tuple[bytes, str]:
        """(bytes, content type) of a value."""
        chosen = self.get(codec)
        return chosen.encode(value), chosen.content_type

    def decode(self, data: bytes, content_type: str) -> Any:
        """The value in ``data``, read by the codec of ``content_type``."""
        return self.for_content_type(content_type).decode(data)

    # -- the stored form (pgmq's message column) --------------------------------------------

    def to_stored(self, value: Any, codec: CodecLike = JSON) -> Any:
        """What to store in ``message``: a JSON body as itself, any other in an envelope."""
        chosen = self.get(codec)
        if chosen.name == JSON:
            dump_text(value)  # refuses what JSON cannot hold, and the envelope's shape
            return value
        return Envelope(chosen.name, chosen.content_type, chosen.encode(value)).stored()

    def to_stored_text(self, value: Any, codec: CodecLike = JSON) -> str:
        """to_stored() as JSON text, ready for a jsonb parameter."""
        chosen = self.get(codec)
        if chosen.name == JSON:
            return dump_text(value)
        return dump_text(self.to_stored(value, chosen), "envelope")

    def from_stored(self, stored: Any) -> Decoded:
        """The value of a stored body; UnknownCodec or CorruptBody when it cannot be read."""
        if not is_envelope(stored):
            return Decoded(stored, JSON)
        envelope = open_envelope(stored)
        return Decoded(self.get(envelope.codec).decode(envelope.data), envelope.codec)


def codec_name(content_type: str) -> str:
    """The codec name a Content-Type stands for (no library needed), or UnknownCodec."""
    media, params = parse_content_type(content_type)
    if media == "application/json" or media.endswith("+json"):
        return JSON
    if media in MSGPACK_TYPES:
        return MsgpackCodec.name
    if media in protobuf_codec.MEDIA_TYPES and (params.get("messagetype") or params.get("proto")):
        return f"{protobuf_codec.FAMILY}:{params.get('messagetype') or params['proto']}"
    if media in avro_codec.MEDIA_TYPES and params.get("type"):
        return f"{avro_codec.FAMILY}:{params['type']}"
    raise UnknownCodec(
        f"no codec for content type {content_type!r}",
        hint="Known: application/json, application/msgpack, "
        "application/x-protobuf; messageType=<type>, application/avro; type=<schema full name>.",
    )


# -- bodies passed through unread (bridges) ----------------------------------------------------


def wire_body(stored: Any) -> tuple[bytes, str]:
    """(bytes, content type) to put on another broker for a stored body, without decoding it:
    an envelope gives its bytes as they are, a JSON body its compact JSON text."""
    if is_envelope(stored):
        envelope = open_envelope(stored)
        return envelope.data, envelope.content_type
    return dump_text(stored).encode(), JsonCodec.content_type


def stored_from_wire(data: bytes, content_type: str | None) -> Any:
    """What to store for bytes received from another broker, without decoding binary ones:
    JSON (or no content type) is parsed and stored as itself, anything else in an envelope."""
    name = JSON if content_type is None else codec_name(content_type)
    if name == JSON:
        return JsonCodec().decode(data)
    return Envelope(name, content_type or "", data).stored()
