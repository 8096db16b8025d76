"""``pgbroker dlq list|show|replay|purge``: the dead letters of a queue, the messages that failed
their last allowed delivery (see ``pgbroker policy``), with the error of each failed attempt in
their headers. A letter's id is the msg_id it had in the queue: the one the worker logged.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from pgbroker.cli.support.arguments import msg_id, positive_int
from pgbroker.cli.support.confirming import add_yes_option, confirmed
from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.output import json_text, message_json, plural, print_result, shown, wants_json
from pgbroker.cli.support.parsers import Subcommands, add_command, add_group
from pgbroker.cli.support.tables import table
from pgbroker.codecs.json_view import json_view
from pgbroker.queues._client import Broker
from pgbroker.queues._records import Message

__all__ = ["register"]

DEAD_LETTER = "x-pgbroker-dead-letter"
ATTEMPTS = "x-pgbroker-attempts"


def register(subcommands: Subcommands) -> None:
    actions = add_group(subcommands, "dlq", "a queue's dead letters")
    sub = add_command(actions, "list", "list dead letters, oldest first", _list)
    sub.add_argument("queue", metavar="QUEUE", help="the queue they came from")
    sub.add_argument("--limit", type=positive_int, default=100, metavar="N", help="at most this many (100)")
    sub = add_command(
        actions, "show", "show a dead letter with every failed attempt", _show, json_output=True
    )
    sub.add_argument("queue", metavar="QUEUE", help="the queue it came from")
    sub.add_argument("msg_id", type=msg_id, metavar="MSG_ID", help="its msg_id in that queue (as logged)")
    sub = add_command(actions, "replay", "send dead letters back to their queue", _replay)
    _add_queue_and_msg_ids(sub)
    sub = add_command(actions, "purge", "delete dead letters", _purge)
    _add_queue_and_msg_ids(sub)
    add_yes_option(sub, "purging")


def _add_queue_and_msg_ids(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("queue", metavar="QUEUE", help="the queue they came from")
    sub.add_argument("msg_ids", nargs="*", type=msg_id, metavar="MSG_ID", help="these only (default: all)")


def _list(args: argparse.Namespace, broker: Broker) -> int:
    letters = broker.queue(args.queue).dead_letters(args.limit)
    if wants_json(args):
        for letter in letters:
            print(message_json(letter))
    elif not letters:
        print(f'no dead letters from queue "{args.queue}"')
    else:
        print(_letter_table(letters))
    return Exit.OK


def _letter_table(letters: Sequence[Message]) -> str:
    rows = [_letter_row(letter) for letter in letters]
    return table(["MSG_ID", "DELIVERIES", "DEAD-LETTERED", "ERROR", "MESSAGE"], rows, right_aligned=[0, 1])


def _letter_row(letter: Message) -> list[str]:
    why: dict[str, Any] = (letter.headers or {}).get(DEAD_LETTER, {})
    error = str(why.get("error") or "-")
    payload = json_text(json_view(letter.message))
    when = _when(why.get("dead_lettered_at"))
    return [str(letter.msg_id), str(why.get("deliveries", "-")), when, _cut(error, 60), _cut(payload, 40)]


def _show(args: argparse.Namespace, broker: Broker) -> int:
    letter = broker.queue(args.queue).dead_letter(args.msg_id)
    if letter is None:
        raise CliError(
            f'no dead letter {args.msg_id} from queue "{args.queue}"',
            code=Exit.NOTHING_DONE,
            hint=f"See them with: pgbroker dlq list {args.queue}",
        )
    if args.json:
        print(message_json(letter))
    else:
        print(_letter_text(args.queue, letter))
    return Exit.OK


def _letter_text(queue: str, letter: Message) -> str:
    headers = dict(letter.headers or {})
    why: dict[str, Any] = headers.pop(DEAD_LETTER, {})
    attempts: list[dict[str, Any]] = headers.pop(ATTEMPTS, [])
    lines = [
        f'dead letter {letter.msg_id} of queue "{queue}"',
        f"  deliveries:     {why.get('deliveries', '-')}",
        f"  enqueued:       {_when(why.get('enqueued_at'))}",
        f"  dead-lettered:  {_when(why.get('dead_lettered_at'))}",
        f"  last error:     {why.get('error') or '-'}",
        f"  headers:        {json_text(headers) if headers else '-'}",
        f"  message:        {json_text(json_view(letter.message))}",
    ]
    if not attempts:
        lines.append("no failed attempt recorded (its deliveries ended without a failure report)")
    for attempt in attempts:
        when = _when(attempt.get("failed_at"))
        lines.append(f"attempt {attempt.get('delivery')} at {when}: {attempt.get('error')}")
        lines.extend("    " + line for line in str(attempt.get("traceback") or "").splitlines())
    return "\n".join(shown(line) for line in lines)


def _when(timestamp: object) -> str:
    return str(timestamp or "-")[:19].replace("T", " ")


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _replay(args: argparse.Namespace, broker: Broker) -> int:
    replayed = broker.queue(args.queue).replay_dead_letters(args.msg_ids or None)
    _report_missing(args, set(replayed))
    if not replayed:
        # Nothing to do, as a purge with nothing to purge: said, exit 0.
        text = f'no dead letters from queue "{args.queue}"; nothing to replay'
        return print_result(args, {"queue": args.queue, "replayed": 0}, text)
    text = f'replayed {plural(len(replayed), "dead letter")} to queue "{args.queue}" as new messages'
    return print_result(args, {"queue": args.queue, "replayed": len(replayed)}, text)


def _purge(args: argparse.Namespace, broker: Broker) -> int:
    queue = broker.queue(args.queue)
    # Nothing to delete, nothing to confirm: said first (a missing queue too), without --yes.
    if args.msg_ids and not any(queue.dead_letter(letter_id) for letter_id in set(args.msg_ids)):
        _report_missing(args, set())
    if not args.msg_ids and not queue.dead_letters(1):
        text = f'no dead letters from queue "{args.queue}"; nothing to purge'
        return print_result(args, {"queue": args.queue, "purged": 0}, text)
    confirmed(
        args,
        f'purge deletes dead letters from queue "{args.queue}"',
        hint=f"Look first (pgbroker dlq list {args.queue}), then confirm with --yes.",
    )
    purged = queue.purge_dead_letters(args.msg_ids or None)
    if args.msg_ids and purged < len(set(args.msg_ids)):
        # Which ones were missing is no longer knowable after the delete; say how many.
        raise CliError(
            f"purged {plural(purged, 'dead letter')}; {len(set(args.msg_ids)) - purged} of the msg_ids given "
            f'are not dead letters from queue "{args.queue}"',
            code=Exit.NOTHING_DONE,
        )
    text = f'purged {plural(purged, "dead letter")} from queue "{args.queue}"'
    return print_result(args, {"queue": args.queue, "purged": purged}, text)


def _report_missing(args: argparse.Namespace, done: set[int]) -> None:
    missing = [str(letter_id) for letter_id in dict.fromkeys(args.msg_ids) if letter_id not in done]
    if missing:
        raise CliError(
            f'no dead letter {", ".join(missing)} from queue "{args.queue}"'
            + (f" ({plural(len(done), 'other')} replayed)" if done else ""),
            code=Exit.NOTHING_DONE,
            hint=f"See them with: pgbroker dlq list {args.queue}",
        )
