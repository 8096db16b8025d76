"""``pgbroker policy show|set``: a queue's retries, dead letters, ack mode, depth limit and archive
retention; and ``pgbroker maintain``, which applies the retention.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from dataclasses import asdict
from typing import TextIO

from pgbroker.cli.support.arguments import DURATION_UNITS, positive_int, rate_limit, whole, whole_seconds
from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.output import notices_to, plural, print_listing, print_result
from pgbroker.cli.support.parsers import Subcommands, add_command, add_group
from pgbroker.cli.support.tables import table
from pgbroker.queues._client import Broker
from pgbroker.queues._records import Policy
from pgbroker.runtime._worker import DEFAULT_MAX_DELIVERIES

__all__ = ["register"]

log = logging.getLogger("pgbroker.worker")


def register(subcommands: Subcommands) -> None:
    actions = add_group(subcommands, "policy", "queue policies")
    sub = add_command(actions, "show", "show queue policies", _show)
    sub.add_argument("queue", nargs="?", metavar="QUEUE", help="one queue (default: all)")
    sub = add_command(actions, "set", "change a queue's policy (0 turns a limit off)", _set)
    sub.add_argument("queue", metavar="QUEUE", help="queue name")
    sub.add_argument(
        "--max-deliveries", type=whole, metavar="N", help="dead-letter after N failed deliveries"
    )
    sub.add_argument("--backoff", choices=["fixed", "exponential"], help="retry delay kind")
    sub.add_argument("--backoff-base", type=whole_seconds, metavar="DURATION", help="first retry delay (1s)")
    sub.add_argument(
        "--backoff-max", type=whole_seconds, metavar="DURATION", help="longest retry delay (300s)"
    )
    sub.add_argument("--jitter", action=argparse.BooleanOptionalAction, help="spread retry delays")
    target = sub.add_mutually_exclusive_group()
    target.add_argument(
        "--dead-letter-queue", metavar="QUEUE", help="where dead letters go (default: the archive)"
    )
    target.add_argument(
        "--no-dead-letter-queue",
        dest="dead_letter_queue",
        action="store_const",
        const="",
        help="send dead letters to the queue's archive again",
    )
    sub.add_argument("--ack-mode", choices=["archive", "delete"], help="what an ack does with a message")
    sub.add_argument("--max-depth", type=whole, metavar="N", help="refuse sends past N messages")
    sub.add_argument(
        "--archive-retention", type=whole_seconds, metavar="DURATION", help="e.g. 7d (pgbroker maintain)"
    )
    sub.add_argument("--archive-max-rows", type=whole, metavar="N", help="keep at most N archived messages")
    sub.add_argument(
        "--codec", metavar="NAME", help="the sends' default codec: json, msgpack, protobuf:TYPE, avro:NAME"
    )
    sub.add_argument(
        "--priorities",
        action=argparse.BooleanOptionalAction,
        help="build (or drop) the priority index now; a first prioritized send builds it",
    )
    sub.add_argument(
        "--dedup-window", type=whole_seconds, metavar="DURATION", help="how long a dedup key holds (5m)"
    )
    sub.add_argument(
        "--dedup-mode",
        choices=["window", "queued"],
        help="a dedup key holds for the window, or while its message is in the queue",
    )
    sub.add_argument("--max-in-flight", type=whole, metavar="N", help="at most N messages leased at once")
    sub.add_argument(
        "--max-in-flight-per-key", type=whole, metavar="N", help="at most N leased per concurrency key"
    )
    sub.add_argument(
        "--rate-limit",
        type=rate_limit,
        metavar="PER_SECOND",
        help="messages handed out per second (0: no limit)",
    )

    sub = add_command(subcommands, "maintain", "apply archive retention in batches", _maintain)
    sub.add_argument(
        "queues", nargs="*", metavar="QUEUE", help="these queues (default: all with a retention)"
    )
    sub.add_argument("--batch-size", type=positive_int, default=10_000, metavar="N", help="rows per batch")


def _show(args: argparse.Namespace, broker: Broker) -> int:
    policies = [broker.queue(args.queue).policy()] if args.queue else broker.policies()
    return print_listing(args, policies, asdict, _policy_table)


def _policy_table(policies: Sequence[Policy]) -> str:
    """An aligned table of queue policies, as `pgbroker policy show` prints it."""
    header = [
        "QUEUE",
        "MAX DELIVERIES",
        "BACKOFF",
        "DEAD LETTERS TO",
        "ACK",
        "MAX DEPTH",
        "ARCHIVE KEPT",
        "CODEC",
        "LIMITS",
        "DEDUP",
        "STATE",
    ]
    rows = [
        [
            p.queue_name,
            _max_deliveries(p),
            _backoff(p),
            p.dead_letter_queue or "(archive)",
            p.ack_mode,
            "unbounded" if p.max_depth is None else f"{p.max_depth:,}",
            _retention(p),
            p.codec,
            _limits(p),
            f"{_span(p.dedup_window_seconds)}" if p.dedup_mode == "window" else "while queued",
            "paused" if p.paused else "running",
        ]
        for p in policies
    ]
    return table(header, rows)


def _max_deliveries(p: Policy) -> str:
    if p.max_deliveries is None:
        # Unset: pgbroker.read never dead-letters, but pgbroker's worker does, at its own limit.
        return f"unset (workers: {DEFAULT_MAX_DELIVERIES})"
    return str(p.max_deliveries)


def _backoff(p: Policy) -> str:
    if p.backoff == "fixed":
        text = f"fixed {_span(p.backoff_base_seconds)}"
    else:
        text = f"exponential {_span(p.backoff_base_seconds)}..{_span(p.backoff_max_seconds)}"
    return text + (" +jitter" if p.backoff_jitter else "")


def _retention(p: Policy) -> str:
    limits = []
    if p.archive_retention_seconds is not None:
        limits.append(_span(p.archive_retention_seconds))
    if p.archive_max_rows is not None:
        limits.append(f"{p.archive_max_rows:,} rows")
    return ", ".join(limits) or "forever"


def _limits(p: Policy) -> str:
    limits = []
    if p.max_in_flight is not None:
        limits.append(f"{p.max_in_flight} in flight")
    if p.max_in_flight_per_key is not None:
        limits.append(f"{p.max_in_flight_per_key}/key")
    if p.rate_limit_per_second is not None:
        limits.append(f"{p.rate_limit_per_second:g}/s")
    return ", ".join(limits) or "none"


def _span(seconds: int) -> str:
    for unit in ("d", "h", "m"):
        if seconds and seconds % DURATION_UNITS[unit] == 0:
            return f"{seconds // DURATION_UNITS[unit]}{unit}"
    return f"{seconds}s"


_POLICY_OPTIONS = {
    "max_deliveries": "max_deliveries",
    "backoff": "backoff",
    "backoff_base": "backoff_base_seconds",
    "backoff_max": "backoff_max_seconds",
    "jitter": "backoff_jitter",
    "dead_letter_queue": "dead_letter_queue",
    "ack_mode": "ack_mode",
    "max_depth": "max_depth",
    "archive_retention": "archive_retention_seconds",
    "archive_max_rows": "archive_max_rows",
    "codec": "codec",
    "priorities": "priorities",
    "dedup_window": "dedup_window_seconds",
    "dedup_mode": "dedup_mode",
    "max_in_flight": "max_in_flight",
    "max_in_flight_per_key": "max_in_flight_per_key",
    "rate_limit": "rate_limit_per_second",
}


def _set(args: argparse.Namespace, broker: Broker) -> int:
    changes = {setting: getattr(args, option) for option, setting in _POLICY_OPTIONS.items()}
    changes = {setting: value for setting, value in changes.items() if value is not None}
    if not changes:
        raise CliError(
            "nothing to change: give at least one setting",
            code=Exit.USAGE,
            hint=f"See: pgbroker policy set --help; the policy now: pgbroker policy show {args.queue}",
        )
    notices = notices_to(args)
    _create_dead_letter_queue(broker, args.queue, changes.get("dead_letter_queue"), notices)
    policy = broker.queue(args.queue).set_policy(**changes)
    print(f'policy of queue "{policy.queue_name}" changed:', file=notices)
    return print_listing(args, [policy], asdict, _policy_table)


def _create_dead_letter_queue(
    broker: Broker, queue: str, dead_letter_queue: str | None, notices: TextIO
) -> None:
    """Create the dead-letter queue a policy names, when the queue exists and it does not yet: a
    new user's first `policy set ... --dead-letter-queue` should not fail on a queue they only
    just named. A missing queue is left to set_policy to report, with nothing created."""
    if not dead_letter_queue:
        return
    existing = {info.queue_name.lower() for info in broker.list_queues()}
    if queue.lower() in existing and dead_letter_queue.lower() not in existing:
        broker.create_queue(dead_letter_queue)
        print(f'created dead-letter queue "{dead_letter_queue}"', file=notices)


def _maintain(args: argparse.Namespace, broker: Broker) -> int:
    if args.queues:
        names = args.queues
    else:
        kept = [p for p in broker.policies() if p.archive_retention_seconds or p.archive_max_rows]
        names = [p.queue_name for p in kept]
    # Expired dedup keys of every queue (or those given) go too, in batches of their own.
    keys = 0
    for name in args.queues or [None]:
        while batch := broker.trim_dedup_keys(name, args.batch_size):
            keys += batch
    lines = [f"forgot {plural(keys, 'expired dedup key')}"] if keys else []
    if not names:
        lines.append(
            "no queue has an archive retention (pgbroker policy set QUEUE --archive-retention 7d sets one)"
        )
    deleted: dict[str, int] = {}
    for name in names:
        queue = broker.queue(name)
        trimmed = 0
        # Each batch is its own transaction: locks are short, and progress survives an interruption.
        while batch := queue.trim_archive(args.batch_size):
            trimmed += batch
            log.info("maintain.batch queue=%s rows=%s", name, batch)
        deleted[name] = trimmed
        lines.append(f'queue "{name}": deleted {plural(trimmed, "archived message")}')
    record = {"dedup_keys_forgotten": keys, "archived_deleted": deleted}
    return print_result(args, record, "\n".join(lines))
