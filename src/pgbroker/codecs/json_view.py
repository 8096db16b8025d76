"""Decoded bodies shown as JSON (the CLI's JSON lines, the HTTP API): what JSON cannot hold is
written in its usual JSON form: bytes as base64 text, a Protobuf message as its fields, times in
ISO 8601, decimals and UUIDs as text."""

from __future__ import annotations

import base64
import datetime
import decimal
import uuid
from typing import Any

from pgbroker.codecs.protobuf_codec import to_python


def json_view(value: Any) -> Any:
    """``value`` with every part JSON cannot hold replaced by its JSON form (a copy; JSON as is)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): json_view(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_view(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if hasattr(value, "DESCRIPTOR") and hasattr(value, "SerializeToString"):
        return json_view(to_python(value))
    return str(value)
