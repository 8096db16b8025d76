"""What every ``pgbroker`` command shares: the exit codes, the global options, argument types,
the way a command is added, connecting, turning an exception into a message and an exit code,
and the JSON the commands read and write.

The command modules (pgbroker.cli.commands.queues, .messages, .worker, ...) import this package
(pgbroker.cli.support) and nothing else of pgbroker.cli; pgbroker.cli.main assembles them.

Exit codes (a shell script may rely on them):

  0   success (an empty read is a success with no output)
  1   not found or nothing done: drop of a missing queue, archive/delete of missing msg_ids,
      send with no input, ``db stop``/``db url`` when the cluster is not running, and
      ``db status`` when it is not running
  2   usage error or invalid input: bad option, bad JSON, malformed receipt, invalid queue name;
      also a command whose optional extra is not installed (``serve``: http, ``bridge``: bridge)
  3   stale receipt: the lease ran out or the message was redelivered, so the ack changed nothing
  4   queue not found
  5   database unreachable, refused the operation, or pgbroker not installed (``pgbroker install``)
  6   a broker (``bridge``: RabbitMQ, Redis, NATS, MQTT, SQS): unreachable, login refused, or an
      exchange, queue or stream missing
  70  unexpected error (a bug: please report it with the output of ``-v``)
  130 interrupted (Ctrl-C)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from enum import IntEnum
from typing import Any, TypeAlias, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgbroker._db.dsn import connection_kwargs, resolve_dsn
from pgbroker._db.listen import conninfo_of
from pgbroker.codecs.errors import CodecError
from pgbroker.codecs.json_view import json_view
from pgbroker.embedded import EmbeddedError
from pgbroker.errors import (
    InvalidArgument,
    InvalidQueueName,
    NotInstalled,
    PgbrokerError,
    QueueNameConflict,
    QueueNotFound,
    StaleReceipt,
    StreamGroupNotFound,
    StreamNotFound,
)
from pgbroker.queues._client import Broker
from pgbroker.queues._records import Message


class Exit(IntEnum):
    """The exit codes, as listed above and in EPILOG."""

    OK = 0
    NOTHING_DONE = 1
    USAGE = 2
    STALE_RECEIPT = 3
    QUEUE_NOT_FOUND = 4
    DATABASE = 5
    AMQP = 6
    UNEXPECTED = 70
    INTERRUPTED = 130


EPILOG = """\
exit codes:
  0   success (an empty read is a success with no output)
  1   not found or nothing done (drop of a missing queue, archive/delete of a
      missing msg_id, send with no input, embedded cluster not running)
  2   usage error or invalid input (bad JSON, malformed receipt, bad queue name),
      or the command's optional extra not installed
  3   stale receipt: the ack changed nothing
  4   queue not found
  5   database unreachable, refused the operation, or pgbroker not installed
  6   a broker (bridge) unreachable, login refused, or an exchange, queue or stream missing
  70  unexpected error (run again with -v and report it)

The database is --dsn, else $DATABASE_URL, else pgbroker's embedded PostgreSQL
(started on first use; see `pgbroker db status`).
"""

# How log lines look, in the command and in the worker processes it starts.
LOG_FORMAT = "pgbroker: %(message)s"
NO_QUEUES = "no queues (create one with: pgbroker create NAME)"
# Connecting to a host that drops packets would otherwise hang for minutes.
CONNECT_TIMEOUT_SECONDS = 10

# A command that works on the database gets a Broker; one that does not (db, pipeline) only its
# arguments.
Handler = Callable[[argparse.Namespace, Broker], int]
LocalHandler = Callable[[argparse.Namespace], int]
# What add_subparsers returns; a string, as argparse does not subscript it at run time.
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

T = TypeVar("T")


class CliError(Exception):
    """A failure the CLI reports as one message, a hint and an exit code."""

    def __init__(self, message: str, *, code: int, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.hint = hint


# -- argument types -------------------------------------------------------------------------------


def _converted(text: str, convert: Callable[[str], T], expected: str) -> T:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _converted(text, int, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def whole_seconds(text: str) -> int:
    value = _converted(text, int, "whole seconds")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {value}")
    return value


def seconds(text: str) -> float:
    value = _converted(text, float, "seconds")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def msg_id(text: str) -> int:
    return _converted(text, int, "a msg_id (a whole number)")


def whole(text: str) -> int:
    if not re.fullmatch(r"\s*\d+\s*", text):
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> int:
    """Whole seconds from '90', '90s', '15m', '12h' or '7d'."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a duration such as 30s, 15m, 12h or 7d, got {text!r}")
    return int(match[1]) * DURATION_UNITS[match[2]]


# -- adding commands ------------------------------------------------------------------------------


def new_parser() -> tuple[argparse.ArgumentParser, Subcommands]:
    """pgbroker's top-level parser, and the subparsers the command modules add their commands to."""
    parser = argparse.ArgumentParser(
        prog="pgbroker",
        description="Queues inside PostgreSQL (pgmq-compatible), with fenced acks.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_global_options(parser, top_level=True)
    return parser, parser.add_subparsers(dest="command", metavar="COMMAND")


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
    json_output: bool = False,
    database: bool = True,
) -> argparse.ArgumentParser:
    """Add a command. With ``database`` (the default) its handler is a Handler, called with a
    connected Broker; without, a LocalHandler, called with the arguments alone (no --dsn)."""
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


def add_progress_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--progress",
        type=seconds,
        nargs="?",
        const=5.0,
        metavar="SECONDS",
        help=f"print {what} every SECONDS (5)",
    )


# -- running --------------------------------------------------------------------------------------


def execute(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse ``argv``, run the command it names and return the exit code."""
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return Exit.USAGE
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)
    try:
        if not args.needs_database:
            local: LocalHandler = args.handler
            return local(args)
        with connected(args.dsn) as broker:
            handler: Handler = args.handler
            return handler(args, broker)
    except KeyboardInterrupt:
        print("pgbroker: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`pgbroker read q --qty 100 | head -1`): not worth a message, but
        # the interpreter's final flush must not fail again on the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13
    except Exception as exc:
        code, message, hint = classify(exc)
        if args.verbose:
            traceback.print_exc()
        elif code == Exit.UNEXPECTED:
            hint = "This is a bug in pgbroker; run again with -v and report the traceback."
        print_error(message, hint)
        return code


def classify(exc: Exception) -> tuple[int, str, str | None]:
    """The exit code, message and hint for an exception."""
    if isinstance(exc, CliError):
        return exc.code, exc.message, exc.hint
    if isinstance(exc, PgbrokerError):
        code = Exit.DATABASE
        if isinstance(exc, StaleReceipt):
            code = Exit.STALE_RECEIPT
        elif isinstance(exc, QueueNotFound | StreamNotFound | StreamGroupNotFound):
            code = Exit.QUEUE_NOT_FOUND
        elif isinstance(exc, InvalidQueueName | InvalidArgument | QueueNameConflict | CodecError):
            code = Exit.USAGE
        elif isinstance(exc, NotInstalled):
            message = f"pgbroker is not installed in this database ({exc.message})"
            return code, message, "Install the schema first: pgbroker install"
        return code, exc.message, exc.hint
    if isinstance(exc, EmbeddedError):
        # Its message already says how to fix it.
        return Exit.DATABASE, str(exc), None
    if isinstance(exc, psycopg.Error):
        # Outside a query (closing, or the connection dropping between statements).
        return Exit.DATABASE, _first_line(str(exc)), None
    return Exit.UNEXPECTED, f"{type(exc).__name__}: {exc}", None


def print_error(message: str, hint: str | None) -> None:
    # Continuation lines (a server log tail, say) are indented so the first line stays greppable.
    print("pgbroker: error: " + message.strip().replace("\n", "\n  "), file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "(no message)"


@contextmanager
def connected(dsn: str | None) -> Iterator[Broker]:
    """A Broker on one autocommit connection: a CLI call runs a few statements, then exits."""
    resolved = resolve_dsn(dsn)
    try:
        options = conninfo_to_dict(resolved)
    except psycopg.ProgrammingError as exc:
        raise CliError(
            f"invalid DSN: {_first_line(str(exc))}",
            code=Exit.USAGE,
            hint="Use a URL (postgresql://user@host:5432/db) or key=value pairs (host=... dbname=...).",
        ) from exc
    extra: dict[str, Any] = connection_kwargs()
    if "connect_timeout" not in options and "PGCONNECT_TIMEOUT" not in os.environ:
        extra["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    if "application_name" not in options and "PGAPPNAME" not in os.environ:
        extra["application_name"] = "pgbroker-cli"
    try:
        conn = psycopg.connect(resolved, autocommit=True, **extra)
    except psycopg.OperationalError as exc:
        raise CliError(
            f"cannot connect to the database: {_first_line(str(exc))}",
            code=Exit.DATABASE,
            hint="Is the server running? Check --dsn or DATABASE_URL "
            "(with neither, pgbroker uses its embedded PostgreSQL).",
        ) from exc
    with conn:
        yield Broker(connection=conn)


@contextmanager
def needs_extra(extra: str) -> Iterator[None]:
    """Around the imports of a command that needs an optional extra (http, bridge): a missing
    dependency becomes an error that says what to install, not a traceback."""
    try:
        yield
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "pgbroker":
            raise  # pgbroker's own module missing: a broken install, not a missing extra
        raise missing_extra(extra, exc.name) from exc


def missing_extra(extra: str, package: str | None) -> CliError:
    """The usage error of a command whose optional extra is not installed."""
    return CliError(
        f"this command needs pgbroker's {extra} extra ({package} is not installed)",
        code=Exit.USAGE,
        hint=f"Install it: pip install 'pgbroker[{extra}]'",
    )


def dsn_of(broker: Broker) -> str:
    """The conninfo the broker's connection used, for a command that opens its own pool (a
    server, a worker, a bridge) on the same database."""
    with broker.connection() as conn:
        return conninfo_of(conn.info)


# -- output ---------------------------------------------------------------------------------------


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


# -- JSON input -----------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads(text: str) -> Any:
    # json accepts NaN and Infinity, which PostgreSQL's jsonb rejects: refuse them here, where
    # the line number is known.
    return json.loads(text, parse_constant=_reject_constant)


def json_problem(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at column {exc.colno}"
    return str(exc)


def json_argument(text: str, what: str) -> Any:
    try:
        return loads(text)
    except ValueError as exc:
        raise CliError(
            f"{what} is not valid JSON ({json_problem(exc)})",
            code=Exit.USAGE,
            hint="Quote it for the shell, for example '{\"order\": 1}' or '\"text\"'.",
        ) from None
