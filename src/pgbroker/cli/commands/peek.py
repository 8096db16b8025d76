"""``pgbroker peek``: look at a queue's messages (waiting, delayed, in flight, or its dead letters)
without changing them: no lease, no read count, no lock (see sql/functions/77_peek.sql).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pgbroker.cli.support.arguments import msg_id, positive_int
from pgbroker.cli.support.errors import Exit
from pgbroker.cli.support.output import json_text, message_json, wants_json
from pgbroker.cli.support.parsers import Subcommands, add_command
from pgbroker.cli.support.tables import local_time, table
from pgbroker.queues._client import Broker
from pgbroker.queues._queries import PEEK_STATES
from pgbroker.queues._records import PeekedMessage

__all__ = ["register"]


def register(subcommands: Subcommands) -> None:
    summary = "look at messages without taking them (no lease, no read count)"
    sub = add_command(subcommands, "peek", summary, _peek)
    sub.add_argument("queue", metavar="QUEUE", help="queue name")
    sub.add_argument("--state", choices=PEEK_STATES, help="only these (default: all but dead)")
    sub.add_argument("--limit", type=positive_int, default=20, metavar="N", help="at most this many (20)")
    sub.add_argument("--after", type=msg_id, default=0, metavar="ID", help="msg_ids after this one (paging)")
    sub.add_argument("--before", type=msg_id, metavar="ID", help="msg_ids up to this one")
    sub.add_argument("--header", metavar="KEY[=VALUE]", help="with this header (and value)")
    sub.add_argument(
        "--field",
        type=_body_field,
        action="append",
        metavar="KEY=VALUE",
        help="whose JSON body has this field with this value (JSON, else text; repeatable)",
    )
    sub.add_argument("--since", type=_moment, metavar="TIME", help="enqueued at or after (ISO 8601)")
    sub.add_argument("--until", type=_moment, metavar="TIME", help="enqueued before (ISO 8601)")


def _moment(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a time such as 2025-01-31T12:00:00+00:00, got {text!r}"
        ) from None
    return moment if moment.tzinfo else moment.astimezone()  # a time without a zone is local


def _body_field(text: str) -> tuple[str, Any]:
    key, has_value, value = text.partition("=")
    if not key or not has_value:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, such as sku=A-001 or qty=3, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value  # text, as typed


def _peek(args: argparse.Namespace, broker: Broker) -> int:
    key, has_value, value = (args.header or "").partition("=")
    found = broker.queue(args.queue).peek(
        args.limit,
        after=args.after,
        state=args.state,
        before=args.before,
        header=key or None,
        header_value=value if has_value else None,
        enqueued_after=args.since,
        enqueued_before=args.until,
        contains=dict(args.field) if args.field else None,
    )
    if wants_json(args):
        for message in found:
            line = json.loads(message_json(message))
            print(json_text({**line, "state": message.state}))
    elif not found:
        print(f'no messages in queue "{args.queue}" that match')
    else:
        print(_peek_table(found))
        if len(found) == args.limit:
            print(f"(more may follow: --after {found[-1].msg_id})")
    return Exit.OK


def _peek_table(found: Sequence[PeekedMessage]) -> str:
    rows = [
        [
            str(m.msg_id),
            m.state,
            str(m.read_ct),
            local_time(m.enqueued_at),
            _cut(json_text(m.headers) if m.headers else "-", 40),
            _cut(json_text(m.message), 50),
        ]
        for m in found
    ]
    return table(["MSG_ID", "STATE", "READS", "ENQUEUED", "HEADERS", "MESSAGE"], rows, right_aligned=[0, 2])


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
