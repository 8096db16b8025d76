"""The Spark source and sink behind pgbouncer in transaction pooling mode (Debian's 1.18), with
``PGBROKER_POOLER=transaction`` given to the job's process and so to its executors: a batch write,
a batch read and a streaming query, each message exactly once, no error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgbroker._db.dsn import POOLER_ENV
from tests.spark.helpers import Conn, count, create, numbers, require_spark
from tests.spark.pooler_job import PER_BATCH, TOTAL
from tests.support.paths import ROOT


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(600)
def test_write_read_and_stream_through_the_pooler(
    pooled_dsn: str,
    conn: Conn,
    tmp_path: Path,
) -> None:
    require_spark()
    create(conn, "src", "dst")
    job = subprocess.run(
        [sys.executable, "-m", "tests.spark.pooler_job", pooled_dsn, str(tmp_path / "checkpoint")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, POOLER_ENV: "transaction", "PYSPARK_PYTHON": sys.executable},
        check=False,
    )
    assert job.returncode == 0, job.stderr[-5000:]
    assert "prepared statement" not in job.stderr
    said = json.loads(job.stdout.strip().splitlines()[-1])
    assert said["read"] == list(range(TOTAL)), "the batch read lost or doubled messages"
    assert said["batches"] >= TOTAL // PER_BATCH
    assert numbers(conn, "q_dst") == list(range(TOTAL)), "the stream lost or doubled messages"
    assert count(conn, "q_src") == 0
