"""The one check of queue and stream names on the Python side, the same rule as the engine's
(``pgbroker._check_name`` in _sql/functions/10_queues.sql): the client, the CLI (through the client)
and the HTTP API refuse a bad name before any query, with the error the engine would raise.

A queue name is 1 to 47 characters and 47 bytes of UTF-8 (its tables are q_<name> and a_<name>,
and identifiers stop at 63 bytes), without pgmq's forbidden ``$``, ``;``, ``--`` and ``'``, and
without whitespace or control characters, which break the statements written from it and hide
in logs. A stream name gets the same character rule here; its stricter spelling is the engine's.
"""

from __future__ import annotations

import re
import reprlib

from pgbroker.errors import InvalidArgument, InvalidQueueName

__all__ = [
    "QUEUE_NAME_MAX",
    "UNPRINTABLE",
    "check_dropped_queue_name",
    "check_queue_name",
    "check_stream_name",
    "require_text",
]

QUEUE_NAME_MAX = 47

#: Every character that is whitespace (str.isspace), a control (Unicode category Cc) or an
#: invisible space (zero-width space, byte-order mark), spelled as a class that a Postgres regular
#: expression reads the same way whatever the locale: pgbroker._check_name_characters
#: (_sql/functions/10_queues.sql) holds the same text, and tests/db/test_names.py
#: keeps the two equal.
UNPRINTABLE = "[\\x00-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200b\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff]"
_UNPRINTABLE = re.compile(UNPRINTABLE)
_PGMQ_FORBIDDEN = re.compile(r"\$|;|--|'")
_HINT = "Use letters, digits, _ and - only."


def check_queue_name(name: object) -> str:
    """``name`` if it can name a queue; else InvalidQueueName (InvalidArgument when not a string).
    The checks run in the engine's order, so that both name the same fault first."""
    text = _nonempty(name, "queue name")
    if len(text) > QUEUE_NAME_MAX:
        raise InvalidQueueName(
            f"queue name is too long, maximum length is {QUEUE_NAME_MAX} characters"
            f" (got {len(text)} characters)",
            hint="Table names are q_<name> and a_<name>, and identifiers stop at 63 bytes.",
        )
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > QUEUE_NAME_MAX:
        raise InvalidQueueName(
            f"queue name is too long: {size} bytes in UTF-8, the maximum is {QUEUE_NAME_MAX} bytes",
            hint="Use a shorter name; letters outside ASCII take two to four bytes each.",
        )
    if _PGMQ_FORBIDDEN.search(text):
        raise InvalidQueueName(
            f"queue name contains invalid characters: $, ;, --, or ' (got {text!r})", hint=_HINT
        )
    return _printable(text, "queue name")


def check_stream_name(name: object) -> str:
    """``name`` unless it is empty or holds whitespace or a control character."""
    return _printable(_nonempty(name, "stream name"), "stream name")


def check_dropped_queue_name(name: object) -> str:
    """``name`` if a drop may look it up: pgmq's drop judges only pgmq's characters (the engine
    does), so a queue made under an older, looser rule can still be dropped, and any other name
    is simply not there. A NUL, which libpq cannot send, is refused here."""
    text = require_text(name, "queue name")
    if "\x00" in text:
        raise InvalidQueueName(f"queue name contains a NUL character: {text!r}", hint=_HINT)
    return text


def require_text(name: object, what: str) -> str:
    """``name`` if it is a string, else InvalidArgument naming ``what``."""
    if not isinstance(name, str):
        raise InvalidArgument(f"{what} must be a string, got {type(name).__name__} {reprlib.repr(name)}")
    return name


def _nonempty(name: object, what: str) -> str:
    text = require_text(name, what)
    if not text:
        raise InvalidQueueName(f"{what} must not be empty", hint="Name it, for example 'orders'.")
    return text


def _printable(name: str, what: str) -> str:
    bad = _UNPRINTABLE.search(name)
    if bad is not None:
        raise InvalidQueueName(
            f"{what} contains whitespace or a control character ({bad[0]!r} at {bad.start()}): {name!r}",
            hint=_HINT,
        )
    return name
