"""A --follow pipeline rides out its sessions terminated (pg_terminate_backend: an operator, a
pooler ending idle sessions, an admin), exactly once: a streaming route job (micro-batches of
10,000) has its every session terminated three times, inside batches, while the server stays up.
The job reconnects and goes on by itself, follows messages sent afterwards, and every message
arrives exactly once, none left unreleased in the source: in log mode, and in claim mode (the
restarted query gets its claim back, its leases still held).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.spark.helpers import BATCH, Conn, count, create, fill, following_route, numbers

TOTAL = 60_000
LATER = 5_000  # sent once the terminations are over: the job still follows
ROUNDS = 3


def terminate_pipeline_sessions(conn: Conn) -> int:
    """Terminate every session of the Spark data source (driver and executors); how many."""
    row = conn.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE 'pgbroker-spark%%'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def sessions_terminated(conn: Conn) -> Callable[[], bool]:
    """A poll that terminates the pipeline's sessions, true once there were some: between two
    triggers the data source may hold none (the full run at load 12 found none once in three)."""
    return lambda: terminate_pipeline_sessions(conn) > 0


def routed_past(conn: Conn, at: int) -> Callable[[], bool]:
    return lambda: count(conn, "q_dst") > at


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["log", "claim"])
def test_a_following_route_rides_out_terminated_sessions(
    dsn: str, conn: Conn, tmp_path: Path, mode: str
) -> None:
    create(conn, "src", "dst")
    fill(conn, "src", TOTAL)
    with following_route(dsn, tmp_path / "checkpoint", mode) as job:
        terminated = []
        for round_ in range(1, ROUNDS + 1):
            # Inside a batch where it can be caught (one partition sent, the other not).
            job.wait_until(routed_past(conn, round_ * BATCH), f"{round_ * BATCH:,} routed")
            job.wait_until(sessions_terminated(conn), "a session of the pipeline to terminate")
            terminated.append(count(conn, "q_dst"))
        fill(conn, "src", LATER, start=TOTAL)
        job.wait_until(lambda: count(conn, "q_dst") >= TOTAL + LATER, "every message routed")
        # The last batch is released at the next trigger.
        job.wait_until(lambda: count(conn, "q_src") == 0, "the last batch released")
        job.stop()
    print("sessions terminated with so many routed:", terminated)
    print(*job.restarts(), sep="\n")
    assert job.restarts(), job.said()[-5000:]
    assert all("cause=connection_lost" in line for line in job.restarts()), job.restarts()
    assert numbers(conn, "q_dst") == list(range(TOTAL + LATER)), "lost or routed twice"
    assert count(conn, "q_src") == 0
