"""``pgbroker stream ...``: streams (append-only logs read by consumer groups, docs/streams.md):
create, drop, list, send, read (and ack), create-group, drop-group, groups (with lag), lag (per
partition), maintain (retention)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from pgbroker._log_lines import say
from pgbroker.cli.commands.messages import send_lines
from pgbroker.cli.support.arguments import positive_int, seconds, whole_seconds
from pgbroker.cli.support.confirming import add_yes_option, confirmed
from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.json_input import json_argument
from pgbroker.cli.support.output import json_text, plural, print_each, print_listing, print_result
from pgbroker.cli.support.parsers import Subcommands, add_command, add_group
from pgbroker.cli.support.tables import table
from pgbroker.queues._client import Broker
from pgbroker.streams._client import Stream, list_streams
from pgbroker.streams._records import PartitionLag, StreamGroupInfo, StreamInfo, StreamMessage

__all__ = ["register"]

NO_STREAMS = "no streams (create one with: pgbroker stream create NAME)"


def register(subcommands: Subcommands) -> None:
    actions = add_group(subcommands, "stream", "streams: logs read by consumer groups")
    sub = add_command(actions, "create", "create a stream (idempotent)", _create)
    sub.add_argument("name", metavar="STREAM", help="stream name")
    sub.add_argument("--partitions", type=positive_int, default=4, metavar="N", help="key partitions (4)")
    sub.add_argument(
        "--retention", type=whole_seconds, metavar="DURATION", help="drop messages older than this"
    )
    sub.add_argument("--retention-bytes", type=positive_int, metavar="N", help="keep the log under N bytes")
    sub.add_argument(
        "--keep-consumed", action="store_true", help="keep what every group has read (until the retention)"
    )
    sub.add_argument(
        "--segment-rows", type=positive_int, default=1_000_000, metavar="N", help="ids a segment"
    )
    sub.add_argument("--segments", type=positive_int, default=4, metavar="N", help="child tables in the ring")
    sub.add_argument("--notify", action="store_true", help="wake waiting consumers on each send")

    sub = add_command(
        actions, "drop", "drop a stream, its groups and cursors, and the retry queues its groups made", _drop
    )
    sub.add_argument("name", metavar="STREAM", help="stream name")
    add_yes_option(sub, "drop")

    add_command(actions, "list", "list streams", _list)

    sub = add_command(actions, "send", "send a JSON message, or JSON lines from stdin", _send)
    sub.add_argument("name", metavar="STREAM", help="stream name")
    sub.add_argument(
        "message",
        nargs="?",
        metavar="MESSAGE",
        help="the message as JSON; without it, one message per stdin line",
    )
    sub.add_argument("--key", help="partition key (messages of a key keep their order)")
    sub.add_argument("--headers", metavar="JSON", help="headers for every message sent, a JSON object")
    sub.add_argument(
        "--batch-size", type=positive_int, default=500, metavar="N", help="stdin lines per statement (500)"
    )

    sub = add_command(actions, "read", "read a batch as a group's consumer, print JSON lines, ack it", _read)
    sub.add_argument("name", metavar="STREAM", help="stream name")
    sub.add_argument("group", metavar="GROUP", help="consumer group")
    sub.add_argument("--qty", type=positive_int, default=10, metavar="N", help="at most this many (10)")
    sub.add_argument("--wait", type=seconds, default=0.0, metavar="DURATION", help="wait for messages (0)")
    sub.add_argument("--no-ack", action="store_true", help="leave the batch unacknowledged (a peek)")

    sub = add_command(actions, "create-group", "create a consumer group (idempotent)", _create_group)
    sub.add_argument("name", metavar="STREAM", help="stream name")
    sub.add_argument("group", metavar="GROUP", help="group name")
    sub.add_argument(
        "--start", default="end", metavar="WHERE", help="start, end (default), or an ISO time with its zone"
    )
    sub.add_argument(
        "--retry-queue",
        metavar="QUEUE",
        help="where failed messages go (<stream>_<group>_retry); no other group's",
    )

    sub = add_command(
        actions, "drop-group", "drop a consumer group, and its retry queue if the group made it", _drop_group
    )
    sub.add_argument("name", metavar="STREAM", help="stream name")
    sub.add_argument("group", metavar="GROUP", help="group name")
    add_yes_option(sub, "drop-group")

    sub = add_command(actions, "groups", "a stream's groups with their lag", _groups)
    sub.add_argument("name", metavar="STREAM", help="stream name")

    sub = add_command(actions, "lag", "lag and owner per group and partition", _lag)
    sub.add_argument("name", metavar="STREAM", help="stream name")

    sub = add_command(actions, "maintain", "apply retention: empty the child tables that may go", _maintain)
    sub.add_argument("names", nargs="*", metavar="STREAM", help="these streams (default: all)")


def _create(args: argparse.Namespace, broker: Broker) -> int:
    info = Stream(broker, args.name).create(
        partitions=args.partitions,
        retention=args.retention,
        retention_bytes=args.retention_bytes,
        truncate_consumed=not args.keep_consumed,
        segment_rows=args.segment_rows,
        segments=args.segments,
        notify=args.notify,
    )
    return print_listing(args, [info], _info_json, _stream_table, empty=NO_STREAMS)


def _drop(args: argparse.Namespace, broker: Broker) -> int:
    stream = Stream(broker, args.name)
    stream.groups()  # a missing stream is said first (StreamNotFound), without --yes
    confirmed(
        args,
        f"drop deletes stream {args.name} with its messages, groups and cursors, and the retry queues"
        " its groups made",
        hint=f"Confirm with: pgbroker stream drop {args.name} --yes",
    )
    if not stream.drop():
        raise CliError(f'stream "{args.name}" does not exist', code=Exit.NOT_FOUND)
    return print_result(args, {"stream": args.name, "dropped": True}, f"dropped stream {args.name}")


def _list(args: argparse.Namespace, broker: Broker) -> int:
    return print_listing(args, list_streams(broker), _info_json, _stream_table, empty=NO_STREAMS)


def _info_json(info: StreamInfo) -> dict[str, Any]:
    return {**asdict(info), "created_at": info.created_at.isoformat()}


def _stream_table(infos: Sequence[StreamInfo]) -> str:
    header = ["STREAM", "PARTITIONS", "RETENTION", "SEGMENTS", "NOTIFY"]
    rows = [
        [
            i.name,
            str(i.partitions),
            _retention(i),
            f"{i.segments} x {i.segment_rows:,}",
            "yes" if i.notify else "no",
        ]
        for i in infos
    ]
    return table(header, rows, right_aligned=[1])


def _retention(i: StreamInfo) -> str:
    limits = []
    if i.retention_seconds is not None:
        limits.append(f"{i.retention_seconds}s")
    if i.retention_bytes is not None:
        limits.append(f"{i.retention_bytes:,} bytes")
    if i.truncate_consumed:
        limits.append("until consumed")
    return ", ".join(limits) or "forever"


def _send(args: argparse.Namespace, broker: Broker) -> int:
    stream = Stream(broker, args.name)
    headers: dict[str, Any] | None = None
    if args.headers is not None:
        headers = json_argument(args.headers, "--headers")
        if not isinstance(headers, dict):
            raise CliError(
                '--headers must be a JSON object, for example \'{"source": "cli"}\'', code=Exit.USAGE
            )
    if args.message is not None:
        sent = stream.send(json_argument(args.message, "the message"), key=args.key, headers=headers)
        return print_result(args, {"id": sent}, str(sent))

    def send_batch(batch: list[Any]) -> int:
        ids = stream.send_many(
            batch,
            keys=[args.key] * len(batch),
            headers=None if headers is None else [headers] * len(batch),
        )
        print_each(args, ({"id": sent} for sent in ids), lambda record: str(record["id"]))
        return len(ids)

    if sys.stdin.isatty():
        print("pgbroker: reading one JSON message per line; end with Ctrl-D", file=sys.stderr)
    if send_lines(sys.stdin, args.batch_size, send_batch) == 0:
        print("pgbroker: no messages on stdin, nothing sent", file=sys.stderr)
    return Exit.OK


def _read(args: argparse.Namespace, broker: Broker) -> int:
    consumer = Stream(broker, args.name).consumer(args.group)
    try:
        batch = consumer.read(args.qty, wait=args.wait)
        for message in batch:
            print(_message_json(message))
        if args.no_ack:
            return Exit.OK
        consumer.ack(batch)
        if len(batch):
            # Acked for the whole group: a look under a working group's name takes its messages
            # from that group's workers, which was said only by --help.
            say(
                f"acked {plural(len(batch), 'message')} for group {args.group}: its other consumers "
                "will not get them (--no-ack reads without taking them)",
                event="command.stream_acked",
                stream=args.name,
                group=args.group,
                messages=len(batch),
            )
    finally:
        consumer.release()  # a one-shot consumer: its partitions are free at once
    return Exit.OK


def _message_json(m: StreamMessage) -> str:
    record = {
        "stream": m.stream,
        "partition": m.partition,
        "id": m.id,
        "key": m.key,
        "enqueued_at": m.enqueued_at.isoformat(),
        "headers": m.headers,
        "message": m.message,
    }
    return json_text(record)


def _create_group(args: argparse.Namespace, broker: Broker) -> int:
    start: str | datetime = args.start
    if args.start not in ("start", "end"):
        try:
            start = datetime.fromisoformat(args.start)
        except ValueError:
            raise CliError(
                f"--start must be start, end or an ISO time, got {args.start!r}",
                code=Exit.USAGE,
                hint="For example --start 2026-11-25T08:00:00+00:00",
            ) from None
    stream = Stream(broker, args.name)
    existed = any(group.name == args.group for group in stream.groups())
    retry_queue = stream.create_group(args.group, start=start, retry_queue=args.retry_queue)
    text = f"group {args.group} of stream {args.name} (failed messages go to queue {retry_queue})"
    # Where a new group reads from: by default the end, so that a stream's first reader, made
    # after its first sends, read nothing without a word.
    if existed:
        text += "\nit was there already: its position is as it was (--start sets a new group's)"
    elif start == "end":
        text += "\nit reads the messages sent from now on (--start start: also those the stream keeps)"
    elif start == "start":
        text += "\nit reads every message the stream keeps, then those sent from now on"
    else:
        text += f"\nit reads the messages sent since {args.start}"
    return print_result(args, {"stream": args.name, "group": args.group, "retry_queue": retry_queue}, text)


def _drop_group(args: argparse.Namespace, broker: Broker) -> int:
    stream = Stream(broker, args.name)
    if args.group in (g.name for g in stream.groups()):  # a missing one is said first, without --yes
        confirmed(
            args,
            f"drop-group deletes group {args.group} of stream {args.name} with its cursors, and its retry"
            " queue with the failures in it if the group made it",
            hint=f"Confirm with: pgbroker stream drop-group {args.name} {args.group} --yes",
        )
    if not stream.drop_group(args.group):
        raise CliError(
            f'stream "{args.name}" has no consumer group "{args.group}"',
            code=Exit.NOT_FOUND,
            hint=f"List its groups: pgbroker stream groups {args.name}",
        )
    record = {"stream": args.name, "group": args.group, "dropped": True}
    return print_result(args, record, f"dropped group {args.group} of stream {args.name}")


def _groups(args: argparse.Namespace, broker: Broker) -> int:
    groups = Stream(broker, args.name).groups()
    return print_listing(args, groups, _group_json, _group_table, empty=f"stream {args.name} has no groups")


def _group_json(g: StreamGroupInfo) -> dict[str, Any]:
    return {
        **asdict(g),
        "created_at": g.created_at.isoformat(),
        "oldest_unacked_at": g.oldest_unacked_at.isoformat() if g.oldest_unacked_at else None,
    }


def _group_table(groups: Sequence[StreamGroupInfo]) -> str:
    header = ["GROUP", "LAG", "OLDEST UNACKED", "CONSUMERS", "RETRY QUEUE"]
    rows = [
        [
            g.name,
            f"{g.lag:,}",
            g.oldest_unacked_at.isoformat(timespec="seconds") if g.oldest_unacked_at else "-",
            str(g.consumers),
            g.retry_queue,
        ]
        for g in groups
    ]
    return table(header, rows, right_aligned=[1, 3])


def _lag(args: argparse.Namespace, broker: Broker) -> int:
    lags = Stream(broker, args.name).lag()
    return print_listing(args, lags, _lag_json, _lag_table, empty=f"stream {args.name} has no groups")


def _lag_json(p: PartitionLag) -> dict[str, Any]:
    return {
        **asdict(p),
        "oldest_unacked_at": p.oldest_unacked_at.isoformat() if p.oldest_unacked_at else None,
    }


def _lag_table(lags: Sequence[PartitionLag]) -> str:
    header = ["GROUP", "PARTITION", "ACKED", "DELIVERED", "LAG", "OWNER"]
    rows = [
        [
            p.group,
            str(p.partition),
            str(p.acked_id),
            str(p.delivered_id),
            f"{p.lag:,}",
            (p.owner or "-") + ("" if p.owner is None or p.owner_alive else " (expired)"),
        ]
        for p in lags
    ]
    return table(header, rows, right_aligned=[1, 2, 3, 4])


def _emptied_text(record: Mapping[str, Any]) -> str:
    return f"{record['stream']}: emptied {plural(record['emptied'], 'child table')}"


def _maintain(args: argparse.Namespace, broker: Broker) -> int:
    names = args.names or [s.name for s in list_streams(broker)]
    for name in names:
        emptied = Stream(broker, name).maintain()
        print_each(args, [{"stream": name, "emptied": emptied}], _emptied_text)
    return Exit.OK
