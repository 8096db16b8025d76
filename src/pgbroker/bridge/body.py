"""The message body on the wire, for every connector: a pgbroker message as bytes with a content
type (outbound), and bytes with a content type as what to store (inbound).

This is the one place where payload formats plug in, through pgbroker.codecs. Out, a JSON body
goes as its compact JSON text, application/json; a body stored in a codec's envelope
(MessagePack, Protobuf, Avro) goes as its binary bytes with the codec's content type, passed
through undecoded (no schema or class needed). In, a content type that names a binary codec
stores the bytes in that codec's envelope, so a round trip pgbroker -> broker -> pgbroker keeps
the bytes and the codec; JSON, no content type or one no codec knows is stored as before (JSON as
it is, other text as a JSON string, anything else base64). The connectors carry body and content
type as they are, each in its broker's natural place.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

from pgbroker import codecs
from pgbroker.codecs import CorruptBody, UnknownCodec

JSON = "application/json"

log = logging.getLogger("pgbroker.bridge.body")

# How an inbound body was stored: as the JSON it was, in a codec's envelope, as a JSON string,
# or base64 text. The last two are marked in a header (<prefix>body), the first two say it
# themselves.
BodyKind = Literal["json", "codec", "text", "base64"]
SELF_DESCRIBED: tuple[BodyKind, ...] = ("json", "codec")


@dataclass(frozen=True, slots=True)
class Body:
    data: bytes
    content_type: str


def encode(stored: Any) -> Body:
    """The body to publish for a message body as stored (a queue message read with
    decode=False, a stream message): its codec's bytes and content type."""
    try:
        data, content_type = codecs.wire_body(stored)
    except CorruptBody as exc:
        # A damaged envelope (written by something else) cannot be opened: it goes as the JSON
        # it is, so it is neither lost nor retried forever, and comes back in as the same JSON.
        log.warning("bridge.body.damaged_envelope: %s; sent as JSON", exc)
        return Body(json.dumps(stored, separators=(",", ":")).encode(), JSON)
    return Body(data, content_type)


def decode(data: bytes, content_type: str | None) -> tuple[Any, BodyKind]:
    """What to store for a received body: a binary codec's envelope when the content type names
    one, else JSON as it is, other UTF-8 text a JSON string, anything else base64 text (jsonb
    cannot hold NUL, not even in a string, so such text goes as base64 too)."""
    if content_type and _binary_codec(content_type):
        return codecs.stored_from_wire(data, content_type), "codec"
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return base64.b64encode(data).decode(), "base64"
    if "\x00" in text:
        return base64.b64encode(data).decode(), "base64"
    if "\\u0000" in text:  # valid JSON, but a NUL inside a string cannot be stored in jsonb
        return text, "text"
    try:
        return json.loads(text), "json"
    except ValueError:
        return text, "text"


def _binary_codec(content_type: str) -> bool:
    """Whether a content type names a codec other than JSON (an unknown one is not an error:
    its body is stored as text or base64, as any other opaque body)."""
    try:
        return codecs.codec_name(content_type) != "json"
    except UnknownCodec:
        return False
