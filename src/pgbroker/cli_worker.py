"""The consumer side of the ``pgbroker`` command: ``worker``, ``dlq list|replay|purge``,
``policy show|set`` and ``maintain``. pgbroker.cli adds them with register(); errors, exit
codes and output follow its conventions (see its docstring).

``pgbroker worker module:attr`` imports attr from module (the current directory is on the
import path): a pgbroker.App runs every handler it registered (or those of --queue), a
function is run as the handler of each --queue. With --processes N, a supervisor starts N
worker processes, restarts one that is killed, and passes SIGTERM and SIGINT on to them.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import multiprocessing
import multiprocessing.connection
import operator
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from multiprocessing.process import BaseProcess
from typing import Any

from pgbroker.app import App, serve
from pgbroker.cli import (
    EXIT_NOTHING_DONE,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    _add_global_options,
    _classify,
    _msg_id,
    _positive_int,
    _print_error,
    _seconds,
    _table,
    message_json,
)
from pgbroker.client import Broker
from pgbroker.listen import conninfo_of
from pgbroker.models import Message, Policy
from pgbroker.worker import Worker

__all__ = ["register"]

log = logging.getLogger("pgbroker.worker")

# How pgbroker.cli.main formats log lines; a worker process started by the supervisor does the same.
_LOG_FORMAT = "pgbroker: %(message)s"
# A worker process that was killed is started again after this pause, so that one that
# dies at once (out of memory, say) does not spin.
_RESTART_PAUSE = 1.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the worker, dlq, policy and maintain commands to pgbroker's parser."""

    def command(
        parent: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        summary: str,
        handler: Callable[[argparse.Namespace, Broker], int],
        *,
        json_output: bool = False,
    ) -> argparse.ArgumentParser:
        sub = parent.add_parser(
            name, help=summary, description=summary, epilog="exit codes: see pgbroker --help"
        )
        _add_global_options(sub, top_level=False, json_output=json_output)
        sub.set_defaults(handler=handler)
        return sub

    sub = command(
        subparsers, "worker", "run handlers that consume queues (until SIGTERM or Ctrl-C)", _cmd_worker
    )
    sub.add_argument("target", metavar="MODULE:ATTR", help="a pgbroker.App, or a handler function")
    sub.add_argument(
        "--queue",
        action="append",
        default=[],
        metavar="NAME",
        help="queue to consume (repeatable; an App: all)",
    )
    sub.add_argument(
        "--concurrency", type=_positive_int, metavar="N", help="messages in flight per process (1)"
    )
    sub.add_argument(
        "--batch-size", type=_positive_int, metavar="N", help="most messages per read (concurrency)"
    )
    sub.add_argument("--vt", type=_positive_int, metavar="SECONDS", help="lease length (30)")
    sub.add_argument(
        "--no-heartbeat", dest="heartbeat", action="store_false", default=None, help="do not extend leases"
    )
    sub.add_argument(
        "--no-notify",
        dest="notify",
        action="store_false",
        default=None,
        help="do not enable notify on the queue",
    )
    sub.add_argument("--poll-max", type=_seconds, metavar="SECONDS", help="longest pause between polls (5)")
    sub.add_argument("--grace", dest="grace_period", type=_seconds, metavar="SECONDS", help="drain time (30)")
    sub.add_argument(
        "--maintain-every", type=_seconds, metavar="SECONDS", help="also apply archive retention this often"
    )
    sub.add_argument("--processes", type=_positive_int, default=1, metavar="N", help="worker processes (1)")
    sub.add_argument(
        "--progress",
        type=_seconds,
        nargs="?",
        const=5.0,
        metavar="SECONDS",
        help="print counts and rates to stderr every SECONDS (5)",
    )

    dlq = subparsers.add_parser("dlq", help="a queue's dead letters", description="a queue's dead letters")
    actions = dlq.add_subparsers(dest="dlq_action", metavar="ACTION", required=True)
    sub = command(actions, "list", "list dead letters, oldest first", _cmd_dlq_list, json_output=True)
    sub.add_argument("queue", help="the queue they came from")
    sub.add_argument("--limit", type=_positive_int, default=100, metavar="N", help="at most this many (100)")
    sub = command(actions, "replay", "send dead letters back to their queue", _cmd_dlq_replay)
    sub.add_argument("queue", help="the queue they came from")
    sub.add_argument("msg_ids", nargs="*", type=_msg_id, metavar="MSG_ID", help="these only (default: all)")
    sub = command(actions, "purge", "delete dead letters", _cmd_dlq_purge)
    sub.add_argument("queue", help="the queue they came from")
    sub.add_argument("msg_ids", nargs="*", type=_msg_id, metavar="MSG_ID", help="these only (default: all)")
    sub.add_argument("--yes", action="store_true", help="confirm: purging cannot be undone")

    policy = subparsers.add_parser("policy", help="queue policies", description="queue policies")
    actions = policy.add_subparsers(dest="policy_action", metavar="ACTION", required=True)
    sub = command(actions, "show", "show queue policies", _cmd_policy_show, json_output=True)
    sub.add_argument("queue", nargs="?", help="one queue (default: all)")
    sub = command(actions, "set", "change a queue's policy (0 turns a limit off)", _cmd_policy_set)
    sub.add_argument("queue", help="queue name")
    sub.add_argument(
        "--max-deliveries", type=_whole, metavar="N", help="dead-letter after N failed deliveries"
    )
    sub.add_argument("--backoff", choices=["fixed", "exponential"], help="retry delay kind")
    sub.add_argument("--backoff-base", type=_duration, metavar="DURATION", help="first retry delay (1s)")
    sub.add_argument("--backoff-max", type=_duration, metavar="DURATION", help="longest retry delay (300s)")
    sub.add_argument("--jitter", action=argparse.BooleanOptionalAction, help="spread retry delays")
    target = sub.add_mutually_exclusive_group()
    target.add_argument(
        "--dead-letter-queue", metavar="NAME", help="where dead letters go (default: the archive)"
    )
    target.add_argument(
        "--no-dead-letter-queue",
        dest="dead_letter_queue",
        action="store_const",
        const="",
        help="send dead letters to the queue's archive again",
    )
    sub.add_argument("--ack-mode", choices=["archive", "delete"], help="what an ack does with a message")
    sub.add_argument("--max-depth", type=_whole, metavar="N", help="refuse sends past N messages")
    sub.add_argument(
        "--archive-retention", type=_duration, metavar="DURATION", help="e.g. 7d (pgbroker maintain)"
    )
    sub.add_argument("--archive-max-rows", type=_whole, metavar="N", help="keep at most N archived messages")

    sub = command(subparsers, "maintain", "apply archive retention in batches", _cmd_maintain)
    sub.add_argument(
        "queues", nargs="*", metavar="QUEUE", help="these queues (default: all with a retention)"
    )
    sub.add_argument("--batch-size", type=_positive_int, default=10_000, metavar="N", help="rows per batch")


# -- argument types -------------------------------------------------------------------------------


def _whole(text: str) -> int:
    if not re.fullmatch(r"\s*\d+\s*", text):
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> int:
    """Whole seconds from '90', '90s', '15m', '12h' or '7d'."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a duration such as 30s, 15m, 12h or 7d, got {text!r}")
    return int(match[1]) * _UNITS[match[2]]


# -- worker ---------------------------------------------------------------------------------------


def _cmd_worker(args: argparse.Namespace, broker: Broker) -> int:
    workers = _workers(args)  # import the handlers here, so that a mistake fails before any process starts
    with broker.connection() as conn:
        dsn = conninfo_of(conn.info)
    if args.processes == 1:
        return _serve(workers, dsn, args.progress)
    return _supervise(args, dsn)


def _serve(workers: list[Worker], dsn: str, progress: float | None) -> int:
    asyncio.run(serve(workers, dsn=dsn, progress_every=progress))
    return EXIT_OK


def _workers(args: argparse.Namespace) -> list[Worker]:
    target = _load(args.target)
    names = (
        "concurrency",
        "batch_size",
        "vt",
        "heartbeat",
        "notify",
        "poll_max",
        "grace_period",
        "maintain_every",
    )
    options: dict[str, Any] = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if isinstance(target, App):
        return target.workers(args.queue or None, **options)
    if not args.queue:
        raise CliError(
            f"{args.target} is a handler function: say which queue it consumes",
            code=EXIT_USAGE,
            hint=f"pgbroker worker {args.target} --queue NAME",
        )
    return [Worker(name, target, **options) for name in args.queue]


def _load(target: str) -> App | Callable[[Message], Any]:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise CliError(
            f"expected MODULE:ATTR, got {target!r}",
            code=EXIT_USAGE,
            hint="For example: pgbroker worker shop.jobs:app",
        )
    # As `python -m` would: handlers usually live beside where the worker is started.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
        found = operator.attrgetter(attribute)(module)
    except (ImportError, AttributeError) as exc:
        raise CliError(f"cannot load {target}: {exc}", code=EXIT_USAGE) from exc
    if not (isinstance(found, App) or callable(found)):
        raise CliError(f"{target} is neither a pgbroker.App nor a function, but {found!r}", code=EXIT_USAGE)
    return found  # type: ignore[no-any-return]


def _supervise(args: argparse.Namespace, dsn: str) -> int:
    """Run args.processes worker processes until SIGTERM or SIGINT; restart one that is killed.

    The first signal reaches the workers as SIGTERM (stop within the grace period), any later
    one as SIGINT (stop now). Exits with the first non-zero exit code of a worker process that
    ended on its own (after stopping the others), else 0.
    """
    context = multiprocessing.get_context("spawn")  # a fork would share the parent's connection
    level = logging.getLogger().getEffectiveLevel()
    children: list[BaseProcess] = []
    stopping = False
    result = EXIT_OK

    def start() -> None:
        child = context.Process(target=_child, args=(args, dsn, level), name="pgbroker-worker")
        child.start()
        children.append(child)

    def stop_all(*_: object) -> None:
        nonlocal stopping
        for child in children:
            if child.pid is not None and child.exitcode is None:
                os.kill(child.pid, signal.SIGINT if stopping else signal.SIGTERM)
        stopping = True

    previous = {signum: signal.signal(signum, stop_all) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        for _ in range(args.processes):
            start()
        log.info("supervisor.started processes=%s pid=%s", args.processes, os.getpid())
        while children:
            multiprocessing.connection.wait([child.sentinel for child in children], timeout=1.0)
            for child in [c for c in children if c.exitcode is not None]:
                children.remove(child)
                code = child.exitcode
                assert code is not None
                if stopping or code == 0:
                    continue
                if code < 0:
                    log.warning("supervisor.restarting pid=%s signal=%s", child.pid, -code)
                    time.sleep(_RESTART_PAUSE)
                    start()
                else:
                    result = code
                    stop_all()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return result


def _child(args: argparse.Namespace, dsn: str, level: int) -> None:
    """A worker process under the supervisor, which alone decides when it stops."""
    # Out of the terminal's process group: Ctrl-C reaches the supervisor only, which passes it on.
    os.setpgrp()
    _stop_with(os.getppid())
    logging.basicConfig(level=level, format=_LOG_FORMAT, stream=sys.stderr)
    try:
        code = _serve(_workers(args), dsn, args.progress)
    except Exception as exc:
        code, message, hint = _classify(exc)
        _print_error(message, hint)
    sys.exit(code)


def _stop_with(parent: int) -> None:
    """Stop gracefully once the supervisor is gone (killed): nobody else would stop this process."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="pgbroker-parent-watch", daemon=True).start()


# -- dead letters ---------------------------------------------------------------------------------


def _cmd_dlq_list(args: argparse.Namespace, broker: Broker) -> int:
    letters = broker.queue(args.queue).dead_letters(args.limit)
    if args.json:
        for letter in letters:
            print(message_json(letter))
    elif not letters:
        print(f'no dead letters from queue "{args.queue}"')
    else:
        rows = [_letter_row(letter) for letter in letters]
        print(
            _table(["MSG_ID", "DELIVERIES", "DEAD-LETTERED", "ERROR", "MESSAGE"], rows, right_aligned=[0, 1])
        )
    return EXIT_OK


def _letter_row(letter: Message) -> list[str]:
    why: dict[str, Any] = (letter.headers or {}).get("x-pgbroker-dead-letter", {})
    error = str(why.get("error") or "-")
    payload = json.dumps(letter.message, ensure_ascii=False)
    when = str(why.get("dead_lettered_at", ""))[:19].replace("T", " ")
    return [str(letter.msg_id), str(why.get("deliveries", "-")), when, _cut(error, 60), _cut(payload, 40)]


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _cmd_dlq_replay(args: argparse.Namespace, broker: Broker) -> int:
    replayed = broker.queue(args.queue).replay_dead_letters(args.msg_ids or None)
    _report_missing(args, set(replayed))
    if not replayed:
        raise CliError(f'no dead letters from queue "{args.queue}"; nothing replayed', code=EXIT_NOTHING_DONE)
    print(f'replayed {_count(len(replayed), "dead letter")} to queue "{args.queue}" as new messages')
    return EXIT_OK


def _cmd_dlq_purge(args: argparse.Namespace, broker: Broker) -> int:
    if not args.yes:
        raise CliError(
            f'purge deletes dead letters from queue "{args.queue}" and cannot be undone',
            code=EXIT_USAGE,
            hint=f"Look first (pgbroker dlq list {args.queue}), then confirm with --yes.",
        )
    queue = broker.queue(args.queue)
    purged = queue.purge_dead_letters(args.msg_ids or None)
    if args.msg_ids and purged < len(set(args.msg_ids)):
        # Which ones were missing is no longer knowable after the delete; say how many.
        raise CliError(
            f"purged {_count(purged, 'dead letter')}; {len(set(args.msg_ids)) - purged} of the msg_ids given "
            f'are not dead letters from queue "{args.queue}"',
            code=EXIT_NOTHING_DONE,
        )
    print(f'purged {_count(purged, "dead letter")} from queue "{args.queue}"')
    return EXIT_OK


def _report_missing(args: argparse.Namespace, done: set[int]) -> None:
    missing = [str(msg_id) for msg_id in dict.fromkeys(args.msg_ids) if msg_id not in done]
    if missing:
        raise CliError(
            f'no dead letter {", ".join(missing)} from queue "{args.queue}"'
            + (f" ({_count(len(done), 'other')} replayed)" if done else ""),
            code=EXIT_NOTHING_DONE,
            hint=f"See them with: pgbroker dlq list {args.queue}",
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# -- policies -------------------------------------------------------------------------------------


def _cmd_policy_show(args: argparse.Namespace, broker: Broker) -> int:
    policies = [broker.queue(args.queue).policy()] if args.queue else broker.policies()
    if args.json:
        print(json.dumps([asdict(p) for p in policies], default=str, indent=2))
    elif not policies:
        print("no queues (create one with: pgbroker create NAME)")
    else:
        print(policy_table(policies))
    return EXIT_OK


def policy_table(policies: Sequence[Policy]) -> str:
    """An aligned table of queue policies, as `pgbroker policy show` prints it."""
    header = ["QUEUE", "MAX DELIVERIES", "BACKOFF", "DEAD LETTERS TO", "ACK", "MAX DEPTH", "ARCHIVE KEPT"]
    rows = [
        [
            p.queue_name,
            "unlimited" if p.max_deliveries is None else str(p.max_deliveries),
            _backoff(p),
            p.dead_letter_queue or "(archive)",
            p.ack_mode,
            "unbounded" if p.max_depth is None else f"{p.max_depth:,}",
            _retention(p),
        ]
        for p in policies
    ]
    return _table(header, rows)


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


def _span(seconds: int) -> str:
    for unit in ("d", "h", "m"):
        if seconds and seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
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
}


def _cmd_policy_set(args: argparse.Namespace, broker: Broker) -> int:
    changes = {setting: getattr(args, option) for option, setting in _POLICY_OPTIONS.items()}
    changes = {setting: value for setting, value in changes.items() if value is not None}
    if not changes:
        raise CliError(
            "nothing to change: give at least one setting",
            code=EXIT_USAGE,
            hint=f"See: pgbroker policy set --help; the policy now: pgbroker policy show {args.queue}",
        )
    policy = broker.queue(args.queue).set_policy(**changes)
    print(f'policy of queue "{policy.queue_name}" changed:')
    print(policy_table([policy]))
    return EXIT_OK


# -- maintenance ----------------------------------------------------------------------------------


def _cmd_maintain(args: argparse.Namespace, broker: Broker) -> int:
    if args.queues:
        names = args.queues
    else:
        kept = [p for p in broker.policies() if p.archive_retention_seconds or p.archive_max_rows]
        names = [p.queue_name for p in kept]
    if not names:
        print("no queue has an archive retention (pgbroker policy set QUEUE --archive-retention 7d sets one)")
        return EXIT_OK
    for name in names:
        queue = broker.queue(name)
        trimmed = 0
        # Each batch is its own transaction: locks are short, and progress survives an interruption.
        while batch := queue.trim_archive(args.batch_size):
            trimmed += batch
            log.info("maintain.batch queue=%s rows=%s", name, batch)
        print(f'queue "{name}": deleted {_count(trimmed, "archived message")}')
    return EXIT_OK
