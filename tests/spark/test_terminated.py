"""A --follow pipeline rides out its sessions terminated (pg_terminate_backend: an operator, a
pooler ending idle sessions, an admin), exactly once: a streaming route job (micro-batches of
10,000) has its every session terminated three times, inside batches, while the server stays up.
The job reconnects and goes on by itself, follows messages sent afterwards, and every message
arrives exactly once, none left unreleased in the source.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.spark.helpers import BATCH, Conn, count, create, fill, numbers, route_job

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


def wait_routed(conn: Conn, job: subprocess.Popen[str], output: list[str], at_least: int) -> int:
    deadline = time.monotonic() + 600
    while (routed := count(conn, "q_dst")) < at_least:
        assert job.poll() is None, "the job ended:\n" + "".join(output)[-5000:]
        assert time.monotonic() < deadline, f"the job made no progress past {routed:,}"
        time.sleep(0.02)
    return routed


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_following_route_rides_out_terminated_sessions(dsn: str, conn: Conn, tmp_path: Path) -> None:
    create(conn, "src", "dst")
    fill(conn, "src", TOTAL)
    job = route_job(dsn, tmp_path / "checkpoint", follow=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(job.stdout or []), daemon=True)
    reader.start()
    try:
        terminated = []
        for round_ in range(1, ROUNDS + 1):
            # Inside a batch where it can be caught (one partition sent, the other not).
            routed = wait_routed(conn, job, output, round_ * BATCH + 1)
            terminated.append((routed, terminate_pipeline_sessions(conn)))
        fill(conn, "src", LATER, start=TOTAL)
        wait_routed(conn, job, output, TOTAL + LATER)
        deadline = time.monotonic() + 120
        while count(conn, "q_src"):  # the last batch is released at the next trigger
            assert job.poll() is None, "".join(output)[-5000:]
            assert time.monotonic() < deadline, "the last batch was never released"
            time.sleep(0.1)
        os.kill(job.pid, signal.SIGINT)  # --follow stops after the current batch
        job.wait(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    reader.join(timeout=10)
    said = "".join(output)
    print("terminated (routed, sessions):", terminated)
    restarts = [line for line in said.splitlines() if "pipeline.restarting" in line]
    print(*restarts, sep="\n")
    assert all(sessions for _, sessions in terminated), terminated
    assert restarts, said[-5000:]
    assert all("cause=connection_lost" in line for line in restarts), restarts
    assert numbers(conn, "q_dst") == list(range(TOTAL + LATER)), "lost or routed twice"
    assert count(conn, "q_src") == 0
