"""How a binary body is stored in pgmq's ``message`` column (jsonb): the documented envelope

    {"$pgbroker": {"codec": "avro:shop.Order", "content_type": "application/avro; type=shop.Order",
                   "data": "<the body's bytes, base64>"}}

An object whose only key is "$pgbroker" is always read as an envelope: that key is reserved.
Any pgmq client still reads valid JSON (and can take the bytes out of ``data``); see docs/codecs.md
for why an envelope and not a column beside ``message``. A JSON body is never wrapped.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from pgbroker.codecs.errors import CorruptBody

KEY = "$pgbroker"


@dataclass(frozen=True, slots=True)
class Envelope:
    codec: str
    content_type: str
    data: bytes

    def stored(self) -> dict[str, Any]:
        """The JSON value to store in ``message``."""
        text = base64.b64encode(self.data).decode("ascii")
        return {KEY: {"codec": self.codec, "content_type": self.content_type, "data": text}}


def is_envelope(value: Any) -> bool:
    """Whether a stored JSON value is an envelope: an object whose only key is "$pgbroker"."""
    return isinstance(value, dict) and len(value) == 1 and KEY in value


def envelope_codec(value: Any) -> str:
    """The codec an envelope names, even a damaged one ("unknown" when it names none)."""
    inner = value.get(KEY) if isinstance(value, dict) else None
    codec = inner.get("codec") if isinstance(inner, dict) else None
    return codec if isinstance(codec, str) else "unknown"


def open_envelope(value: Any) -> Envelope:
    """The envelope in a stored value (is_envelope(value) must hold), or CorruptBody."""
    inner = value[KEY]
    fields = inner if isinstance(inner, dict) else {}
    codec, content_type, data = (fields.get(k) for k in ("codec", "content_type", "data"))
    if not (isinstance(codec, str) and isinstance(content_type, str) and isinstance(data, str)):
        raise CorruptBody(
            'damaged envelope: "$pgbroker" must hold the strings codec, content_type and data',
            hint="Something other than pgbroker wrote this message; see docs/codecs.md for the format.",
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CorruptBody(f"damaged envelope: data is not base64 ({exc})") from None
    return Envelope(codec, content_type, raw)
