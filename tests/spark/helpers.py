"""Helpers of the Spark tests: fill queues through the SQL API and look at their tables directly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

Conn = psycopg.Connection[tuple[Any, ...]]


def require_spark() -> None:
    """Skip, saying why, where Java or pyspark is missing."""
    from pgbroker.spark.requirements import MissingRequirement, check_java, check_python_packages

    try:
        check_python_packages()
        check_java()
    except MissingRequirement as exc:
        pytest.skip(f"Spark tests need pyspark, pyarrow and Java: {exc}")


def create(conn: Conn, *queues: str) -> None:
    for queue in queues:
        conn.execute("SELECT pgmq.create(%s)", (queue,))


def fill(conn: Conn, queue: str, count: int, *, start: int = 0) -> None:
    """``count`` messages {"n": start..start+count-1} in one statement, through the SQL API."""
    conn.execute(
        "SELECT count(*) FROM pgmq.send_batch(%s, ARRAY(SELECT jsonb_build_object('n', g)"
        " FROM generate_series(%s::int, %s::int) g ORDER BY g))",
        (queue, start, start + count - 1),
    )


def numbers(conn: Conn, table: str) -> list[int]:
    """The "n" of every message in pgmq.<table>, sorted (duplicates kept)."""
    rows = conn.execute(
        sql.SQL("SELECT (message->>'n')::int FROM pgmq.{} ORDER BY 1").format(sql.Identifier(table))
    ).fetchall()
    return [r[0] for r in rows]


def count(conn: Conn, table: str) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM pgmq.{}").format(sql.Identifier(table))).fetchone()
    assert row is not None
    return int(row[0])


def stream(
    spark: Any,
    dsn: str,
    source: str,
    target: str,
    checkpoint: Any,
    *,
    available_now: bool = True,
    trigger_seconds: float = 0.2,
    **options: str,
) -> Any:
    """Start a streaming query copying queue ``source`` to queue ``target`` through Spark."""
    df = (
        spark.readStream.format("pgbroker")
        .option("queue", source)
        .option("dsn", dsn)
        .options(**options)
        .load()
    )
    writer = (
        df.select("message", "headers")
        .writeStream.format("pgbroker")
        .option("queue", target)
        .option("dsn", dsn)
        .option("checkpointLocation", str(checkpoint))
    )
    if available_now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=f"{trigger_seconds} seconds").start()


def batch_sizes(query: Any) -> list[int]:
    return [int(p["numInputRows"]) for p in query.recentProgress if int(p["numInputRows"]) > 0]


def wait_for(condition: Any, timeout: float, what: str, *, query: Any = None) -> None:
    """Poll ``condition`` until it holds. With a streaming ``query``: fail as soon as the query
    stops (its exception in the message) rather than at the timeout, minutes later."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if query is not None and not query.isActive:
            raise AssertionError(f"the streaming query stopped while waiting for {what}: {query.exception()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


# Rows per micro-batch of the route job route_job starts.
BATCH = 10_000


def route_job(
    dsn: str, checkpoint: Path, *, follow: bool = False, mode: str = "log"
) -> subprocess.Popen[str]:
    """The route job, src to dst, reading in ``mode``; with ``follow``, --follow with a batch every
    half second."""
    # Its own process group: the kill takes the driver, its JVM and their Python workers at once,
    # as a crash of the driver's machine would.
    return subprocess.Popen(
        [sys.executable, "-m", "pgbroker.spark.jobs", "route", "src", "dst", "--dsn", dsn,
         "--checkpoint", str(checkpoint), "--max-rows-per-batch", str(BATCH), "--partitions", "2",
         "--master", "local[2]", "--conf", "spark.ui.enabled=false", "--mode", mode,
         *(["--follow", "--trigger-seconds", "0.5"] if follow else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )  # fmt: skip


class FollowingRoute:
    """The route job with --follow (route_job), its output gathered as it comes."""

    def __init__(self, dsn: str, checkpoint: Path, mode: str) -> None:
        self.process = route_job(dsn, checkpoint, follow=True, mode=mode)
        self._output: list[str] = []
        self._reader = threading.Thread(
            target=lambda: self._output.extend(self.process.stdout or []), daemon=True
        )
        self._reader.start()

    def said(self) -> str:
        return "".join(self._output)

    def restarts(self) -> list[str]:
        """The lines that say the job started its query again."""
        return [line for line in self.said().splitlines() if "pipeline.restarting" in line]

    def wait_until(self, done: Callable[[], bool], what: str, timeout: float = 600) -> None:
        """Poll ``done`` until it holds, failing at once (with the job's output) if the job ends."""
        deadline = time.monotonic() + timeout
        while not done():
            assert self.process.poll() is None, "the job ended:\n" + self.said()[-5000:]
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + self.said()[-5000:]
            time.sleep(0.05)

    def stop(self) -> None:
        """Ctrl-C: --follow stops after the current batch."""
        os.kill(self.process.pid, signal.SIGINT)
        self.process.wait(timeout=120)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._reader.join(timeout=10)


@contextmanager
def following_route(dsn: str, checkpoint: Path, mode: str = "log") -> Iterator[FollowingRoute]:
    """A FollowingRoute, killed (its whole process group) on leaving if it still runs."""
    job = FollowingRoute(dsn, checkpoint, mode)
    try:
        yield job
    finally:
        job.kill()
