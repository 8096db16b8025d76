"""The client's arguments judged before any query: typed errors naming the argument, and values
in the form the SQL takes (JSON text, whole seconds, counts that fit SQL's integer, receipts)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeAlias

from pgbroker.errors import InvalidArgument, InvalidMessage
from pgbroker.queues._records import Message, Receipt

Delay: TypeAlias = int | timedelta | datetime
Receivable: TypeAlias = Receipt | Message | str


def encode_json(value: Any, what: str = "message") -> str:
    """JSON text for a payload or headers object, or InvalidMessage naming the problem."""
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(
            f"{what} is not JSON-serialisable: {exc}",
            hint="Send dicts, lists, strings, numbers, booleans or None (no NaN or Infinity).",
        ) from None
    except RecursionError:
        # The encoder meets the depth as it goes: nothing walks a message twice to measure it.
        raise InvalidMessage(
            f"{what} is nested too deeply to encode", hint="Flatten it: jsonb is no place for deep trees."
        ) from None


def headers_object(headers: Mapping[str, Any] | None) -> str | None:
    if headers is None:
        return None
    if not isinstance(headers, Mapping):
        raise InvalidMessage(f"headers must be a mapping, got {type(headers).__name__}")
    return encode_json(dict(headers), "headers")


def json_array(texts: Sequence[str | None] | None) -> str | None:
    """JSON texts (None: JSON null) as one JSON array, the one parameter a batch of messages or
    of their headers travels in (pgbroker._jsonb_array, 30_sends.sql, makes the jsonb[] again):
    psycopg writes a list parameter element by element in Python, 6 us a message of a batch of
    500, and a string at once."""
    if texts is None:
        return None
    return "[" + ",".join("null" if t is None else t for t in texts) + "]"


def mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{what} must be a mapping, got {type(value).__name__} {value!r}")
    return value


def flag(value: Any, what: str) -> bool:
    """``value`` if it is True or False, else InvalidArgument naming ``what`` (1 and "no" are
    not flags: a truthy string would turn a setting on by accident)."""
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be True or False, got {value!r}")
    return value


def batch(values: Any, what: str) -> list[Any]:
    """The items of an iterable argument as a list, refusing a lone string, bytes or mapping
    (iterable, but surely meant as one item) and anything not iterable."""
    if isinstance(values, str | bytes | bytearray | Mapping) or not isinstance(values, Iterable):
        raise InvalidArgument(
            f"{what} must be a list (or another iterable) of items, got {type(values).__name__}",
            hint="Pass [item] for one item; the single-item methods take one directly.",
        )
    return list(values)


def duration(value: int | float | timedelta, what: str) -> float:
    """Seconds >= 0 from a number or timedelta, or InvalidArgument naming ``what``."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        raise InvalidArgument(f"{what} must be a number of seconds, got {value!r}")
    if seconds < 0:
        raise InvalidArgument(f"{what} must be >= 0 seconds, got {value!r}")
    return float(seconds)


INTEGER_MAX = 2**31 - 1  # SQL integer: vt, qty, delay
BIGINT_MAX = 2**63 - 1  # SQL bigint: msg_id


def whole_seconds(value: int | float | timedelta, what: str) -> int:
    """Whole seconds >= 0 that fit SQL's integer, rounding fractions up so a wait is never shorter."""
    seconds = math.ceil(duration(value, what))
    if seconds > INTEGER_MAX:
        raise InvalidArgument(f"{what} must be at most {INTEGER_MAX} seconds, got {value!r}")
    return seconds


def count(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INTEGER_MAX:
        raise InvalidArgument(f"{what} must be an integer from 0 to {INTEGER_MAX}, got {value!r}")
    return value


def receipt_of(item: Receivable) -> Receipt:
    """The receipt carried by a message, or the receipt itself (object or text form)."""
    if isinstance(item, Receipt):
        return item
    if isinstance(item, Message):
        if item.receipt is None:
            raise InvalidArgument(
                f"message {item.msg_id} carries no receipt (it was popped or set with set_vt)",
                hint="Only messages read through pgbroker can be acked, nacked or extended.",
            )
        return item.receipt
    if isinstance(item, str):
        return Receipt.parse(item)
    raise InvalidArgument(f"expected a Receipt, Message or receipt text, got {type(item).__name__}")


def receipt_texts(items: Iterable[Receivable]) -> str:
    """The items' receipts for a batch operation, as one text, comma-separated (a receipt holds
    none), which the statements split with string_to_array: psycopg dumps a list element by
    element in Python, 90 us for 64 receipts, and a string at once."""
    return ",".join(str(receipt_of(item)) for item in batch(items, "items"))
