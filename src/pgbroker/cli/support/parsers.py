"""The command line's shape: pgbroker's top-level parser, its global options, and how a
command module adds its commands and groups."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeAlias

from pgbroker import __version__
from pgbroker._db.dsn import POOLER_MODES
from pgbroker._db.pools import DEFAULT_CONNECT_TIMEOUT, DEFAULT_POOL_TIMEOUT
from pgbroker._event_loop import LOOP_ENV, LOOP_NAMES
from pgbroker._log_lines import LOG_FORMAT_ENV, LOG_FORMATS
from pgbroker.cli.support.arguments import DURATION_FORMS, connect_seconds, positive_seconds, seconds
from pgbroker.queues._client import Broker

EPILOG = f"""\
exit codes:
  0   success, or nothing to do (an empty read, purge or replay; a create, pause,
      resume, db start or db stop already done)
  1   nothing done: msg_ids that are not there (archive, delete, dlq), send with
      no input, db url or db status of an embedded cluster not running
  2   usage error or invalid input (bad JSON, malformed receipt, bad queue name),
      or the command's optional extra not installed
  3   stale receipt: the ack changed nothing
  4   not found: the named queue, stream, group, schedule, API key or grant
  5   database unreachable, refused the operation, or pgbroker not installed;
      worker, serve, bridge and scheduler wait for an unreachable database at
      their start (--wait-for-database bounds the wait) and exit 0 if stopped then
  6   a broker (bridge) unreachable, login refused, or an exchange, queue or stream missing
  70  unexpected error (run again with -v and report it)
  130 interrupted (Ctrl-C)

DURATION: {DURATION_FORMS}. A
delay, lease, retention or window is kept in whole seconds: a fraction is rounded up,
and the command says so on stderr.

The database is --dsn, else $DATABASE_URL, else pgbroker's embedded PostgreSQL
(started on first use; see `pgbroker db status`).
"""


# A command that works on the database gets a Broker; one that does not (db, pipeline) only its
# arguments.
Handler = Callable[[argparse.Namespace, Broker], int]


LocalHandler = Callable[[argparse.Namespace], int]


# What add_subparsers returns; a string, as argparse does not subscript it at run time.
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class Parser(argparse.ArgumentParser):
    """argparse's parser, with a suggestion for a mistyped choice (``pgbroker lst``: did you
    mean 'list'?), and the actions of a group given none (``pgbroker dlq``)."""

    def error(self, message: str) -> NoReturn:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and message.endswith(f": {action.metavar}"):
                names = ", ".join(action.choices)
                message += f" (one of: {names}; {self.prog} -h says what each does)"
        super().error(message)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        close = difflib.get_close_matches(str(value), [str(choice) for choice in choices], n=3)
        suggestion = ", ".join(repr(name) for name in close)
        hint = f"did you mean {suggestion}?" if close else f"choose from {', '.join(map(str, choices))}"
        raise argparse.ArgumentError(action, f"invalid choice: {value!r} ({hint})")


class CommandParser(Parser):
    """The parser of one command: an option it does not know is its own error, reported with
    its own usage (argparse would hand it up to the top-level parser, whose usage says nothing
    of the command's options).

    A command's options may come between its arguments (``send orders --delay 5 '{}'``):
    argparse alone gives an optional argument (MESSAGE) nothing once an option follows the one
    before it, and then calls the message an unrecognized argument. A group's parser (``dlq``)
    hands what follows its action to that action's parser, and ``pipeline`` the rest to its
    job, as argparse does (it mixes neither)."""

    _intermixing = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._intermixing:  # the passes of parse_known_intermixed_args
            return super().parse_known_args(args, namespace)
        if any(action.nargs in (argparse.PARSER, argparse.REMAINDER) for action in self._actions):
            parsed, extras = super().parse_known_args(args, namespace)
        else:
            self._intermixing = True
            try:
                parsed, extras = self.parse_known_intermixed_args(args, namespace)
            finally:
                self._intermixing = False
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def new_parser() -> tuple[argparse.ArgumentParser, Subcommands]:
    """pgbroker's top-level parser, and the subparsers the command modules add their commands to."""
    parser = Parser(
        prog="pgbroker",
        description="Queues inside PostgreSQL (pgmq-compatible), with fenced acks.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pgbroker {__version__}")
    add_global_options(parser, top_level=True)
    return parser, parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)


def add_global_options(
    parser: argparse.ArgumentParser, *, top_level: bool, json_output: bool = True, dsn_option: bool = True
) -> None:
    if dsn_option:
        parser.add_argument(
            "--dsn",
            default=None if top_level else argparse.SUPPRESS,
            help="database to use (default: $DATABASE_URL, else the embedded one)",
        )
        parser.add_argument(
            "--connect-timeout",
            type=connect_seconds,
            default=DEFAULT_CONNECT_TIMEOUT if top_level else argparse.SUPPRESS,
            metavar="DURATION",
            help="give up a connection attempt after this long, in this command and the pools of "
            "a worker, server or bridge, in whole seconds of at least 2 as libpq takes it: a "
            f"fraction is rounded up (default: {DEFAULT_CONNECT_TIMEOUT:g}; a connect_timeout in "
            "the DSN or $PGCONNECT_TIMEOUT wins)",
        )
        parser.add_argument(
            "--pool-timeout",
            type=positive_seconds,
            default=DEFAULT_POOL_TIMEOUT if top_level else argparse.SUPPRESS,
            metavar="DURATION",
            help="how long a worker, server, bridge or scheduler waits for a free pooled connection "
            f"before the call fails (default: {DEFAULT_POOL_TIMEOUT:g})",
        )
        parser.add_argument(
            "--pooler",
            choices=POOLER_MODES,
            default=None if top_level else argparse.SUPPRESS,
            help="what stands in front of Postgres: 'transaction' (pgbouncer's pool_mode = transaction "
            "or a proxy like it) runs statements unprepared and polls instead of LISTEN (default: "
            "$PGBROKER_POOLER, else none)",
        )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=None if top_level else argparse.SUPPRESS,
        help="log lines as text or as JSON lines, one object a record, for a log pipeline "
        f"(default: ${LOG_FORMAT_ENV}, else text)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0 if top_level else argparse.SUPPRESS,
        help="log progress; on errors, show the traceback (-vv: debug logs)",
    )
    if json_output:
        parser.add_argument(
            "--json",
            action="store_true",
            default=False if top_level else argparse.SUPPRESS,
            help="machine-readable output",
        )


def add_command(
    subcommands: Subcommands,
    name: str,
    summary: str,
    handler: Handler | LocalHandler,
    *,
    json_output: bool = True,
    database: bool = True,
) -> argparse.ArgumentParser:
    """Add a command. With ``database`` (the default) its handler is a Handler, called with a
    connected Broker; without, a LocalHandler, called with the arguments alone (no --dsn).
    ``json_output``: it takes --json (every command that prints a result; not those that run
    until stopped, whose output is progress and logs)."""
    sub = subcommands.add_parser(
        name, help=summary, description=summary, epilog="exit codes: see pgbroker --help"
    )
    # Accepted after the command too (`pgbroker list --dsn ...`), without resetting a value given
    # before it.
    add_global_options(sub, top_level=False, json_output=json_output, dsn_option=database)
    sub.set_defaults(handler=handler, needs_database=database)
    return sub


def add_group(subcommands: Subcommands, name: str, summary: str, *, metavar: str = "ACTION") -> Subcommands:
    """Add a command made of subcommands (``pgbroker dlq list``); returns where they go."""
    group = subcommands.add_parser(name, help=summary, description=summary)
    return group.add_subparsers(dest=f"{name}_action", metavar=metavar, required=True)


def add_service_options(parser: argparse.ArgumentParser) -> None:
    """The options of a long-running command: --loop, the event loop it runs on
    (pgbroker._event_loop), and --wait-for-database (cli.support.waiting)."""
    parser.add_argument(
        "--loop",
        choices=LOOP_NAMES,
        default=None,
        help=f"the event loop: uvloop when installed (auto), or asyncio's own (${LOOP_ENV}, else auto)",
    )
    parser.add_argument(
        "--wait-for-database",
        type=seconds,
        default=None,
        metavar="DURATION",
        help="at the start, wait this long at most for a database out of reach (down, starting up, "
        "in recovery, out of connection slots), trying again with pauses doubling to 10 s and a "
        "warning each try; 0: exit 5 at once (default: for ever). A refusal that stays (a wrong "
        "password, no such database) exits at once",
    )


def add_progress_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--progress",
        type=positive_seconds,
        nargs="?",
        const=5.0,
        metavar="DURATION",
        help=f"print {what} every DURATION (5s)",
    )
