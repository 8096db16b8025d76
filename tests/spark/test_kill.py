"""Exactly once through a crash: 100k messages routed queue to queue by the route job, its driver
SIGKILLed in the middle of a micro-batch, the job started again from its checkpoint. Every message
must arrive once, and none may be left unreleased in the source."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.spark.helpers import BATCH, Conn, count, create, fill, numbers, route_job

TOTAL = 100_000


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_driver_killed_mid_stream_then_restarted(dsn: str, conn: Conn, tmp_path: Path) -> None:
    create(conn, "src", "dst")
    fill(conn, "src", TOTAL)
    checkpoint = tmp_path / "checkpoint"

    job = route_job(dsn, checkpoint)
    try:
        deadline = time.monotonic() + 600
        while True:
            sent = count(conn, "q_dst")
            # Kill inside a batch (one of its two partitions sent, the other not), or, failing
            # to catch that moment, after a few batches.
            if (sent >= 2 * BATCH and sent % BATCH) or sent >= 5 * BATCH:
                break
            assert job.poll() is None, job.communicate()[0]
            assert time.monotonic() < deadline, "the job made no progress"
            time.sleep(0.02)
        os.killpg(job.pid, signal.SIGKILL)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    at_kill = count(conn, "q_dst")
    assert 0 < at_kill < TOTAL
    print(f"killed with {at_kill:,} of {TOTAL:,} messages routed ({at_kill % BATCH:,} of a batch)")

    restarted = route_job(dsn, checkpoint)
    output, _ = restarted.communicate(timeout=600)
    assert restarted.returncode == 0, output
    assert "route: done:" in output
    print(output)

    assert numbers(conn, "q_dst") == list(range(TOTAL))  # each message exactly once
    assert count(conn, "q_src") == 0  # nothing left unreleased
    assert numbers(conn, "a_src") == list(range(TOTAL))
