"""The driver's source process past a hung server: a session of it is frozen (SIGSTOP, as a hung
server, a stuck pooler or a network dropping packets without a word leaves it: connected, never
answering). The background threads (the lease renewer of claim mode and the releaser of log
mode, each keeping a connection) give the call up once its bound has passed and make it again on
a new connection: the leases stay held, the release is done. A call Spark makes (here the
partitions of a batch) fails as a lost connection past its bound, instead of stalling the query."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from pgbroker.errors import ConnectionLost
from pgbroker.spark import bounded
from pgbroker.spark.options import parse_read
from pgbroker.spark.queue.release import BackgroundRelease
from pgbroker.spark.queue.streaming_claim import ClaimStreamReader
from pgbroker.spark.queue.streaming_log import LogStreamReader
from pgbroker.spark.sink import forget
from tests.spark.helpers import Conn, count, create, fill, numbers, wait_for
from tests.support.faults import FROZEN_APP, freezable, sessions_frozen, table_locked


def renewer_connected(conn: Conn) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND query LIKE '%%spark_renew%%'",
        (FROZEN_APP,),
    ).fetchone()
    return row != (0,)


def now(conn: Conn) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_leases_are_renewed_past_a_frozen_session(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    create(conn, "jobs")
    fill(conn, "jobs", 3)
    options = {"queue": "jobs", "dsn": freezable(dsn), "mode": "claim", "consumer": "c1", "leaseSeconds": "6"}
    reader = ClaimStreamReader(parse_read(options))
    start = reader.initialOffset()
    reader.latestOffset(start, ReadMaxRows(3))  # a claim of 3, and the renewer started
    try:
        wait_for(lambda: renewer_connected(conn), 60, "the renewer's connection")
        with sessions_frozen(dsn, between_statements=True) as frozen:
            assert frozen
            frozen_at = now(conn)

            def renewed() -> bool:
                row = conn.execute(
                    "SELECT renewed_at > %s FROM pgbroker.spark_claims WHERE consumer = 'c1'", (frozen_at,)
                ).fetchone()
                return row == (True,)

            wait_for(renewed, 60, "a renewal after the renewer's session froze")
            # Renewed before the lease it had when the session froze ran out.
            leased = conn.execute("SELECT count(*) FROM pgmq.q_jobs WHERE vt > clock_timestamp()").fetchone()
            assert leased == (3,)
    finally:
        reader.stop()
    said = [r.getMessage() for r in caplog.records if r.name == "pgbroker.spark"]
    assert any("renewing leases failed (no answer from the server within 1 s)" in m for m in said), said


def test_a_release_is_done_past_a_frozen_session(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "pgbroker.spark")
    create(conn, "jobs")
    fill(conn, "jobs", 20)
    releaser = BackgroundRelease(freezable(dsn), "jobs", archive=True, answer_within=2)
    try:
        releaser.request(0, 10)
        assert releaser.flush(60)
        assert count(conn, "q_jobs") == 10
        with sessions_frozen(dsn, between_statements=True) as frozen:
            assert frozen == [releaser.backend_pid]
            releaser.request(0, 20)
            assert releaser.flush(60), "the release still waits for the frozen session"
            assert releaser.backend_pid not in frozen
    finally:
        releaser.stop()
    assert count(conn, "q_jobs") == 0
    assert numbers(conn, "a_jobs") == list(range(20))
    said = [r.getMessage() for r in caplog.records if r.name == "pgbroker.spark"]
    assert any("releasing up to 20 failed (no answer from the server within 2 s)" in m for m in said), said


def stalled_call(dsn: str, conn: Conn, table: str, call: Callable[[], object]) -> BaseException | None:
    """What ``call`` (on a freezable DSN) raises when its statement, waiting for a lock on
    ``table``, has its session frozen, and the lock is then let go: the session stays frozen
    (granted the lock, never answering). AssertionError if it still waits after 60 s."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
    with ExitStack() as thawed_at_the_end:
        with table_locked(dsn, table):
            thread.start()
            wait_for(lambda: conn.execute(waiting, (FROZEN_APP,)).fetchone() != (0,), 60, "the call to wait")
            assert thawed_at_the_end.enter_context(sessions_frozen(dsn))
        thread.join(60)
        assert not thread.is_alive(), "the driver's call still waits for the frozen session"
    return failed[0] if failed else None


def test_driver_calls_fail_past_a_frozen_session(
    dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bound less than its 300 s, for a test that waits for it (raising=False: the old code ran
    # without it).
    monkeypatch.setattr(bounded, "DRIVER_ANSWER_SECONDS", 5.0, raising=False)
    create(conn, "jobs")
    fill(conn, "jobs", 5)
    options = {"queue": "jobs", "dsn": freezable(dsn), "mode": "log", "watermarkWaitMs": "0"}
    reader = LogStreamReader(parse_read(options))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())

    # Planning a batch (the statement that finds its msg_id bounds).
    planning = stalled_call(dsn, conn, "pgmq.q_jobs", lambda: reader.partitions(start, end))
    assert isinstance(planning, ConnectionLost), planning
    # 5 s, and the 5 s a watermark may wait on purpose (watermarkWaitMs below 1 s counts as 1 s).
    assert "no answer from the server within 10 s" in str(planning)
    reader.stop()

    # A sink's commit of a micro-batch (dropping the keys of the batches before it).
    committing = stalled_call(
        dsn, conn, "pgbroker.spark_sink_commits", lambda: forget(freezable(dsn), "q", 1)
    )
    assert isinstance(committing, ConnectionLost), committing
    assert "no answer from the server within 5 s" in str(committing)
