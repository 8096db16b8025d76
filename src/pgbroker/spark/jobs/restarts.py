"""Streaming jobs across a lost session, a restart or a failover of Postgres.

A terminated session (pg_terminate_backend: an operator, a pooler ending idle sessions), a
restart or a failover fails the task or driver call that was using it, or that connects while
the server is down, and Spark then ends the query. The job starts the query again from its
checkpoint once the server answers again, after a pause that doubles (PAUSES) while restarts
follow one another. That is exactly once, as a job started again after a crash is
(tests/spark/test_kill.py): the source's offsets and the sink's commit keys are in the
checkpoint and the database, and a batch is written again only under keys the sink has already
committed.

A failure counts as the database's when the server the job reaches started after the query did
(pg_postmaster_start_time moved: a restart, or a failover to another server), or when the query
failed on a lost or refused connection (common.lost_connection), or on a statement or a
connection the server refused for now (a SQLSTATE of TRANSIENT_SQLSTATES, which the data source
marks in the error Spark relays: common.relayed_sqlstate), and the server answers again, either
found within PATIENCE_SECONDS. Any other failure is the job's own and ends it (a function of the job raising,
a permission denied, a missing queue), as does a database failing MAX_RESTARTS times in a row (a
run of RECOVERED_AFTER_SECONDS ends the row).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pgbroker import _sql
from pgbroker._db.backoff import Backoff
from pgbroker.errors import PgbrokerError
from pgbroker.spark.bounded import driver_answer_within
from pgbroker.spark.connect import connect, scalar
from pgbroker.spark.jobs.common import JobFailed, lost_connection, relayed_sqlstate, watch

__all__ = ["watch_restarting"]

log = logging.getLogger("pgbroker.spark")

PATIENCE_SECONDS = 120.0  # how long a server that went away may take to come back
MAX_RESTARTS = 10  # a database failing the query this many times in a row ends the job
PAUSES = (1.0, 60.0)  # the pause before a restart doubles from the first to the second
RECOVERED_AFTER_SECONDS = 120.0  # a run that lasted this long ends a row of restarts
_PROBE_EVERY = 0.5
# What the server refuses for a moment, not for the job's work: a serialization failure or a
# deadlock (40001, 40P01), a lock or statement timeout (55P03, 57014: a maintenance lock, a server
# under load), no connection slot left (53300), a read-only transaction (25006: a failover the
# DSN has not followed yet). A new run of the batch may pass.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57014", "53300", "25006"})


def watch_restarting(start: Callable[[], Any], label: str, dsn: str) -> int:
    """watch() the query ``start()`` starts; start it again from its checkpoint each time it
    fails because of the database (a lost session, a restart, a failover). Returns the rows
    processed by the last run."""
    pauses = Backoff(*PAUSES)
    in_a_row = 0
    while True:
        before = _server_started_at(dsn)
        began = time.monotonic()
        query = start()
        try:
            return watch(query, label)
        except JobFailed as failed:
            if time.monotonic() - began >= RECOVERED_AFTER_SECONDS:
                in_a_row = 0
                pauses.reset()
            cause = _database_cause(failed, dsn, before)
            if cause is None or in_a_row >= MAX_RESTARTS:
                raise
            in_a_row += 1
            pause = pauses.next()
            log.warning(
                "pipeline.restarting job=%s cause=%s sqlstate=%s restart=%d pause=%.1fs error=%s: "
                "reconnecting, then starting the query again from its checkpoint",
                label,
                cause,
                relayed_sqlstate(failed) or "none",
                in_a_row,
                pause,
                json.dumps(failed.message),
            )
            time.sleep(pause)


def _database_cause(failed: JobFailed, dsn: str, before: datetime | None) -> str | None:
    """Why the query failed, when the database is to blame: "server_restarted" (or failed over),
    "connection_lost" or "transient" (TRANSIENT_SQLSTATES); None when the failure is the job's
    own, or the server stayed away."""
    deadline = time.monotonic() + PATIENCE_SECONDS
    while (started := _server_started_at(dsn)) is None:
        if time.monotonic() >= deadline:
            return None
        time.sleep(_PROBE_EVERY)
    if started != before:
        return "server_restarted"
    # Before a lost connection: a connection refused for want of a slot (53300) is transient.
    if relayed_sqlstate(failed) in TRANSIENT_SQLSTATES:
        return "transient"
    return "connection_lost" if lost_connection(failed) else None


def _server_started_at(dsn: str) -> datetime | None:
    """When the server the DSN reaches started; None while it cannot be reached."""
    try:
        with connect(dsn, role="job", answer_within=driver_answer_within()) as conn:
            started: datetime = scalar(conn, _sql.queries("spark")["spark_server_started_at"])
            return started
    except PgbrokerError:
        return None
