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

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgbroker.embedded import EmbeddedPostgres
from tests.spark.helpers import BATCH, Conn, count, create, fill, following_route, numbers, require_spark
from tests.support.replication import crash, multi_host_dsn, promote, set_synchronous

TOTAL = 60_000
LATER = 5_000


def on_primary(dsn: str, look: Callable[[Conn], Any]) -> Any:
    """``look`` on a new connection to whichever server is the primary now."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return look(conn)


def count_on(dsn: str, table: str) -> int:
    return on_primary(dsn, lambda conn: count(conn, table))  # type: ignore[no-any-return]


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
    with following_route(dsn, tmp_path / "checkpoint") as job:
        # Inside a batch where it can be caught (one partition sent, the other not).
        job.wait_until(lambda: count_on(dsn, "q_dst") > 2 * BATCH, "two batches routed")
        crash(primary)
        promote(standby)
        on_primary(dsn, lambda conn: fill(conn, "src", LATER, start=TOTAL))
        job.wait_until(lambda: count_on(dsn, "q_dst") >= TOTAL + LATER, "every message routed")
        # The last batch is released at the next trigger.
        job.wait_until(lambda: count_on(dsn, "q_src") == 0, "the last batch released")
        job.stop()
    print(*job.restarts(), sep="\n")
    assert job.restarts(), job.said()[-5000:]
    numbers_now = on_primary(dsn, lambda conn: numbers(conn, "q_dst"))
    assert numbers_now == list(range(TOTAL + LATER)), "lost or routed twice"
