"""Streaming jobs across a restart (or a failover) of Postgres.

A restart cuts every session: a task whose statement was running fails, and so does one that
connects while the server is down, and Spark then ends the query. The query is started again
from its checkpoint once the server accepts connections again. That is exactly once, as a job
started again after a crash is (tests/spark/test_kill.py): the source's offsets and the sink's
commit keys are in the checkpoint and the database, and a batch is written again only under
keys the sink has already committed.

A failure counts as the server's when the server the job reaches started after the query did
(pg_postmaster_start_time moved: a restart, or a failover to another server), found within
PATIENCE_SECONDS; any other failure is the job's own and ends it, as before.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pgbroker import _sql
from pgbroker.errors import PgbrokerError
from pgbroker.spark.connect import connect, scalar
from pgbroker.spark.jobs.common import JobFailed, watch

__all__ = ["watch_restarting"]

PATIENCE_SECONDS = 120.0  # how long a server that went away may take to come back
MAX_RESTARTS = 10  # a server restarting in a loop ends the job after this many
_PROBE_EVERY = 0.5


def watch_restarting(start: Callable[[], Any], label: str, dsn: str) -> int:
    """watch() the query ``start()`` starts; start it again from its checkpoint each time it
    fails because the database restarted under it. Returns the rows processed by the last run."""
    restarts = 0
    while True:
        before = _server_started_at(dsn)
        query = start()
        try:
            return watch(query, label)
        except JobFailed:
            if restarts >= MAX_RESTARTS or not _restarted_since(dsn, before):
                raise
        restarts += 1
        print(
            f"{label}: the database restarted under the query; starting it again from its checkpoint",
            file=sys.stdout,
            flush=True,
        )


def _server_started_at(dsn: str) -> datetime | None:
    """When the server the DSN reaches started; None while it cannot be reached."""
    try:
        with connect(dsn, role="job") as conn:
            started: datetime = scalar(conn, _sql.queries("spark")["spark_server_started_at"])
            return started
    except PgbrokerError:
        return None


def _restarted_since(dsn: str, before: datetime | None) -> bool:
    """Whether the server is (back) up and started after ``before``, waiting for it a while."""
    deadline = time.monotonic() + PATIENCE_SECONDS
    while (started := _server_started_at(dsn)) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(_PROBE_EVERY)
    return started != before
