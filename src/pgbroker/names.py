"""The one check of queue and stream names on the Python side, the same rule as the engine's
(``pgbroker._check_name`` in sql/schema/10_queues.sql): the client, the CLI (through the client)
and the HTTP API refuse a bad name before any query, with the error the engine would raise.

A queue name is 1 to 47 characters and 47 bytes of UTF-8 (its tables are q_<name> and a_<name>,
and identifiers stop at 63 bytes), without pgmq's forbidden ``$``, ``;``, ``--`` and ``'``, and
without whitespace or control characters, which break the statements written from it and hide
in logs. A stream name gets the same character rule here; its stricter spelling is the engine's.
"""

from __future__ import annotations

import re

from pgbroker.errors import InvalidArgument, InvalidQueueName

__all__ = ["QUEUE_NAME_MAX", "UNPRINTABLE", "check_queue_name", "check_stream_name"]

QUEUE_NAME_MAX = 47

#: Every character that is whitespace (str.isspace) or a control (Unicode category Cc), spelled
#: as a class that a Postgres regular expression reads the same way, whatever the locale.
UNPRINTABLE = "[\\x00-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
_UNPRINTABLE = re.compile(UNPRINTABLE)
_PGMQ_FORBIDDEN = re.compile(r"\$|;|--|'")
_HINT = "Use letters, digits, _ and - only."


def check_queue_name(name: object, what: str = "queue name") -> str:
    """``name`` if it can name a queue; else InvalidQueueName (InvalidArgument when not a string)."""
    text = _text(name, what)
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
    return text


def check_stream_name(name: object) -> str:
    """``name`` unless it is empty or holds whitespace or a control character."""
    return _text(name, "stream name")


def _text(name: object, what: str) -> str:
    """The name as a non-empty string of printable characters."""
    if not isinstance(name, str):
        raise InvalidArgument(f"{what} must be a string, got {type(name).__name__} {name!r}")
    if not name:
        raise InvalidQueueName(f"{what} must not be empty", hint="Name it, for example 'orders'.")
    bad = _UNPRINTABLE.search(name)
    if bad is not None:
        raise InvalidQueueName(
            f"{what} contains whitespace or a control character ({bad[0]!r} at {bad.start()}): {name!r}",
            hint=_HINT,
        )
    return name
