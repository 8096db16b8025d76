"""A --follow pipeline across a failover, exactly once: a streaming route job (micro-batches of
10,000) on a multi-host DSN with target_session_attrs=read-write (tests/support/replication.py),
its primary crashed (SIGKILL of the postmaster) inside a batch and the synchronous standby
promoted. The job finds the new primary by itself, goes on, follows messages sent afterwards,
and every message arrives exactly once, none left unreleased in the source.

Replication is synchronous (remote_apply): a commit the job saw acknowledged is on the standby.
An asynchronous failover loses the primary's last commits, and what they held (sent messages,
released batches, the sink's keys) with them: exactly once is not promised then (docs/spark.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgbroker.embedded import EmbeddedPostgres
from tests.spark.helpers import BATCH, Conn, count, create, fill, numbers, require_spark, route_job
from tests.support.replication import crash, multi_host_dsn, promote, set_synchronous

TOTAL = 60_000
LATER = 5_000


def on_primary(dsn: str, look: Callable[[Conn], Any]) -> Any:
    """``look`` on a new connection to whichever server is the primary now."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return look(conn)


def wait_until(dsn: str, job: subprocess.Popen[str], output: list[str], done: Callable[[Conn], bool]) -> None:
    deadline = time.monotonic() + 600
    while not on_primary(dsn, done):
        assert job.poll() is None, "the job ended:\n" + "".join(output)[-5000:]
        assert time.monotonic() < deadline, "the job made no progress:\n" + "".join(output)[-5000:]
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_following_route_rides_out_a_failover(
    replicated: tuple[EmbeddedPostgres, EmbeddedPostgres], tmp_path: Path
) -> None:
    require_spark()
    primary, standby = replicated
    set_synchronous(primary, standby.data_dir.name)
    dsn = multi_host_dsn(primary, standby)
    with psycopg.connect(dsn, autocommit=True) as conn:
        create(conn, "src", "dst")
        fill(conn, "src", TOTAL)
    job = route_job(dsn, tmp_path / "checkpoint", follow=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(job.stdout or []), daemon=True)
    reader.start()
    try:
        # Inside a batch where it can be caught (one partition sent, the other not).
        wait_until(dsn, job, output, lambda conn: count(conn, "q_dst") > 2 * BATCH)
        crash(primary)
        promote(standby)
        on_primary(dsn, lambda conn: fill(conn, "src", LATER, start=TOTAL))
        wait_until(dsn, job, output, lambda conn: count(conn, "q_dst") >= TOTAL + LATER)
        # The last batch is released at the next trigger.
        wait_until(dsn, job, output, lambda conn: count(conn, "q_src") == 0)
        os.kill(job.pid, signal.SIGINT)  # --follow stops after the current batch
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    reader.join(timeout=10)
    said = "".join(output)
    restarts = [line for line in said.splitlines() if "pipeline.restarting" in line]
    print(*restarts, sep="\n")
    assert restarts, said[-5000:]
    assert numbers_on(dsn, "q_dst") == list(range(TOTAL + LATER)), "lost or routed twice"
    assert on_primary(dsn, lambda conn: count(conn, "q_src")) == 0


def numbers_on(dsn: str, table: str) -> list[int]:
    return on_primary(dsn, lambda conn: numbers(conn, table))  # type: ignore[no-any-return]
