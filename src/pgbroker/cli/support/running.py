"""Running one command: parse, set up logging, connect if needed, and turn whatever it raised
into a message, a hint and an exit code."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import psycopg

from pgbroker._log_lines import LOG_FORMATS, chosen_format, say, set_up, writes_json
from pgbroker.cli.support.arguments import RoundedUp
from pgbroker.cli.support.connecting import connected, database_of, not_installed
from pgbroker.cli.support.errors import CliError, Exit, first_line
from pgbroker.cli.support.parsers import Handler, LocalHandler
from pgbroker.cli.support.waiting import until_reachable
from pgbroker.codecs.errors import CodecError
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
from pgbroker.runtime._signals import holding_stop_signals, release_stop_signals

# The server's words name an object ("permission denied for schema pgmq", "... for function
# queue_codec"): what the user can do about it is to change the role or its rights.
INSUFFICIENT_PRIVILEGE = "42501"
# Which role each kind of work takes: the hint named the consumer's first whatever the command,
# and a consumer refused a send was told to get the role it had.
NO_RIGHTS_HINT = (
    "This database role may not do that. Connect as the role that ran pgbroker install, or have it "
    "give yours the role for the work: GRANT pgbroker_KIND TO <role>, KIND being producer to send, "
    "consumer to read, ack and run workers, monitor for metrics and lists (roles made by pgbroker "
    "install --roles); or on some queues only: pgbroker grant KIND <role> --queue 'orders*' "
    "(docs/security.md)."
)


def execute(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse ``argv``, run the command it names and return the exit code."""
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return Exit.USAGE
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    try:
        args.log_format = chosen_format(args.log_format)
    except InvalidArgument as exc:
        print_error(str(exc), f"Unset it, or pass --log-format {' or '.join(LOG_FORMATS)}.")
        return Exit.USAGE
    set_up(level, args.log_format)
    _say_what_was_rounded(args)
    long_running = args.needs_database and "wait_for_database" in args
    if not long_running:
        release_stop_signals()  # blocked by the entry (pgbroker.cli.entry): Ctrl-C interrupts it
    try:
        if not args.needs_database:
            local: LocalHandler = args.handler
            return local(args)
        with ExitStack() as stack:
            if long_running:
                # A stop signal from the entry on (pgbroker.cli.entry) is a clean stop, whenever it came.
                stack.enter_context(holding_stop_signals())
            broker = _connect(args, stack)
            if broker is None:  # stopped while it waited for the database
                return Exit.OK
            handler: Handler = args.handler
            try:
                return handler(args, broker)
            except NotInstalled as exc:
                raise not_installed(exc, database_of(args.dsn, broker)) from exc
    except KeyboardInterrupt:
        say("interrupted", event="command.interrupted")
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


def _say_what_was_rounded(args: argparse.Namespace) -> None:
    """A remark for each duration kept in whole seconds that was given with a fraction (the
    engine keeps a delay, lease, retention or window in whole seconds; libpq its timeout)."""
    for dest, value in vars(args).items():
        if isinstance(value, RoundedUp):
            option = "--" + dest.replace("_", "-")  # each such option's dest is its name
            say(
                f"{option} {value.given} is kept as {int(value)} s: it takes whole seconds, a "
                "fraction rounded up",
                event="command.duration_rounded_up",
                option=option,
                given=value.given,
                seconds=int(value),
            )


def _connect(args: argparse.Namespace, stack: ExitStack) -> Broker | None:
    """The command's Broker, closed with ``stack``; a long-running command (one that takes
    --wait-for-database) waits for a database out of reach, and gets None if stopped meanwhile."""

    def connect() -> Broker:
        return stack.enter_context(connected(args.dsn, args.connect_timeout, args.pooler))

    if "wait_for_database" not in args:
        return connect()
    return until_reachable(connect, within=args.wait_for_database)


def classify(exc: Exception) -> tuple[int, str, str | None]:
    """The exit code, message and hint for an exception."""
    if isinstance(exc, CliError):
        return exc.code, exc.message, exc.hint
    if isinstance(exc, PgbrokerError):
        code = Exit.DATABASE
        if isinstance(exc, StaleReceipt):
            code = Exit.STALE_RECEIPT
        elif isinstance(exc, QueueNotFound | StreamNotFound | StreamGroupNotFound):
            code = Exit.NOT_FOUND
        elif isinstance(exc, InvalidQueueName | InvalidArgument | QueueNameConflict | CodecError):
            code = Exit.USAGE
        elif isinstance(exc, NotInstalled):
            return classify(not_installed(exc))
        elif exc.sqlstate == INSUFFICIENT_PRIVILEGE and not exc.hint:
            return code, exc.message, NO_RIGHTS_HINT
        return code, exc.message, exc.hint
    if isinstance(exc, EmbeddedError):
        # Its message already says how to fix it.
        return Exit.DATABASE, str(exc), None
    if isinstance(exc, psycopg.Error):
        # Outside a query (closing, or the connection dropping between statements).
        return Exit.DATABASE, first_line(str(exc)), None
    return Exit.UNEXPECTED, f"{type(exc).__name__}: {exc}", None


def print_error(message: str, hint: str | None) -> None:
    if writes_json():
        say(message.strip(), event="command.failed", level="error", hint=hint)
        return
    # Continuation lines (a server log tail, say) are indented so the first line stays greppable.
    print("pgbroker: error: " + message.strip().replace("\n", "\n  "), file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)


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
