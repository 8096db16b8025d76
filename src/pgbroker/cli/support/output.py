"""What the commands print: listings as a table or JSON, messages as JSON lines."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, TypeVar

from pgbroker.cli.support.errors import Exit
from pgbroker.codecs.json_view import json_view
from pgbroker.queues._records import Message

T = TypeVar("T")

NO_QUEUES = "no queues (create one with: pgbroker create NAME)"


def print_listing(
    args: argparse.Namespace,
    items: Sequence[T],
    as_json: Callable[[T], Any],
    as_table: Callable[[Sequence[T]], str],
    *,
    empty: str = NO_QUEUES,
) -> int:
    """Print ``items`` as a JSON array (--json), else a table, else ``empty`` when there are none."""
    if args.json:
        print(json.dumps([as_json(item) for item in items], default=str, indent=2))
    elif not items:
        print(empty)
    else:
        print(as_table(items))
    return Exit.OK


def timestamped_json(record: Any, field: str) -> dict[str, Any]:
    """A dataclass record as a JSON object, its datetime ``field`` in ISO 8601."""
    return {**asdict(record), field: getattr(record, field).isoformat()}


def message_json(message: Message) -> str:
    """One message as a JSON line; ``receipt`` is what `pgbroker ack` needs (null when popped)."""
    return json.dumps(
        {
            "msg_id": message.msg_id,
            "read_ct": message.read_ct,
            "enqueued_at": message.enqueued_at.isoformat(),
            "last_read_at": message.last_read_at.isoformat() if message.last_read_at else None,
            "vt": message.vt.isoformat(),
            "message": json_view(message.message),  # a binary codec's value in its JSON form
            "headers": message.headers,
            "receipt": str(message.receipt) if message.receipt else None,
        },
        ensure_ascii=False,
    )


def plural(n: int, noun: str) -> str:
    """``1 message``, ``2 messages``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"

