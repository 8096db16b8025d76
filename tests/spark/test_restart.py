"""Exactly once across a restart of Postgres: a streaming route job (queue to queue, micro-batches
of 10,000) is running when its server restarts (``pg_ctl restart -m fast``: every session cut,
statements in flight failed). Once the server accepts connections again the job goes on by itself
and every message arrives exactly once, none left unreleased in the source.

Postgres is a private embedded cluster, as in tests/system/test_restart.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from pgbroker.embedded import EmbeddedPostgres
from tests.spark.helpers import count, create, fill, numbers, require_spark, route_job
from tests.support.postgres import _restart_and_wait

TOTAL = 60_000
BATCH = 10_000


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_streaming_route_rides_out_a_restart(cluster: EmbeddedPostgres, tmp_path: Path) -> None:
    require_spark()
    dsn = cluster.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        create(conn, "src", "dst")
        fill(conn, "src", TOTAL)
    job = route_job(dsn, tmp_path / "checkpoint")
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(job.stdout or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 600
        while True:
            with psycopg.connect(dsn, autocommit=True) as conn:
                routed = count(conn, "q_dst")
            if routed >= 2 * BATCH:
                break
            assert job.poll() is None, "".join(output)
            assert time.monotonic() < deadline, "the job made no progress"
            time.sleep(0.05)
        _restart_and_wait(cluster)
        job.wait(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    reader.join(timeout=10)
    said = "".join(output)
    assert job.returncode == 0, said[-5000:]
    assert "route: done:" in said
    # Whether the restart cut a statement or a connect (the query started again) or fell between
    # two of them: either way nothing may be lost or doubled.
    restarted = "pipeline.restarting" in said
    print(f"restarted with {routed:,} of {TOTAL:,} routed; query started again: {restarted}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert numbers(conn, "q_dst") == list(range(TOTAL)), "lost or routed twice"
        assert count(conn, "q_src") == 0
