"""``pgbroker send``, ``read``, ``pop``, ``ack``, ``archive``, ``delete`` and ``purge``: messages
from a shell. Reads print JSON lines with the receipt that ``ack`` takes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from pgbroker.cli.support.arguments import (
    msg_id,
    positive_int,
    positive_whole_seconds,
    seconds,
    whole_seconds,
)
from pgbroker.cli.support.codec_modules import add_codec_module_option, load_codec_modules
from pgbroker.cli.support.confirming import add_yes_option, confirmed
from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.json_input import json_argument, json_problem, loads
from pgbroker.cli.support.output import message_json, plural, print_each, print_result
from pgbroker.cli.support.parsers import Subcommands, add_command
from pgbroker.cli.support.running import print_error
from pgbroker.cli.support.stdin_lines import lines_as_they_come
from pgbroker.errors import PgbrokerError, StaleReceipt
from pgbroker.queues._client import Broker, Queue
from pgbroker.queues._job_headers import with_job_headers
from pgbroker.queues._records import Receipt

__all__ = ["register", "send_lines"]


def register(subcommands: Subcommands) -> None:
    sub = add_command(subcommands, "send", "send a JSON message, or JSON lines from stdin", _send)
    sub.add_argument("name", metavar="QUEUE", help="queue name")
    sub.add_argument(
        "message",
        nargs="?",
        metavar="MESSAGE",
        help="the message as JSON; without it, one message per stdin line",
    )
    sub.add_argument("--headers", metavar="JSON", help="headers for every message sent, a JSON object")
    sub.add_argument(
        "--delay",
        type=whole_seconds,
        metavar="DURATION",
        help="invisible for this long, such as 90, 1.5, 30s, 5m or 2h (whole seconds: a fraction, "
        "500ms say, is rounded up)",
    )
    sub.add_argument("--priority", type=int, metavar="N", help="higher is read first (0)")
    sub.add_argument("--dedup-key", metavar="KEY", help="not stored again while the key is taken")
    sub.add_argument("--concurrency-key", metavar="KEY", help="the key max_in_flight_per_key counts by")
    sub.add_argument(
        "--codec",
        metavar="NAME",
        help="encode with json, msgpack, protobuf:TYPE or avro:NAME (the message is its JSON form); "
        "default: the queue's policy",
    )
    add_codec_module_option(sub)
    sub.add_argument(
        "--batch-size", type=positive_int, default=500, metavar="N", help="stdin lines per statement (500)"
    )

    sub = add_command(subcommands, "read", "lease messages; prints JSON lines with receipts", _read)
    sub.add_argument("name", metavar="QUEUE", help="queue name")
    sub.add_argument("--vt", type=whole_seconds, default=30, metavar="DURATION", help="lease length (30)")
    sub.add_argument("--qty", type=positive_int, default=1, metavar="N", help="at most this many (1)")
    sub.add_argument("--wait", type=seconds, default=0.0, metavar="DURATION", help="wait for messages (0)")

    sub = add_command(subcommands, "pop", "read and delete messages at once (at most once)", _pop)
    sub.add_argument("name", metavar="QUEUE", help="queue name")
    sub.add_argument("--qty", type=positive_int, default=1, metavar="N", help="at most this many (1)")

    sub = add_command(subcommands, "ack", "acknowledge read messages by receipt (archives them)", _ack)
    sub.add_argument("name", metavar="QUEUE", help="queue name")
    sub.add_argument("receipts", nargs="+", metavar="RECEIPT", help="receipts as printed by read")
    sub.add_argument("--delete", action="store_true", help="delete instead of archiving")

    sub = add_command(subcommands, "nack", "give read messages back by receipt (visible again)", _nack)
    sub.add_argument("name", metavar="QUEUE", help="queue name")
    sub.add_argument("receipts", nargs="+", metavar="RECEIPT", help="receipts as printed by read")
    sub.add_argument("--delay", type=whole_seconds, default=0, metavar="DURATION", help="visible after (0)")

    sub = add_command(
        subcommands, "extend", "lengthen the leases of read messages; prints the new receipts", _extend
    )
    sub.add_argument("name", metavar="QUEUE", help="queue name")
    sub.add_argument("receipts", nargs="+", metavar="RECEIPT", help="receipts as printed by read")
    sub.add_argument(
        "--vt",
        type=positive_whole_seconds,
        required=True,
        metavar="DURATION",
        help="the lease ends this long from now",
    )

    sub = add_command(subcommands, "archive", "move messages to the archive by msg_id (unfenced)", _archive)
    sub.add_argument("name", metavar="QUEUE", help="queue name")
    sub.add_argument("msg_ids", nargs="+", type=msg_id, metavar="MSG_ID")

    sub = add_command(subcommands, "delete", "delete messages by msg_id (unfenced)", _delete)
    sub.add_argument("name", metavar="QUEUE", help="queue name")
    sub.add_argument("msg_ids", nargs="+", type=msg_id, metavar="MSG_ID")

    sub = add_command(subcommands, "purge", "delete every message of a queue (not its archive)", _purge)
    sub.add_argument("name", metavar="QUEUE", help="queue name")
    add_yes_option(sub, "purge")


def _send(args: argparse.Namespace, broker: Broker) -> int:
    load_codec_modules(args)
    queue = broker.queue(args.name)
    headers: dict[str, Any] | None = None
    if args.headers is not None:
        parsed = json_argument(args.headers, "--headers")
        if not isinstance(parsed, dict):
            raise CliError(
                '--headers must be a JSON object, for example \'{"source": "cli"}\'', code=Exit.USAGE
            )
        headers = parsed
    job = with_job_headers(
        headers, priority=args.priority, dedup_key=args.dedup_key, concurrency_key=args.concurrency_key
    )
    headers = None if job is None else dict(job)
    if args.message is not None:
        message = json_argument(args.message, "the message")
        sent = queue.send(message, headers=headers, delay=args.delay, codec=args.codec)
        return print_result(args, {"msg_id": sent}, str(sent))

    def send_batch(batch: list[Any]) -> int:
        ids = queue.send_many(
            batch,
            headers=None if headers is None else [headers] * len(batch),
            delay=args.delay,
            codec=args.codec,
        )
        # Printed per batch so a consumer of our output sees progress on a long stream.
        print_each(args, ({"msg_id": msg_id} for msg_id in ids), _msg_id_text)
        return len(ids)

    if sys.stdin.isatty():
        print("pgbroker: reading one JSON message per line; end with Ctrl-D", file=sys.stderr)
    sent = send_lines(sys.stdin, args.batch_size, send_batch)
    if sent == 0:
        raise CliError(
            "no messages on stdin; nothing sent",
            code=Exit.NOTHING_DONE,
            hint="Pass a message as an argument, or one JSON value per line on stdin.",
        )
    return Exit.OK


def send_lines(stream: TextIO, batch_size: int, send_batch: Callable[[list[Any]], int]) -> int:
    """Send the JSON lines of ``stream`` in batches; return how many were sent.

    A batch goes once it is full, or once the input pauses (cli.support.stdin_lines): the lines of
    a writer that pauses are sent as they come, not held until a batch fills. Each batch is parsed
    whole before it is sent, so a bad line stops the run with nothing of its batch sent and every
    earlier batch sent: the output (the msg_ids) says exactly how far it got.
    """
    sent = 0
    batch: list[Any] = []
    batch_start = 0
    line_no = 0
    for line in lines_as_they_come(stream):
        if line is not None:
            line_no += 1
            if not line.strip():
                continue
            if not batch:
                batch_start = line_no
            try:
                batch.append(loads(line))
            except ValueError as exc:
                raise CliError(
                    f"line {line_no} is not valid JSON ({json_problem(exc)}): nothing from line "
                    f"{batch_start} on was sent ({plural(sent, 'message')} before it were)",
                    code=Exit.USAGE,
                    hint='Give one JSON value per line, for example {"order": 1}.',
                ) from None
        if batch and (line is None or len(batch) == batch_size):
            sent += send_batch(batch)
            batch = []
    if batch:
        sent += send_batch(batch)
    return sent


def _msg_id_text(record: Mapping[str, Any]) -> str:
    return str(record["msg_id"])


def _read(args: argparse.Namespace, broker: Broker) -> int:
    queue = broker.queue(args.name)
    messages = queue.read_many(args.qty, vt=args.vt, wait=args.wait)
    for message in messages:
        print(message_json(message))
    if not messages:
        _say_if_paused(queue)
    return Exit.OK


def _pop(args: argparse.Namespace, broker: Broker) -> int:
    queue = broker.queue(args.name)
    messages = queue.pop_many(args.qty)
    for message in messages:
        print(message_json(message))
    if not messages:
        _say_if_paused(queue)
    return Exit.OK


def _say_if_paused(queue: Queue) -> None:
    """An empty read of a paused queue says why on stderr (still a success): the queue may hold
    messages, which pgbroker metrics counts as visible."""
    try:
        paused = queue.policy().paused
    except PgbrokerError:  # a role that may read but not see the policy: no remark
        return
    if paused:
        print(
            f'pgbroker: queue "{queue.name}" is paused: reads return nothing until: '
            f"pgbroker resume {queue.name}",
            file=sys.stderr,
        )


def _ack(args: argparse.Namespace, broker: Broker) -> int:
    queue = broker.queue(args.name)
    archive = not args.delete

    def ack_many(receipts: list[Receipt]) -> dict[int, Receipt | None]:
        return dict.fromkeys(queue.ack_many(receipts, archive=archive))

    def ack_one(receipt: Receipt) -> None:
        queue.ack(receipt, archive=archive)

    return _settle(args, ack_many, ack_one)


def _nack(args: argparse.Namespace, broker: Broker) -> int:
    queue = broker.queue(args.name)

    def nack_many(receipts: list[Receipt]) -> dict[int, Receipt | None]:
        return dict.fromkeys(queue.nack_many(receipts, delay=args.delay))

    def nack_one(receipt: Receipt) -> None:
        queue.nack(receipt, delay=args.delay)

    return _settle(args, nack_many, nack_one)


def _extend(args: argparse.Namespace, broker: Broker) -> int:
    queue = broker.queue(args.name)

    def extend_many(receipts: list[Receipt]) -> dict[int, Receipt | None]:
        return dict(queue.extend_many(receipts, vt=args.vt))

    return _settle(args, extend_many, lambda receipt: queue.extend(receipt, vt=args.vt))


def _settle(
    args: argparse.Namespace,
    many: Callable[[list[Receipt]], dict[int, Receipt | None]],
    one: Callable[[Receipt], Receipt | None],
) -> int:
    """Settle messages by receipt in one call (``many``), printing a line for each that held (its
    msg_id, or its new receipt when there is one); then each stale one alone (``one``), which says
    why it is stale."""
    receipts = [Receipt.parse(token) for token in args.receipts]
    done = many(receipts)
    stale: list[StaleReceipt] = []
    for receipt in receipts:
        if receipt.msg_id in done:
            continue
        try:
            done[receipt.msg_id] = one(receipt)
        except StaleReceipt as exc:
            stale.append(exc)
    settled = dict.fromkeys(r.msg_id for r in receipts if r.msg_id in done)
    records = [_settled(msg_id, done[msg_id]) for msg_id in settled]
    print_each(args, records, lambda record: str(record.get("receipt", record["msg_id"])))
    if not stale:
        return Exit.OK
    for error in stale[:-1]:
        print_error(error.message, None)
    raise CliError(stale[-1].message, code=Exit.STALE_RECEIPT, hint=stale[-1].hint)


def _settled(msg_id: int, new_receipt: Receipt | None) -> dict[str, Any]:
    return {"msg_id": msg_id} if new_receipt is None else {"msg_id": msg_id, "receipt": str(new_receipt)}


def _archive(args: argparse.Namespace, broker: Broker) -> int:
    return _by_msg_id(args, broker.queue(args.name).archive_many)


def _delete(args: argparse.Namespace, broker: Broker) -> int:
    return _by_msg_id(args, broker.queue(args.name).delete_many)


def _by_msg_id(args: argparse.Namespace, operation: Callable[[list[int]], list[int]]) -> int:
    wanted = list(dict.fromkeys(args.msg_ids))
    done = set(operation(wanted))
    print_each(args, ({"msg_id": wanted_id} for wanted_id in wanted if wanted_id in done), _msg_id_text)
    missing = [str(wanted_id) for wanted_id in wanted if wanted_id not in done]
    if missing:
        raise CliError(
            f'no message {", ".join(missing)} in queue "{args.name}"',
            code=Exit.NOTHING_DONE,
            hint="It was never sent, or was already deleted, archived, acknowledged or popped.",
        )
    return Exit.OK


def _purge(args: argparse.Namespace, broker: Broker) -> int:
    queue = broker.queue(args.name)
    # Nothing to delete, nothing to confirm: said first (a missing queue too), without --yes.
    if not queue.peek(1):
        text = f'queue "{args.name}" is empty; nothing to purge'
        return print_result(args, {"queue": args.name, "purged": 0}, text)
    confirmed(
        args,
        f'purge deletes every message in queue "{args.name}"',
        hint=f"Confirm with: pgbroker purge {args.name} --yes",
    )
    purged = queue.purge()
    text = f'purged {plural(purged, "message")} from queue "{args.name}"'
    return print_result(args, {"queue": args.name, "purged": purged}, text)
