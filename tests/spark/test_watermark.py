"""pgbroker.spark_safe_watermark and pgbroker.spark_release in SQL: the offsets log mode stands on.

The watermark must stay below a msg_id whose transaction has not committed yet, even when
higher msg_ids are already committed (msg_id order is not commit order), and must move on as
soon as that transaction ends."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from tests.spark.helpers import Conn, count, create, fill


def watermark(conn: Conn, queue: str = "jobs", *, archive: bool = False, wait_ms: int = 100) -> Any:
    row = conn.execute(
        "SELECT pgbroker.spark_safe_watermark(%s, %s, %s)", (queue, archive, wait_ms)
    ).fetchone()
    assert row is not None
    return row[0]


def test_empty_queue_has_watermark_zero(conn: Conn) -> None:
    create(conn, "jobs")
    assert watermark(conn) == 0


def test_an_open_sender_holds_the_watermark_below_its_id(dsn: str, conn: Conn) -> None:
    create(conn, "jobs")
    fill(conn, "jobs", 3)
    with psycopg.connect(dsn) as late:
        late.execute("SELECT pgmq.send('jobs', '{\"late\": true}')")  # takes msg_id 4, not committed
        fill(conn, "jobs", 2)  # 5 and 6 committed: visible above the gap
        assert watermark(conn) is None  # 4 may still appear: no safe offset yet
        late.commit()
    assert watermark(conn) == 6


def test_the_watermark_waits_for_open_senders(dsn: str, conn: Conn) -> None:
    create(conn, "jobs")
    with psycopg.connect(dsn) as late:
        late.execute("SELECT pgmq.send('jobs', '{}')")
        threading.Timer(0.3, late.commit).start()
        started = time.monotonic()
        assert watermark(conn, wait_ms=10_000) == 1
        assert 0.2 < time.monotonic() - started < 5


def test_senders_that_start_later_do_not_hold_it(dsn: str, conn: Conn) -> None:
    create(conn, "jobs")
    fill(conn, "jobs", 2)
    assert watermark(conn) == 2
    with psycopg.connect(dsn) as later:
        later.execute("SELECT pgmq.send('jobs', '{}')")  # id 3, after the watermark was taken
        assert watermark(conn) is None
        later.rollback()
    # A rolled-back id is a gap that will never fill.
    assert watermark(conn) == 3


def test_archive_watermark_stays_below_the_oldest_queued_message(conn: Conn) -> None:
    create(conn, "jobs")
    fill(conn, "jobs", 5)
    conn.execute("SELECT pgmq.archive('jobs', ARRAY[2, 3]::bigint[])")
    assert watermark(conn, archive=True) == 0  # 1 may still be archived
    conn.execute("SELECT pgmq.archive('jobs', ARRAY[1]::bigint[])")
    assert watermark(conn, archive=True) == 3
    conn.execute("SELECT pgmq.delete('jobs', ARRAY[4, 5]::bigint[])")
    assert watermark(conn, archive=True) == 5


def test_refuses_other_isolation_levels_and_sequence_caches(dsn: str, conn: Conn) -> None:
    create(conn, "jobs")
    with psycopg.connect(dsn) as snapshot:
        snapshot.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.Error, match="needs READ COMMITTED, not REPEATABLE READ"):
            snapshot.execute("SELECT pgbroker.spark_safe_watermark('jobs')")
    conn.execute("ALTER SEQUENCE pgmq.q_jobs_msg_id_seq CACHE 10")
    with pytest.raises(psycopg.Error, match="has CACHE 10 and INCREMENT 1: log mode needs 1 and 1"):
        watermark(conn)


def test_release_is_cumulative_and_idempotent(conn: Conn) -> None:
    create(conn, "jobs")
    fill(conn, "jobs", 10)

    def release(after: int, up_to: int, archive: bool = True) -> int:
        row = conn.execute(
            "SELECT pgbroker.spark_release('jobs', %s, %s, %s)", (after, up_to, archive)
        ).fetchone()
        assert row is not None
        return int(row[0])

    assert release(0, 4) == 4
    assert release(0, 4) == 0
    assert release(2, 7, archive=False) == 3
    assert count(conn, "q_jobs") == 3
    assert count(conn, "a_jobs") == 4


def test_a_releaser_named_by_pid_is_not_waited_for(dsn: str, conn: Conn) -> None:
    create(conn, "jobs")
    fill(conn, "jobs", 3)
    with psycopg.connect(dsn) as releaser:
        releaser.execute("SELECT pgbroker.spark_release('jobs', 0, 2, true)")  # open, holding its lock
        assert watermark(conn) is None
        row = conn.execute(
            "SELECT pgbroker.spark_safe_watermark('jobs', false, 100, %s)", ([releaser.info.backend_pid],)
        ).fetchone()
        assert row == (3,)
        releaser.rollback()
