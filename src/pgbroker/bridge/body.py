"""The message body on the wire, for every connector: a pgbroker message as bytes with a content
type (outbound), and bytes as a payload (inbound).

This is the one place where payload formats plug in. Today every body is the message's JSON text,
application/json; a codec (MessagePack, Protobuf, Avro) will be chosen here by the message's
content type, and the connectors, which carry body and content type as they are, need no change.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Literal

from pgbroker.models import Message

JSON = "application/json"

# How an inbound body was stored: as the JSON it was, as a JSON string, or base64 text.
BodyKind = Literal["json", "text", "base64"]


@dataclass(frozen=True, slots=True)
class Body:
    data: bytes
    content_type: str


def encode(message: Message) -> Body:
    """The body to publish for a message."""
    return Body(json.dumps(message.message, separators=(",", ":")).encode(), JSON)


def decode(data: bytes, content_type: str | None) -> tuple[Any, BodyKind]:
    """A received body as a payload: JSON as it is, other UTF-8 text a JSON string, anything else
    base64 text (jsonb cannot hold NUL, not even in a string, so such text goes as base64 too).
    ``content_type`` is not needed while every format is JSON or opaque; codecs will use it."""
    del content_type
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
