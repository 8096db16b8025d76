"""JSON, the default codec: a JSON body is stored as itself in ``message``, as pgmq stores it."""

from __future__ import annotations

import json
from typing import Any

from pgbroker.codecs.base import Codec
from pgbroker.codecs.errors import CorruptBody, EncodeError


class JsonCodec(Codec):
    name = "json"
    content_type = "application/json"

    def encode(self, value: Any) -> bytes:
        return dump_text(value).encode()

    def decode(self, data: bytes) -> Any:
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptBody(
                f"body is not JSON: {exc}", hint="Send it with its real content type."
            ) from None


def dump_text(value: Any, what: str = "message") -> str:
    """Compact JSON text of a value (no NaN or Infinity).

    An object whose only key is "$pgbroker" goes through unchanged: it is read back as an
    envelope, which is how a stored binary body is forwarded as it is (docs/codecs.md).
    """
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise EncodeError(
            f"{what} is not JSON-serialisable: {exc}",
            hint="Send dicts, lists, strings, numbers, booleans or None (no NaN or Infinity), "
            "or choose a binary codec (codec='msgpack', ...).",
        ) from None
    except RecursionError:
        raise EncodeError(f"{what} is nested too deeply to encode", hint="Flatten it.") from None
