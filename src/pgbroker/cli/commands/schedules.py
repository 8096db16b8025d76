"""``pgbroker schedule add|list|remove|pause|resume`` and ``pgbroker scheduler``: cron schedules kept
in Postgres that send a message to a queue at every tick (sql/functions/78_schedules.sql).

Every ``pgbroker worker`` also runs a scheduler; ``pgbroker scheduler`` runs one alone. However
many run, each tick is sent once.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from pgbroker import _event_loop as event_loop
from pgbroker._db.dsn import database_place
from pgbroker._log_lines import say
from pgbroker.cli.support.connecting import dsn_of
from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.json_input import json_argument
from pgbroker.cli.support.output import json_text, print_result, wants_json
from pgbroker.cli.support.parsers import Subcommands, add_command, add_group, add_service_options
from pgbroker.cli.support.tables import local_time, table
from pgbroker.queues._client import Broker
from pgbroker.queues._records import Schedule
from pgbroker.runtime._app import serve_scheduler

__all__ = ["register"]


def register(subcommands: Subcommands) -> None:
    actions = add_group(subcommands, "schedule", "cron schedules that send messages to queues")
    sub = add_command(actions, "add", "add a schedule", _add)
    sub.add_argument("name", metavar="NAME", help="the schedule's name")
    sub.add_argument("--queue", required=True, help="the queue each tick sends to")
    sub.add_argument("--cron", required=True, help="5 fields, e.g. '*/5 * * * *' or '0 9 * * mon-fri'")
    sub.add_argument("--message", required=True, metavar="JSON", help="the message each tick sends")
    sub.add_argument("--headers", metavar="JSON", help="its headers, a JSON object")
    sub.add_argument("--timezone", default="UTC", metavar="TZ", help="an IANA time zone (UTC)")
    sub.add_argument("--replace", action="store_true", help="redefine a schedule of that name")
    sub = add_command(actions, "list", "list the schedules", _list)
    for action, summary, handler in (
        ("remove", "remove a schedule", _remove),
        ("pause", "stop sending a schedule's ticks", _pause),
        ("resume", "send a paused schedule's ticks again, from the next one", _resume),
    ):
        sub = add_command(actions, action, summary, handler)
        sub.add_argument("name", metavar="NAME", help="the schedule's name")

    summary = "send the ticks of the schedules (workers run one too)"
    add_service_options(add_command(subcommands, "scheduler", summary, _scheduler, json_output=False))


def _schedule_json(schedule: Schedule) -> dict[str, Any]:
    return {
        key: value.isoformat() if hasattr(value, "isoformat") else value
        for key, value in asdict(schedule).items()
    }


def _print(args: argparse.Namespace, schedule: Schedule, done: str) -> int:
    state = "paused" if schedule.paused else f"next tick {local_time(schedule.next_run)}"
    text = f'{done} schedule "{schedule.name}" ({schedule.cron} {schedule.timezone}): {state}'
    return print_result(args, _schedule_json(schedule), text)


def _add(args: argparse.Namespace, broker: Broker) -> int:
    message = json_argument(args.message, "--message")
    headers = None if args.headers is None else json_argument(args.headers, "--headers")
    if headers is not None and not isinstance(headers, dict):
        raise CliError('--headers must be a JSON object, for example \'{"source": "cron"}\'', code=Exit.USAGE)
    schedule = broker.add_schedule(
        args.name,
        args.queue,
        args.cron,
        message,
        headers=headers,
        timezone=args.timezone,
        replace=args.replace,
    )
    return _print(args, schedule, "replaced" if args.replace else "added")


def _list(args: argparse.Namespace, broker: Broker) -> int:
    schedules = broker.schedules()
    if wants_json(args):
        print(json_text([_schedule_json(s) for s in schedules], indent=2))
    elif not schedules:
        print("no schedules (add one with: pgbroker schedule add NAME --queue Q --cron CRON --message JSON)")
    else:
        print(_schedule_table(schedules))
    return Exit.OK


def _schedule_table(schedules: Sequence[Schedule]) -> str:
    rows = [
        [
            s.name,
            s.queue_name,
            f"{s.cron} {s.timezone}",
            "paused" if s.paused else local_time(s.next_run),
            local_time(s.last_run) if s.last_run else "-",
            f"error: {s.last_error}" if s.last_error else str(s.last_msg_id or "-"),
        ]
        for s in schedules
    ]
    return table(["NAME", "QUEUE", "CRON", "NEXT", "LAST", "LAST MSG_ID"], rows)


def _missing(name: str) -> CliError:
    """A schedule not found (exit 4, as a missing queue or stream), whichever command named it."""
    return CliError(
        f'schedule "{name}" does not exist', code=Exit.NOT_FOUND, hint="List them: pgbroker schedule list"
    )


def _existing(broker: Broker, name: str) -> str:
    # The engine refuses a missing name as an invalid argument, which would exit 2 (a usage error).
    if all(schedule.name != name for schedule in broker.schedules()):
        raise _missing(name)
    return name


def _remove(args: argparse.Namespace, broker: Broker) -> int:
    if not broker.remove_schedule(args.name):
        raise _missing(args.name)
    return print_result(args, {"removed": args.name}, f'removed schedule "{args.name}"')


def _pause(args: argparse.Namespace, broker: Broker) -> int:
    return _print(args, broker.pause_schedule(_existing(broker, args.name)), "paused")


def _resume(args: argparse.Namespace, broker: Broker) -> int:
    return _print(args, broker.resume_schedule(_existing(broker, args.name)), "resumed")


def _scheduler(args: argparse.Namespace, broker: Broker) -> int:
    schedules = broker.schedules()  # a database without pgbroker, or a role without rights: fail here
    dsn = dsn_of(args.dsn, args.connect_timeout)
    # Said once its own pool is open: a login refused before then fails the start (exit 5), unsaid.
    scheduling = serve_scheduler(
        dsn, pooler=args.pooler, pool_timeout=args.pool_timeout, on_started=lambda: _announce(schedules, dsn)
    )
    event_loop.run(scheduling, args.loop)
    return Exit.OK


def _announce(schedules: Sequence[Schedule], dsn: str) -> None:
    """One line on stderr, shown without -v, as pgbroker worker's: what it sends, where, how to stop it."""
    running = sum(not schedule.paused for schedule in schedules)
    what = (
        f"{len(schedules)} schedule{'' if len(schedules) == 1 else 's'} ({running} running)"
        if schedules
        else "no schedules yet (pgbroker schedule add ...; it takes them up as they come)"
    )
    say(
        f"scheduler started: {what} in {database_place(dsn)} (stop: Ctrl-C or SIGTERM)",
        event="command.started",
        command="scheduler",
    )
