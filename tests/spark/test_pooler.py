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

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgbroker._db.dsn import POOLER_ENV
from pgbroker.spark.arrow_read import copy_batches
from pgbroker.spark.connect import connect
from tests.spark.helpers import Conn, count, create, numbers, require_spark
from tests.spark.pooler_job import PER_BATCH, TOTAL
from tests.support.paths import ROOT
from tests.support.pooler import transaction_pooler


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


@pytest.mark.pgbouncer
def test_a_reads_settings_stay_in_its_transaction_behind_the_pooler(pg_admin_dsn: str, dsn: str) -> None:
    """A range read turns enable_sort off for its COPY. Set for the session, it stayed with the
    pooler's server connection: the next client given it (another application, sharing the pool)
    planned without sorts. One server connection: both clients are given it."""
    with transaction_pooler(pg_admin_dsn, pool_size=1) as pooler:
        pooled = make_conninfo(pooler, dbname=conninfo_to_dict(dsn)["dbname"])
        select = sql.SQL("SELECT current_setting('enable_sort') AS message")
        with connect(pooled, role="reader") as reader:
            [batch] = copy_batches(reader, select, ["message"], settings=[("enable_sort", "off")])
            assert batch.column(0).to_pylist() == ["off"]
            with psycopg.connect(pooled, autocommit=True) as other:
                assert other.execute("SHOW enable_sort").fetchone() == ("on",)
