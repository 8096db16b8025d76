"""A --follow pipeline rides out micro-batches failing on a transient SQL error, exactly once: the
route job's sessions have a 200 ms lock_timeout (or a 2 s statement_timeout; in its DSN, as an
operator sets one for the job's role), and a maintenance transaction holds a SHARE lock on the
target queue's table (no inserts) while messages come. Every write of a batch fails with 55P03
lock_not_available (or 57014 query_canceled) until the lock goes; the job starts its query again
from its checkpoint each time (cause=transient sqlstate=...), then routes every message exactly
once, none left unreleased in the source. Before, the first timeout ended the job for good, as if
the error were its own. The same with a deadlock between the job's writers and a maintenance
transaction (40P01), and with the database's new sessions read-only (25006), as after a failover
before the DSN finds the new primary.

A refusal that stays (a permission denied, 42501) still ends the job at once, with its error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.spark.helpers import BATCH, Conn, count, create, fill, following_route, numbers

TOTAL = 2 * BATCH
DURING_THE_FAULT = 5_000  # sent while the fault lasts: a batch must meet it


def restarts_through(
    job_dsn: str, conn: Conn, checkpoint: Path, fault: AbstractContextManager[None], restarts: int = 2
) -> list[str]:
    """The following route job's restart lines, ``fault`` held from its first batch routed until it
    restarted ``restarts`` times; every message routed exactly once, none left in the source."""
    create(conn, "src", "dst")
    fill(conn, "src", TOTAL)
    with following_route(job_dsn, checkpoint) as job:
        job.wait_until(lambda: count(conn, "q_dst") >= BATCH, f"{BATCH:,} routed")
        with fault:
            fill(conn, "src", DURING_THE_FAULT, start=TOTAL)
            job.wait_until(lambda: len(job.restarts()) >= restarts, "restarts in the fault")
        job.wait_until(lambda: count(conn, "q_dst") >= TOTAL + DURING_THE_FAULT, "every message routed")
        # The last batch is released at the next trigger.
        job.wait_until(lambda: count(conn, "q_src") == 0, "the last batch released")
        job.stop()
    print(*job.restarts(), sep="\n")
    assert numbers(conn, "q_dst") == list(range(TOTAL + DURING_THE_FAULT)), "lost or routed twice"
    assert count(conn, "q_src") == 0
    return job.restarts()


@contextmanager
def target_locked(dsn: str) -> Iterator[None]:
    """A maintenance transaction's SHARE lock on the target queue's table: no inserts."""
    with psycopg.connect(dsn) as maintenance, maintenance.transaction():
        maintenance.execute("LOCK TABLE pgmq.q_dst IN SHARE MODE")
        yield


@contextmanager
def writers_deadlocked(dsn: str) -> Iterator[None]:
    """A maintenance transaction that locks the target queue's table, then, once a writer of the
    job waits for it (holding its key's row in pgbroker.spark_sink_commits), that table too: a
    deadlock, which the writer loses (this transaction's deadlock_timeout is far longer)."""
    with psycopg.connect(dsn) as maintenance, maintenance.transaction():
        maintenance.execute("SET LOCAL deadlock_timeout = '1h'")
        maintenance.execute("LOCK TABLE pgmq.q_dst IN SHARE MODE")
        closing = threading.Thread(target=close_the_cycle, args=(maintenance, dsn), daemon=True)
        closing.start()
        yield
        closing.join()


def close_the_cycle(maintenance: Conn, dsn: str) -> None:
    """Once a writer waits for the lock on q_dst, take the lock it holds."""
    waiting = "SELECT EXISTS (SELECT FROM pg_locks WHERE relation = 'pgmq.q_dst'::regclass AND NOT granted)"
    with psycopg.connect(dsn, autocommit=True) as watcher:
        while watcher.execute(waiting).fetchone() != (True,):
            time.sleep(0.05)
    maintenance.execute("LOCK TABLE pgbroker.spark_sink_commits IN SHARE MODE")


@contextmanager
def read_only_sessions(conn: Conn) -> Iterator[None]:
    """New sessions of the database read-only, as those that reach an old primary (the data
    source opens a session per task and call)."""
    database = sql.Identifier(conn.info.dbname)
    conn.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(database))
    try:
        yield
    finally:
        conn.execute(sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only").format(database))


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("setting", "sqlstate"), [("lock_timeout=200", "55P03"), ("statement_timeout=2000", "57014")]
)
def test_a_following_route_rides_out_timeouts(
    dsn: str, conn: Conn, tmp_path: Path, setting: str, sqlstate: str
) -> None:
    impatient = make_conninfo(dsn, options=f"-c {setting}")
    restarts = restarts_through(impatient, conn, tmp_path / "checkpoint", target_locked(dsn))
    assert all(f"cause=transient sqlstate={sqlstate}" in line for line in restarts), restarts


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_following_route_rides_out_a_deadlock(dsn: str, conn: Conn, tmp_path: Path) -> None:
    # One restart: the query started again waits for the lock, now held without a cycle.
    restarts = restarts_through(dsn, conn, tmp_path / "checkpoint", writers_deadlocked(dsn), 1)
    assert all("cause=transient sqlstate=40P01" in line for line in restarts), restarts


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_following_route_rides_out_read_only_sessions(dsn: str, conn: Conn, tmp_path: Path) -> None:
    restarts = restarts_through(dsn, conn, tmp_path / "checkpoint", read_only_sessions(conn))
    assert all("cause=transient sqlstate=25006" in line for line in restarts), restarts


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
