"""What the pipeline jobs share: Spark and stream arguments, the source stream, progress output,
and errors turned into one message, a hint and an exit code (as the pgbroker CLI does).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from pgbroker._db.dsn import resolve_dsn
from pgbroker._durations import DURATION_FORMS, positive_seconds
from pgbroker.embedded import EmbeddedError
from pgbroker.errors import InvalidArgument, PgbrokerError, QueueNotFound
from pgbroker.spark.bounded import driver_answer_within
from pgbroker.spark.connect import CANNOT_CONNECT, connect, queue_table
from pgbroker.spark.requirements import MissingRequirement
from pgbroker.spark.sqlstate_marker import marked_sqlstate

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_QUEUE_NOT_FOUND = 4
EXIT_ENVIRONMENT = 5
EXIT_INTERRUPTED = 130


class JobFailed(PgbrokerError):
    """The Spark job (or streaming query) failed."""


# -- arguments ------------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def add_spark_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Spark and database")
    group.add_argument("--dsn", help="database (default: $DATABASE_URL, else pgbroker's embedded PostgreSQL)")
    group.add_argument(
        "--master",
        help="Spark master URL (default local[*]; under spark-submit, spark-submit's own --master)",
    )
    group.add_argument(
        "--conf",
        type=conf_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, repeatable (e.g. --conf spark.executor.memory=4g)",
    )
    group.add_argument(
        "--no-ship",
        action="store_true",
        help="do not ship pgbroker to the executors (they have it installed already)",
    )
    group.add_argument("-v", "--verbose", action="store_true", help="show tracebacks on errors")


def add_stream_arguments(parser: argparse.ArgumentParser, *, checkpoint_required: bool) -> None:
    group = parser.add_argument_group("reading the queue")
    group.add_argument(
        "--checkpoint",
        type=Path,
        required=checkpoint_required,
        help="Spark checkpoint directory: a restarted job resumes from it, exactly once",
    )
    group.add_argument(
        "--mode",
        choices=["log", "claim"],
        default="log",
        help="log: this job is the queue's only consumer (default); claim: share it with others",
    )
    group.add_argument(
        "--consumer", help="claim mode: this job's consumer name (default: the job and queues)"
    )
    group.add_argument(
        "--max-rows-per-batch",
        type=positive_int,
        default=100_000,
        metavar="N",
        help="micro-batch size (100000)",
    )
    group.add_argument(
        "--release",
        choices=["archive", "delete"],
        default="archive",
        help="what happens to a message once its batch is committed (archive)",
    )
    group.add_argument(
        "--partitions", type=positive_int, metavar="N", help="read tasks per batch (default: cores)"
    )
    group.add_argument(
        "--follow",
        action="store_true",
        help="keep running and process new messages as they come (default: drain what is there, then stop)",
    )
    group.add_argument(
        "--trigger-seconds",
        type=positive_seconds,
        default=1.0,
        metavar="DURATION",
        help=f"with --follow: a batch every DURATION, {DURATION_FORMS} (1)",
    )


# -- running --------------------------------------------------------------------------------------


def run_main(run: Callable[[argparse.Namespace], int], args: argparse.Namespace, prog: str) -> int:
    """Run a job; errors become one message, a hint and an exit code."""
    try:
        return run(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        code, message, hint = classify(exc)
        if getattr(args, "verbose", False) or (code == EXIT_FAILED and message.startswith("unexpected")):
            traceback.print_exc()
        print(f"{prog}: error: " + message.strip().replace("\n", "\n  "), file=sys.stderr)
        if hint:
            print(f"hint: {hint}", file=sys.stderr)
        return code


def classify(exc: BaseException) -> tuple[int, str, str | None]:
    if isinstance(exc, QueueNotFound):
        return EXIT_QUEUE_NOT_FOUND, exc.message, exc.hint
    if isinstance(exc, InvalidArgument):
        return EXIT_USAGE, exc.message, exc.hint
    if isinstance(exc, JobFailed):
        return EXIT_FAILED, exc.message, exc.hint
    if isinstance(exc, MissingRequirement | PgbrokerError):
        return EXIT_ENVIRONMENT, exc.message, exc.hint
    if isinstance(exc, EmbeddedError):
        return EXIT_ENVIRONMENT, str(exc), None
    found = spark_error(exc)
    if found is not None:
        return EXIT_FAILED, *found
    return EXIT_FAILED, f"unexpected {type(exc).__name__}: {exc}", "Run again with -v for the traceback."


# A pgbroker exception as Spark relays it from a Python worker: the traceback's last lines.
_RELAYED = re.compile(r"^(pgbroker\.[\w.]+|[\w.]*OptionError|[\w.]*SchemaMismatch): (.+)$", re.MULTILINE)
_PYTHON_ERROR = re.compile(r"^[\w.]*(?:Error|Exception): .+$", re.MULTILINE)


def spark_error(exc: BaseException) -> tuple[str, str | None] | None:
    """The message and hint of a pgbroker error inside a Spark exception, or Spark's own first line."""
    text = str(exc)
    if type(exc).__module__.startswith(("pyspark", "py4j")):
        found = _RELAYED.findall(text)
        if found:
            message = found[-1][1]
            after = text[text.rfind(message) + len(message) :]
            hint = re.match(r"\s*hint: (.+)", after)
            return message, hint[1].strip() if hint else None
        first = next((line for line in text.splitlines() if line.strip()), type(exc).__name__)
        # A Python error from a task (a --function that raised, say): its last traceback line.
        python = _PYTHON_ERROR.findall(text)
        detail = f"\n{python[-1].strip()}" if python else ""
        return f"Spark: {first.strip()}{detail}", "Run again with -v for Spark's full message."
    return None


# What a task or driver call of the data source raises when its connection broke or was refused.
_LOST_CONNECTION = ("pgbroker.errors.ConnectionLost", "pgbroker.errors.OutcomeUnknown")


def lost_connection(failed: JobFailed) -> bool:
    """Whether the Spark failure behind ``failed`` (watch's) is a connection of the data source
    that broke (a terminated session, a restart) or could not be made."""
    relayed = _relayed_error(failed)
    if relayed is None:
        return False
    name, message = relayed
    return name in _LOST_CONNECTION or message.startswith(CANNOT_CONNECT)


def relayed_sqlstate(failed: JobFailed) -> str | None:
    """The SQLSTATE of the database error behind ``failed`` (watch's), as the data source marked
    it (pgbroker.spark.sqlstate_marker); None for any other failure."""
    relayed = _relayed_error(failed)
    return None if relayed is None else marked_sqlstate(relayed[1])


def _relayed_error(failed: JobFailed) -> tuple[str, str] | None:
    """The class name and first message line of the pgbroker error Spark relayed last."""
    relayed: list[tuple[str, str]] = _RELAYED.findall(str(failed.__cause__ or ""))
    return relayed[-1] if relayed else None


def check_requirements() -> None:
    """pyspark, pyarrow and Java, checked before anything else: each names its fix."""
    from pgbroker.spark import requirements, session

    requirements.check_python_packages()
    if not session.under_spark_submit():
        requirements.check_java()


def database(args: argparse.Namespace) -> str:
    """The DSN the job's Spark tasks use (DATABASE_URL or the embedded cluster when none given)."""
    return resolve_dsn(args.dsn)


def check_queue(dsn: str, queue: str) -> None:
    """Fail before Spark starts (which takes seconds) when the queue does not exist."""
    with connect(dsn, role="job", answer_within=driver_answer_within()) as conn:
        queue_table(conn, queue)


def start_spark(args: argparse.Namespace, app_name: str) -> Any:
    from pgbroker.spark import session

    return session.start(app_name, master=args.master, conf=dict(args.conf), ship=not args.no_ship)


def read_stream(spark: Any, args: argparse.Namespace, dsn: str, queue: str, consumer: str) -> Any:
    """The queue as a streaming DataFrame, with the job's stream options."""
    reader = (
        spark.readStream.format("pgbroker")
        .option("queue", queue)
        .option("dsn", dsn)
        .option("mode", args.mode)
        .option("maxRowsPerBatch", str(args.max_rows_per_batch))
        .option("release", args.release)
    )
    if args.partitions:
        reader = reader.option("numPartitions", str(args.partitions))
    if args.mode == "claim":
        reader = reader.option("consumer", args.consumer or consumer)
    return reader.load()


def trigger(writer: Any, args: argparse.Namespace) -> Any:
    if args.follow:
        return writer.trigger(processingTime=f"{args.trigger_seconds} seconds")
    return writer.trigger(availableNow=True)


# -- progress -------------------------------------------------------------------------------------


def watch(query: Any, label: str, out: TextIO | None = None, poll: float = 0.5) -> int:
    """Print a line per micro-batch until the query ends; returns the number of rows processed.

    With --follow the query runs until interrupted (Ctrl-C), then stops after its current batch.
    """
    out = out or sys.stdout
    started = time.monotonic()
    seen = -1
    total = 0
    try:
        while True:
            finished = query.awaitTermination(poll)
            for progress in query.recentProgress:
                batch = progress["batchId"]
                if batch <= seen:
                    continue
                seen = batch
                rows = int(progress["numInputRows"])
                if rows == 0:
                    continue
                total += rows
                seconds = progress["durationMs"].get("triggerExecution", 0) / 1000
                rate = f", {rows / seconds:,.0f} msg/s" if seconds > 0 else ""
                print(
                    f"{label}: batch {batch}: {rows:,} messages in {seconds:.2f} s{rate}; {total:,} so far",
                    file=out,
                    flush=True,
                )
            if finished:
                break
    except KeyboardInterrupt:
        print(f"{label}: stopping after the current batch", file=out, flush=True)
        query.stop()
        raise
    except Exception as exc:
        found = spark_error(exc)
        if found is None:
            raise
        raise JobFailed(*found[:1], hint=found[1]) from exc
    elapsed = time.monotonic() - started
    rate = f" ({total / elapsed:,.0f} msg/s)" if elapsed > 0 and total else ""
    print(f"{label}: done: {total:,} messages in {elapsed:.1f} s{rate}", file=out, flush=True)
    return total


def job_main(
    run: Callable[[argparse.Namespace], int],
    build: Callable[[argparse.ArgumentParser], None],
    prog: str,
    description: str,
    argv: Sequence[str] | None = None,
) -> int:
    """Entry point of a job module (python -m, spark-submit)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    build(parser)
    return run_main(run, parser.parse_args(argv), prog)
