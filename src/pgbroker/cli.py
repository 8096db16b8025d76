"""The ``pgbroker`` command: manage queues, send, read and acknowledge messages, run the embedded
PostgreSQL, all from a shell.

Commands that print data print it plainly, one item per line (msg_ids, JSON lines, a DSN), so
that they compose with pipes; commands that change things print one sentence. Errors go to
stderr as ``pgbroker: error: <message>`` and usually a ``hint:`` line; ``-v`` adds the traceback.

Exit codes (a shell script may rely on them):

  0   success (an empty read is a success with no output)
  1   not found or nothing done: drop of a missing queue, archive/delete of missing msg_ids,
      send with no input, ``db stop``/``db url`` when the cluster is not running, and
      ``db status`` when it is not running
  2   usage error or invalid input: bad option, bad JSON, malformed receipt, invalid queue name
  3   stale receipt: the lease ran out or the message was redelivered, so the ack changed nothing
  4   queue not found
  5   database unreachable, refused the operation, or pgbroker not installed (``pgbroker install``)
  6   RabbitMQ (``bridge``): unreachable, login refused, or an exchange or queue missing
  70  unexpected error (a bug: please report it with the output of ``-v``)
  130 interrupted (Ctrl-C)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgbroker.client import Broker
from pgbroker.dsn import resolve_dsn
from pgbroker.embedded import EmbeddedError, EmbeddedPostgres
from pgbroker.errors import (
    InvalidArgument,
    InvalidQueueName,
    NotInstalled,
    PgbrokerError,
    QueueNameConflict,
    QueueNotFound,
    StaleReceipt,
)
from pgbroker.install import install_roles
from pgbroker.models import Message, Metrics, QueueInfo, Receipt

EXIT_OK = 0
EXIT_NOTHING_DONE = 1
EXIT_USAGE = 2
EXIT_STALE_RECEIPT = 3
EXIT_QUEUE_NOT_FOUND = 4
EXIT_DATABASE = 5
EXIT_AMQP = 6
EXIT_UNEXPECTED = 70
EXIT_INTERRUPTED = 130

EPILOG = """\
exit codes:
  0   success (an empty read is a success with no output)
  1   not found or nothing done (drop of a missing queue, archive/delete of a
      missing msg_id, send with no input, embedded cluster not running)
  2   usage error or invalid input (bad JSON, malformed receipt, bad queue name)
  3   stale receipt: the ack changed nothing
  4   queue not found
  5   database unreachable, refused the operation, or pgbroker not installed
  6   RabbitMQ unreachable, login refused, or an exchange or queue missing
  70  unexpected error (run again with -v and report it)

The database is --dsn, else $DATABASE_URL, else pgbroker's embedded PostgreSQL
(started on first use; see `pgbroker db status`).
"""

# Connecting to a host that drops packets would otherwise hang for minutes.
CONNECT_TIMEOUT_SECONDS = 10

Handler = Callable[[argparse.Namespace, Broker], int]


class CliError(Exception):
    """A failure the CLI reports as one message, a hint and an exit code."""

    def __init__(self, message: str, *, code: int, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.hint = hint


# -- argument types -------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _whole_seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def _msg_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a msg_id (a whole number), got {text!r}") from None


# -- the parser -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgbroker",
        description="Queues inside PostgreSQL (pgmq-compatible), with fenced acks.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_global_options(parser, top_level=True)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(
        name: str, summary: str, handler: Handler | None, *, json_output: bool = False, database: bool = True
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name,
            help=summary,
            description=summary,
            epilog="exit codes: see pgbroker --help",
        )
        # Accepted after the command too (`pgbroker list --dsn ...`), without resetting a value
        # given before it.
        _add_global_options(sub, top_level=False, json_output=json_output, dsn_option=database)
        sub.set_defaults(handler=handler)
        return sub

    sub = command("install", "install or upgrade the pgbroker schema (idempotent)", _cmd_install)
    sub.add_argument(
        "--roles",
        action="store_true",
        help="also create the least-privilege roles PREFIX_producer, PREFIX_consumer, PREFIX_monitor",
    )
    sub.add_argument(
        "--role-prefix", default="pgbroker", metavar="PREFIX", help="prefix of the roles' names (pgbroker)"
    )

    sub = command("create", "create a queue (idempotent)", _cmd_create)
    sub.add_argument("name", help="queue name")
    sub.add_argument("--unlogged", action="store_true", help="faster, but emptied by a server crash")

    sub = command("drop", "drop a queue and its archive", _cmd_drop)
    sub.add_argument("name", help="queue name")

    command("list", "list the queues", _cmd_list, json_output=True)

    sub = command("send", "send a JSON message, or JSON lines from stdin", _cmd_send)
    sub.add_argument("name", help="queue name")
    sub.add_argument("message", nargs="?", help="the message as JSON; without it, one message per stdin line")
    sub.add_argument("--headers", metavar="JSON", help="headers for every message sent, a JSON object")
    sub.add_argument("--delay", type=_whole_seconds, metavar="SECONDS", help="invisible for this long")
    sub.add_argument(
        "--batch-size", type=_positive_int, default=500, metavar="N", help="stdin lines per statement (500)"
    )

    sub = command("read", "lease messages; prints JSON lines with receipts", _cmd_read)
    sub.add_argument("name", help="queue name")
    sub.add_argument("--vt", type=_whole_seconds, default=30, metavar="SECONDS", help="lease length (30)")
    sub.add_argument("--qty", type=_positive_int, default=1, metavar="N", help="at most this many (1)")
    sub.add_argument("--wait", type=_seconds, default=0.0, metavar="SECONDS", help="wait for messages (0)")

    sub = command("pop", "read and delete messages at once (at most once)", _cmd_pop)
    sub.add_argument("name", help="queue name")
    sub.add_argument("--qty", type=_positive_int, default=1, metavar="N", help="at most this many (1)")

    sub = command("ack", "acknowledge read messages by receipt (archives them)", _cmd_ack)
    sub.add_argument("name", help="queue name")
    sub.add_argument("receipts", nargs="+", metavar="RECEIPT", help="receipts as printed by read")
    sub.add_argument("--delete", action="store_true", help="delete instead of archiving")

    sub = command("archive", "move messages to the archive by msg_id (unfenced)", _cmd_archive)
    sub.add_argument("name", help="queue name")
    sub.add_argument("msg_ids", nargs="+", type=_msg_id, metavar="MSG_ID")

    sub = command("delete", "delete messages by msg_id (unfenced)", _cmd_delete)
    sub.add_argument("name", help="queue name")
    sub.add_argument("msg_ids", nargs="+", type=_msg_id, metavar="MSG_ID")

    sub = command("purge", "delete every message of a queue (not its archive)", _cmd_purge)
    sub.add_argument("name", help="queue name")
    sub.add_argument("--yes", action="store_true", help="confirm: purge cannot be undone")

    sub = command("metrics", "queue lengths and ages", _cmd_metrics, json_output=True)
    sub.add_argument("name", nargs="?", help="one queue (default: all)")

    sub = command("db", "the embedded PostgreSQL cluster", None, json_output=True, database=False)
    sub.add_argument(
        "action",
        choices=["start", "stop", "status", "url"],
        help="start it, stop it, show its status, or print its DSN (for DATABASE_URL)",
    )
    sub.add_argument("--data-dir", type=Path, metavar="DIR", help="the cluster's data directory")

    # The jobs parse their own arguments (pgbroker.spark.jobs); -h is handed over to them too.
    summary = "data pipeline jobs on Spark: drain, route, archive-report (see pgbroker pipeline -h)"
    sub = commands.add_parser("pipeline", help=summary, description=summary, add_help=False)
    sub.add_argument("-h", "--help", action="store_true", dest="pipeline_help", help="show the jobs' help")
    sub.add_argument("job_args", nargs=argparse.REMAINDER, metavar="JOB ...", help="a job and its arguments")

    # Commands of other modules; imported here because they import this module's helpers.
    from pgbroker import cli_bridge, cli_keys, cli_serve, cli_worker

    cli_worker.register(commands)
    cli_bridge.register(commands)
    cli_keys.register(commands)
    cli_serve.register(commands)
    return parser


def _add_global_options(
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


# -- running --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="pgbroker: %(message)s", stream=sys.stderr)
    try:
        if args.command == "db":
            return _cmd_db(args)
        if args.command == "pipeline":
            return _cmd_pipeline(args)
        with _connected(args.dsn) as broker:
            handler: Handler = args.handler
            return handler(args, broker)
    except KeyboardInterrupt:
        print("pgbroker: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`pgbroker read q --qty 100 | head -1`): not worth a message, but
        # the interpreter's final flush must not fail again on the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13
    except Exception as exc:
        code, message, hint = _classify(exc)
        if args.verbose:
            traceback.print_exc()
        elif code == EXIT_UNEXPECTED:
            hint = "This is a bug in pgbroker; run again with -v and report the traceback."
        _print_error(message, hint)
        return code


def _classify(exc: Exception) -> tuple[int, str, str | None]:
    """The exit code, message and hint for an exception."""
    if isinstance(exc, CliError):
        return exc.code, exc.message, exc.hint
    if isinstance(exc, PgbrokerError):
        code = EXIT_DATABASE
        if isinstance(exc, StaleReceipt):
            code = EXIT_STALE_RECEIPT
        elif isinstance(exc, QueueNotFound):
            code = EXIT_QUEUE_NOT_FOUND
        elif isinstance(exc, InvalidQueueName | InvalidArgument | QueueNameConflict):
            code = EXIT_USAGE
        elif isinstance(exc, NotInstalled):
            message = f"pgbroker is not installed in this database ({exc.message})"
            return code, message, "Install the schema first: pgbroker install"
        return code, exc.message, exc.hint
    if isinstance(exc, EmbeddedError):
        # Its message already says how to fix it.
        return EXIT_DATABASE, str(exc), None
    if isinstance(exc, psycopg.Error):
        # Outside a query (closing, or the connection dropping between statements).
        return EXIT_DATABASE, _first_line(str(exc)), None
    return EXIT_UNEXPECTED, f"{type(exc).__name__}: {exc}", None


def _print_error(message: str, hint: str | None) -> None:
    # Continuation lines (a server log tail, say) are indented so the first line stays greppable.
    print("pgbroker: error: " + message.strip().replace("\n", "\n  "), file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "(no message)"


@contextmanager
def _connected(dsn: str | None) -> Iterator[Broker]:
    """A Broker on one autocommit connection: a CLI call runs a few statements, then exits."""
    resolved = resolve_dsn(dsn)
    try:
        options = conninfo_to_dict(resolved)
    except psycopg.ProgrammingError as exc:
        raise CliError(
            f"invalid DSN: {_first_line(str(exc))}",
            code=EXIT_USAGE,
            hint="Use a URL (postgresql://user@host:5432/db) or key=value pairs (host=... dbname=...).",
        ) from exc
    extra: dict[str, Any] = {}
    if "connect_timeout" not in options and "PGCONNECT_TIMEOUT" not in os.environ:
        extra["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    if "application_name" not in options and "PGAPPNAME" not in os.environ:
        extra["application_name"] = "pgbroker-cli"
    try:
        conn = psycopg.connect(resolved, autocommit=True, **extra)
    except psycopg.OperationalError as exc:
        raise CliError(
            f"cannot connect to the database: {_first_line(str(exc))}",
            code=EXIT_DATABASE,
            hint="Is the server running? Check --dsn or DATABASE_URL "
            "(with neither, pgbroker uses its embedded PostgreSQL).",
        ) from exc
    with conn:
        yield Broker(connection=conn)


# -- queue management -----------------------------------------------------------------------------


def _cmd_install(args: argparse.Namespace, broker: Broker) -> int:
    result = broker.install()
    if not result.changed:
        print(f"already at version {result.version}")
    elif result.previous_version == 0:
        print(f"installed version {result.version} (was not installed)")
    else:
        print(f"installed version {result.version} (was {result.previous_version})")
    if args.roles:
        with broker.connection() as conn:
            granted = install_roles(conn, args.role_prefix)
        for role, functions in granted.items():
            print(f"role {role}: execute on {functions} functions, no table privileges")
    return EXIT_OK


def _cmd_create(args: argparse.Namespace, broker: Broker) -> int:
    existing = {info.queue_name: info for info in broker.list_queues()}.get(args.name)
    broker.create_queue(args.name, unlogged=args.unlogged)
    if existing is None:
        print(f'created {"unlogged " if args.unlogged else ""}queue "{args.name}"')
    elif args.unlogged and not existing.is_unlogged:
        print(f'queue "{args.name}" already exists as a logged queue; --unlogged changed nothing')
    else:
        print(f'queue "{args.name}" already exists')
    return EXIT_OK


def _cmd_drop(args: argparse.Namespace, broker: Broker) -> int:
    if not broker.drop_queue(args.name):
        raise CliError(
            f'queue "{args.name}" does not exist; nothing dropped',
            code=EXIT_NOTHING_DONE,
            hint="See the queues with: pgbroker list",
        )
    print(f'dropped queue "{args.name}" and its archive')
    return EXIT_OK


def _cmd_list(args: argparse.Namespace, broker: Broker) -> int:
    queues = broker.list_queues()
    if args.json:
        print(json.dumps([_queue_info_json(info) for info in queues], indent=2))
    elif not queues:
        print("no queues (create one with: pgbroker create NAME)")
    else:
        rows = [[info.queue_name, _storage(info), _timestamp(info.created_at)] for info in queues]
        print(_table(["QUEUE", "STORAGE", "CREATED"], rows))
    return EXIT_OK


def _storage(info: QueueInfo) -> str:
    kind = "unlogged" if info.is_unlogged else "logged"
    return f"{kind}, partitioned" if info.is_partitioned else kind


def _cmd_purge(args: argparse.Namespace, broker: Broker) -> int:
    if not args.yes:
        raise CliError(
            f'purge deletes every message in queue "{args.name}" and cannot be undone',
            code=EXIT_USAGE,
            hint=f"Confirm with: pgbroker purge {args.name} --yes",
        )
    purged = broker.queue(args.name).purge()
    print(f'purged {purged} message{"" if purged == 1 else "s"} from queue "{args.name}"')
    return EXIT_OK


def _cmd_metrics(args: argparse.Namespace, broker: Broker) -> int:
    if args.name is not None:
        single = broker.metrics(args.name)
        if args.json:
            print(json.dumps(_metrics_json(single), indent=2))
            return EXIT_OK
        rows = [single]
    else:
        rows = broker.metrics_all()
        if args.json:
            print(json.dumps([_metrics_json(m) for m in rows], indent=2))
            return EXIT_OK
    if not rows:
        print("no queues (create one with: pgbroker create NAME)")
    else:
        print(metrics_table(rows))
    return EXIT_OK


def metrics_table(metrics: Sequence[Metrics]) -> str:
    """An aligned table of queue metrics, as `pgbroker metrics` prints it."""
    rows = [
        [
            m.queue_name,
            f"{m.queue_length:,}",
            f"{m.queue_visible_length:,}",
            _age(m.oldest_msg_age_sec),
            _age(m.newest_msg_age_sec),
            f"{m.total_messages:,}",
        ]
        for m in metrics
    ]
    header = ["QUEUE", "LENGTH", "VISIBLE", "OLDEST", "NEWEST", "TOTAL SENT"]
    return _table(header, rows, right_aligned=range(1, len(header)))


# -- messages -------------------------------------------------------------------------------------


def _cmd_send(args: argparse.Namespace, broker: Broker) -> int:
    queue = broker.queue(args.name)
    headers: dict[str, Any] | None = None
    if args.headers is not None:
        parsed = _json_argument(args.headers, "--headers")
        if not isinstance(parsed, dict):
            raise CliError(
                '--headers must be a JSON object, for example \'{"source": "cli"}\'', code=EXIT_USAGE
            )
        headers = parsed
    if args.message is not None:
        print(queue.send(_json_argument(args.message, "the message"), headers=headers, delay=args.delay))
        return EXIT_OK

    def send_batch(batch: list[Any]) -> int:
        ids = queue.send_many(
            batch, headers=None if headers is None else [headers] * len(batch), delay=args.delay
        )
        # Flushed per batch so a consumer of our output sees progress on a long stream.
        print("\n".join(map(str, ids)), flush=True)
        return len(ids)

    if sys.stdin.isatty():
        print("pgbroker: reading one JSON message per line; end with Ctrl-D", file=sys.stderr)
    sent = _send_lines(sys.stdin, args.batch_size, send_batch)
    if sent == 0:
        raise CliError(
            "no messages on stdin; nothing sent",
            code=EXIT_NOTHING_DONE,
            hint="Pass a message as an argument, or one JSON value per line on stdin.",
        )
    return EXIT_OK


def _send_lines(stream: TextIO, batch_size: int, send_batch: Callable[[list[Any]], int]) -> int:
    """Send the JSON lines of ``stream`` in batches; return how many were sent.

    Each batch is parsed whole before it is sent, so a bad line stops the run with nothing of
    its batch sent and every earlier batch sent: the output (the msg_ids) says exactly how far
    it got.
    """
    sent = 0
    batch: list[Any] = []
    batch_start = 0
    for line_no, line in enumerate(stream, 1):
        if not line.strip():
            continue
        if not batch:
            batch_start = line_no
        try:
            batch.append(_loads(line))
        except ValueError as exc:
            raise CliError(
                f"line {line_no} is not valid JSON ({_json_problem(exc)}): nothing from line "
                f"{batch_start} on was sent ({sent} message{'' if sent == 1 else 's'} before it were)",
                code=EXIT_USAGE,
                hint='Give one JSON value per line, for example {"order": 1}.',
            ) from None
        if len(batch) == batch_size:
            sent += send_batch(batch)
            batch = []
    if batch:
        sent += send_batch(batch)
    return sent


def _cmd_read(args: argparse.Namespace, broker: Broker) -> int:
    for message in broker.queue(args.name).read_many(args.qty, vt=args.vt, wait=args.wait):
        print(message_json(message))
    return EXIT_OK


def _cmd_pop(args: argparse.Namespace, broker: Broker) -> int:
    for message in broker.queue(args.name).pop_many(args.qty):
        print(message_json(message))
    return EXIT_OK


def _cmd_ack(args: argparse.Namespace, broker: Broker) -> int:
    receipts = [Receipt.parse(token) for token in args.receipts]
    queue = broker.queue(args.name)
    archive = not args.delete
    acked = set(queue.ack_many(receipts, archive=archive))
    stale: list[StaleReceipt] = []
    for receipt in receipts:
        if receipt.msg_id in acked:
            continue
        # The batch form only skips a stale receipt; the single form says why it is stale.
        try:
            queue.ack(receipt, archive=archive)
        except StaleReceipt as exc:
            stale.append(exc)
        else:
            acked.add(receipt.msg_id)
    for msg_id in dict.fromkeys(r.msg_id for r in receipts if r.msg_id in acked):
        print(msg_id)
    if not stale:
        return EXIT_OK
    for error in stale[:-1]:
        _print_error(error.message, None)
    raise CliError(stale[-1].message, code=EXIT_STALE_RECEIPT, hint=stale[-1].hint)


def _cmd_archive(args: argparse.Namespace, broker: Broker) -> int:
    return _by_msg_id(args, broker.queue(args.name).archive_many)


def _cmd_delete(args: argparse.Namespace, broker: Broker) -> int:
    return _by_msg_id(args, broker.queue(args.name).delete_many)


def _by_msg_id(args: argparse.Namespace, operation: Callable[[list[int]], list[int]]) -> int:
    wanted = list(dict.fromkeys(args.msg_ids))
    done = set(operation(wanted))
    for msg_id in wanted:
        if msg_id in done:
            print(msg_id)
    missing = [str(msg_id) for msg_id in wanted if msg_id not in done]
    if missing:
        raise CliError(
            f'no message {", ".join(missing)} in queue "{args.name}"',
            code=EXIT_NOTHING_DONE,
            hint="It was never sent, or was already deleted, archived, acknowledged or popped.",
        )
    return EXIT_OK


# -- the embedded cluster -------------------------------------------------------------------------


def _cmd_db(args: argparse.Namespace) -> int:
    cluster = EmbeddedPostgres(args.data_dir)
    if args.action == "start":
        was_running = cluster.status().running
        dsn = cluster.start()
        status = cluster.status()
        verb = "already running" if was_running else "started"
        print(f"embedded PostgreSQL {status.server_version} {verb} in {status.data_dir} (pid {status.pid})")
        print(f"dsn: {dsn}")
        return EXIT_OK
    if args.action == "stop":
        if not cluster.stop():
            raise CliError(
                f"embedded PostgreSQL in {cluster.data_dir} is not running; nothing stopped",
                code=EXIT_NOTHING_DONE,
            )
        print(f"stopped embedded PostgreSQL in {cluster.data_dir}")
        return EXIT_OK
    if args.action == "url":
        status = cluster.status()
        if status.dsn is None:
            raise CliError(
                f"embedded PostgreSQL in {cluster.data_dir} is not running",
                code=EXIT_NOTHING_DONE,
                hint="Start it first: pgbroker db start",
            )
        print(status.dsn)
        return EXIT_OK
    status = cluster.status()
    if args.json:
        print(json.dumps(asdict(status), default=str, indent=2))
    else:
        fields = {
            "running": "yes" if status.running else "no",
            "data dir": str(status.data_dir),
            "pid": status.pid,
            "dsn": status.dsn,
            "server version": status.server_version,
            "binaries": status.bin_dir,
        }
        print("\n".join(f"{k + ':':<16}{'-' if v is None else v}" for k, v in fields.items()))
    # Like `pg_ctl status`, the exit code answers "is it running?" for scripts.
    return EXIT_OK if status.running else EXIT_NOTHING_DONE


# -- the data pipeline ----------------------------------------------------------------------------


def _cmd_pipeline(args: argparse.Namespace) -> int:
    # Imported here: the jobs need the spark extra, which the rest of the CLI does without.
    from pgbroker.spark.jobs import main as pipeline_main

    job_args = list(args.job_args)
    if args.pipeline_help or not job_args:
        job_args.insert(0, "--help")
    elif args.dsn and "--dsn" not in job_args:
        job_args += ["--dsn", args.dsn]
    if args.verbose and job_args[0] != "--help":
        job_args.append("-v")
    try:
        return pipeline_main(job_args, prog="pgbroker pipeline")
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


# -- formatting -----------------------------------------------------------------------------------


def message_json(message: Message) -> str:
    """One message as a JSON line; ``receipt`` is what `pgbroker ack` needs (null when popped)."""
    return json.dumps(
        {
            "msg_id": message.msg_id,
            "read_ct": message.read_ct,
            "enqueued_at": message.enqueued_at.isoformat(),
            "last_read_at": message.last_read_at.isoformat() if message.last_read_at else None,
            "vt": message.vt.isoformat(),
            "message": message.message,
            "headers": message.headers,
            "receipt": str(message.receipt) if message.receipt else None,
        },
        ensure_ascii=False,
    )


def _queue_info_json(info: QueueInfo) -> dict[str, Any]:
    return {**asdict(info), "created_at": info.created_at.isoformat()}


def _metrics_json(metrics: Metrics) -> dict[str, Any]:
    return {**asdict(metrics), "scrape_time": metrics.scrape_time.isoformat()}


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right_aligned: Sequence[int] = ()) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if i in right_aligned else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join(line(row) for row in [header, *rows])


def _age(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _timestamp(value: datetime) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


# -- JSON input -----------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _loads(text: str) -> Any:
    # json accepts NaN and Infinity, which PostgreSQL's jsonb rejects: refuse them here, where
    # the line number is known.
    return json.loads(text, parse_constant=_reject_constant)


def _json_problem(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at column {exc.colno}"
    return str(exc)


def _json_argument(text: str, what: str) -> Any:
    try:
        return _loads(text)
    except ValueError as exc:
        raise CliError(
            f"{what} is not valid JSON ({_json_problem(exc)})",
            code=EXIT_USAGE,
            hint="Quote it for the shell, for example '{\"order\": 1}' or '\"text\"'.",
        ) from None


if __name__ == "__main__":
    # Run the pgbroker.cli the command modules import, not this __main__ copy of it: one module,
    # one CliError class for main() to recognise.
    from pgbroker.cli import main as _main

    sys.exit(_main())
