"""The driver's background threads past a hung server: the lease renewer of claim mode and the
releaser of log mode each keep a connection, and that session is frozen (SIGSTOP, as a hung server,
a stuck pooler or a network dropping packets without a word leaves it: connected, never answering).
Each gives the call up once its bound has passed, and makes it again on a new connection: the
leases stay held, the release is done."""

from __future__ import annotations

import logging
from datetime import datetime

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from pgbroker.spark.options import parse_read
from pgbroker.spark.queue.release import BackgroundRelease
from pgbroker.spark.queue.streaming_claim import ClaimStreamReader
from tests.spark.helpers import Conn, count, create, fill, numbers, wait_for
from tests.support.faults import FROZEN_APP, freezable, sessions_frozen


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
    options = {"queue": "jobs", "dsn": freezable(dsn), "mode": "claim", "consumer": "c1", "leaseSeconds": "3"}
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
