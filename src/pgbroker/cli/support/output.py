"""What the commands print: listings as a table or JSON, messages as JSON lines, and any other
result as text for people or, with --json, as JSON alone on stdout (notices go to stderr then)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, TextIO, TypeVar

from pgbroker.cli.support.errors import Exit
from pgbroker.codecs.json_view import json_view
from pgbroker.queues._records import Message

T = TypeVar("T")

NO_QUEUES = "no queues (create one with: pgbroker create NAME)"

# What a terminal would act on instead of showing: the C0 and C1 controls and DEL (escape sequences
# move the cursor, clear the screen, retitle the window, write the clipboard) and the bidirectional
# overrides (text shown in another order than it is). Text from the database is anyone's: a
# producer's message, a consumer's error report or name.
_UNSHOWABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# Those the JSON encoder leaves alone: it escapes C0 in strings itself, and the newlines of an
# indented document (between tokens) must stay newlines.
_UNSHOWABLE_IN_JSON = re.compile(r"[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def print_listing(
    args: argparse.Namespace,
    items: Sequence[T],
    as_json: Callable[[T], Any],
    as_table: Callable[[Sequence[T]], str],
    *,
    empty: str = NO_QUEUES,
) -> int:
    """Print ``items`` as a JSON array (--json), else a table, else ``empty`` when there are none."""
    if wants_json(args):
        print(json.dumps([as_json(item) for item in items], default=str, indent=2))
    elif not items:
        print(empty)
    else:
        print(as_table(items))
    return Exit.OK


def wants_json(args: argparse.Namespace) -> bool:
    """Whether --json was given (absent from a parser that a command module was registered on
    alone, as its tests do)."""
    return bool(getattr(args, "json", False))


def print_result(args: argparse.Namespace, record: Mapping[str, Any], text: str) -> int:
    """A command's result: ``record`` as one JSON object (--json), else ``text`` for people."""
    print(to_json(record) if wants_json(args) else text)
    return Exit.OK


def print_each(
    args: argparse.Namespace, records: Iterable[Mapping[str, Any]], text: Callable[[Mapping[str, Any]], str]
) -> None:
    """Results of one kind, one a line (the msg_ids a send made, the receipts an extend renewed):
    each record as a JSON line (--json), else its ``text``; flushed, so that a reader of a long
    run sees its progress."""
    lines = [to_json(record) if wants_json(args) else text(record) for record in records]
    if lines:
        print("\n".join(lines), flush=True)


def notices_to(args: argparse.Namespace) -> TextIO:
    """Where a command's remarks beside its result go: stderr under --json, so that stdout holds
    the JSON alone."""
    return sys.stderr if wants_json(args) else sys.stdout


def shown(text: str) -> str:
    """Text from the database as a terminal should show it: each control character written as its
    escape (``\\x1b``, ``\\n``), so that no value can drive the terminal or fake other output."""
    return _UNSHOWABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def json_text(value: Any, **options: Any) -> str:
    """``value`` as JSON, letters beyond ASCII as themselves, but no control character: the JSON
    encoder escapes the C0 ones, and the others are written as JSON's \\u escapes, the same JSON."""
    text = json.dumps(value, ensure_ascii=False, **options)
    return _UNSHOWABLE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def to_json(record: Mapping[str, Any]) -> str:
    """One JSON line; timestamps in ISO 8601."""
    return json_text(record, default=_iso_or_text)


def _iso_or_text(value: object) -> str:
    isoformat = getattr(value, "isoformat", None)
    return str(isoformat()) if callable(isoformat) else str(value)


def timestamped_json(record: Any, field: str) -> dict[str, Any]:
    """A dataclass record as a JSON object, its datetime ``field`` in ISO 8601."""
    return {**asdict(record), field: getattr(record, field).isoformat()}


def message_json(message: Message) -> str:
    """One message as a JSON line; ``receipt`` is what `pgbroker ack` needs (null when popped)."""
    return json_text(
        {
            "msg_id": message.msg_id,
            "read_ct": message.read_ct,
            "enqueued_at": message.enqueued_at.isoformat(),
            "last_read_at": message.last_read_at.isoformat() if message.last_read_at else None,
            "vt": message.vt.isoformat(),
            "message": json_view(message.message),  # a binary codec's value in its JSON form
            "headers": message.headers,
            "receipt": str(message.receipt) if message.receipt else None,
        }
    )


def plural(n: int, noun: str) -> str:
    """``1 message``, ``2 messages``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
