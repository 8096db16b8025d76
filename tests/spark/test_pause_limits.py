"""Spark's streams and a queue's pause and limits (82_spark.sql): a claim-mode stream is a consumer
like any other (a paused queue gives it no batch until it resumes; its claims take what the limits
allow, and Trigger.AvailableNow waits for room rather than end early); a log stream that releases
takes no batch while paused and refuses a limited queue; a stream that only looks ignores both."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from pgbroker.errors import InvalidArgument
from pgbroker.spark.options import parse_read
from pgbroker.spark.queue.streaming_claim import ClaimStreamReader
from pgbroker.spark.queue.streaming_log import LogStreamReader
from tests.spark.helpers import Conn, batch_sizes, count, create, fill, numbers, stream, wait_for


def claim_reader(dsn: str, **options: str) -> ClaimStreamReader:
    return ClaimStreamReader(
        parse_read({"queue": "jobs", "dsn": dsn, "mode": "claim", "consumer": "c1", **options})
    )


def log_reader(dsn: str, **options: str) -> LogStreamReader:
    return LogStreamReader(parse_read({"queue": "jobs", "dsn": dsn, "mode": "log", **options}))


def test_a_claim_stream_stops_while_paused_and_goes_on_exactly_once(
    spark: Any, dsn: str, conn: Conn, tmp_path: Path
) -> None:
    create(conn, "src", "dst")
    fill(conn, "src", 100)
    query = stream(
        spark, dsn, "src", "dst", tmp_path, available_now=False, mode="claim", consumer="spark-pause"
    )
    try:
        # (The batch's progress is reported after its rows are written.)
        wait_for(lambda: sum(batch_sizes(query)) == 100, 180, "the first 100 messages", query=query)
        conn.execute("SELECT pgbroker.pause('src')")
        fill(conn, "src", 50, start=100)
        batches = len(batch_sizes(query))
        time.sleep(3)  # some fifteen triggers of 0.2 s: each finds the queue paused
        assert query.isActive, query.exception()
        assert len(batch_sizes(query)) == batches  # no batch with rows while paused
        assert count(conn, "q_dst") == 100
        assert conn.execute("SELECT count(*) FROM pgmq.q_src WHERE read_ct = 0").fetchone() == (50,)
        conn.execute("SELECT pgbroker.resume('src')")
        wait_for(lambda: count(conn, "q_dst") == 150, 120, "the 50 sent while paused", query=query)
        # Released once Spark committed their batch, when it next asks for an offset.
        wait_for(lambda: count(conn, "q_src") == 0, 60, "the last claim's release", query=query)
    finally:
        query.stop()
    assert numbers(conn, "q_dst") == list(range(150))  # each once
    assert numbers(conn, "a_src") == list(range(150))
    assert count(conn, "q_src") == 0


def test_claims_follow_pause_and_available_now_waits_for_the_rate_limit(dsn: str, conn: Conn) -> None:
    create(conn, "jobs")
    fill(conn, "jobs", 12)
    conn.execute("SELECT pgbroker.pause('jobs')")
    r = claim_reader(dsn)
    start = r.initialOffset()
    assert r.latestOffset(start, ReadAllAvailable()) == start
    conn.execute("SELECT pgbroker.resume('jobs')")
    conn.execute("SELECT pgbroker.set_policy('jobs', rate_limit_per_second => 5)")
    r.prepareForTriggerAvailableNow()
    sizes = []
    started = time.monotonic()
    try:
        while (end := r.latestOffset(start, ReadAllAvailable())) != start:
            sizes.append(
                conn.execute(
                    "SELECT cardinality(msg_ids) FROM pgbroker.spark_claims WHERE seq = %s", (end["seq"],)
                ).fetchone()
            )
            r.commit(end)
            start = end
    finally:
        r.stop()
    # One second's worth at most per claim; the run waited for tokens instead of ending early.
    assert all(size is not None and size[0] <= 5 for size in sizes), sizes
    assert sum(size[0] for size in sizes if size) == 12
    assert time.monotonic() - started >= 1.0
    assert count(conn, "q_jobs") == 0


def test_a_releasing_log_stream_waits_while_paused_and_refuses_limits(dsn: str, conn: Conn) -> None:
    create(conn, "jobs")
    fill(conn, "jobs", 3)
    conn.execute("SELECT pgbroker.pause('jobs')")
    r = log_reader(dsn)
    start = r.initialOffset()
    assert r.latestOffset(start, ReadAllAvailable()) == start
    # Streams that release nothing only look: the queue's state does not concern them.
    looking = log_reader(dsn, release="none")
    assert looking.latestOffset(looking.initialOffset(), ReadAllAvailable())["msg_id"] == 3
    conn.execute("SELECT pgbroker.resume('jobs')")
    assert r.latestOffset(start, ReadAllAvailable())["msg_id"] == 3

    conn.execute("SELECT pgbroker.set_policy('jobs', max_in_flight => 2)")
    with pytest.raises(InvalidArgument, match="log mode reads without leases") as raised:
        r.latestOffset(start, ReadAllAvailable())
    assert "mode=claim" in (raised.value.hint or "")
    archive = log_reader(dsn, archive="true")
    assert archive.latestOffset(archive.initialOffset(), ReadAllAvailable()) == archive.initialOffset()
    r.stop()
