"""A --follow pipeline rides out micro-batches failing on a transient SQL error, exactly once: the
route job's sessions have a 200 ms lock_timeout (or a 2 s statement_timeout; in its DSN, as an
operator sets one for the job's role), and a maintenance transaction holds a SHARE lock on the
target queue's table (no inserts) while messages come. Every write of a batch fails with 55P03
lock_not_available (or 57014 query_canceled) until the lock goes; the job starts its query again
from its checkpoint each time (cause=transient sqlstate=...), then routes every message exactly
once, none left unreleased in the source. Before, the first timeout ended the job for good, as if
the error were its own.

A refusal that stays (a permission denied, 42501) still ends the job at once, with its error.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from tests.spark.helpers import BATCH, Conn, count, create, fill, following_route, numbers

TOTAL = 2 * BATCH
UNDER_THE_LOCK = 5_000  # sent while the target's table is locked: a batch must meet the lock
RESTARTS_UNDER_THE_LOCK = 2


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("setting", "sqlstate"), [("lock_timeout=200", "55P03"), ("statement_timeout=2000", "57014")]
)
def test_a_following_route_rides_out_timeouts(
    dsn: str, conn: Conn, tmp_path: Path, setting: str, sqlstate: str
) -> None:
    create(conn, "src", "dst")
    fill(conn, "src", TOTAL)
    impatient = make_conninfo(dsn, options=f"-c {setting}")
    with following_route(impatient, tmp_path / "checkpoint") as job:
        job.wait_until(lambda: count(conn, "q_dst") >= BATCH, f"{BATCH:,} routed")
        with psycopg.connect(dsn) as maintenance, maintenance.transaction():
            maintenance.execute("LOCK TABLE pgmq.q_dst IN SHARE MODE")
            fill(conn, "src", UNDER_THE_LOCK, start=TOTAL)
            job.wait_until(
                lambda: len(job.restarts()) >= RESTARTS_UNDER_THE_LOCK, "restarts while the lock is held"
            )
        job.wait_until(lambda: count(conn, "q_dst") >= TOTAL + UNDER_THE_LOCK, "every message routed")
        # The last batch is released at the next trigger.
        job.wait_until(lambda: count(conn, "q_src") == 0, "the last batch released")
        job.stop()
    print(*job.restarts(), sep="\n")
    assert all(f"cause=transient sqlstate={sqlstate}" in line for line in job.restarts()), job.restarts()
    assert numbers(conn, "q_dst") == list(range(TOTAL + UNDER_THE_LOCK)), "lost or routed twice"
    assert count(conn, "q_src") == 0


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_permission_denied_ends_the_job_at_once(dsn: str, conn: Conn, tmp_path: Path) -> None:
    create(conn, "src", "dst")
    fill(conn, "src", 100)
    # Sessions that may read every table and write none (a built-in role: none to make or drop).
    read_only_role = make_conninfo(dsn, options="-c role=pg_read_all_data")
    with following_route(read_only_role, tmp_path / "checkpoint") as job:
        job.process.wait(timeout=600)
        said = job.said()
    assert job.process.returncode == 1, said[-5000:]
    assert not job.restarts(), job.restarts()
    # The sink's task, writing its key (pgbroker.spark_sink_commits) in the batch's transaction.
    assert "route: error: permission denied for table spark_sink_commits [SQLSTATE 42501]" in said, said[
        -5000:
    ]
    assert count(conn, "q_dst") == 0
    assert count(conn, "q_src") == 100
