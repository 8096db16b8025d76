"""Spark on streams: a streaming query reads a stream by offsets (its consumer group's cursor moved
only after Spark committed) and appends to another stream through the keyed sink; batch reads of
a range of ids, and the options' errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.spark.helpers import Conn, batch_sizes, require_spark, wait_for


def send(conn: Conn, stream: str, first: int, count: int) -> None:
    """Messages {"n": first..}, key k<n mod 7>, headers {"h": n}, in one statement."""
    conn.execute(
        "SELECT count(*) FROM pgbroker.stream_send_many(%s,"
        " ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(%s::int, %s::int) g ORDER BY g),"
        " ARRAY(SELECT jsonb_build_object('h', g) FROM generate_series(%s::int, %s::int) g ORDER BY g),"
        " ARRAY(SELECT 'k' || g %% 7 FROM generate_series(%s::int, %s::int) g ORDER BY g))",
        (stream, *(first, first + count - 1) * 3),
    )


def copied(conn: Conn) -> list[int]:
    """The "n" of every message in stream "copied" (duplicates kept), after checking that each
    kept its key and headers."""
    rows = conn.execute(
        "SELECT (message->>'n')::int, key, (headers->>'h')::int FROM pgbroker.s_copied ORDER BY 1"
    ).fetchall()
    assert all(key == f"k{n % 7}" and h == n for n, key, h in rows)
    return [r[0] for r in rows]


def group_lag(conn: Conn, group: str) -> int:
    row = conn.execute(
        "SELECT lag FROM pgbroker.stream_groups('events') WHERE group_name = %s", (group,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def acked_but_not_copied(conn: Conn) -> int:
    """Messages the group's cursor has passed that are not in the sink: the cursor moved before
    Spark committed the batch (one statement: one snapshot of both)."""
    row = conn.execute(
        "SELECT count(*) FROM pgbroker.s_events e"
        " JOIN pgbroker._stream_positions('events', 'spark', ARRAY[e.partition]) c ON true"
        " WHERE e.id <= c.acked_id AND NOT EXISTS"
        " (SELECT 1 FROM pgbroker.s_copied k WHERE k.message->'n' = e.message->'n')"
    ).fetchone()
    assert row is not None
    return int(row[0])


def start_query(spark: Any, dsn: str, checkpoint: Path) -> Any:
    df = (
        spark.readStream.format("pgbroker")
        .option("dsn", dsn)
        .option("stream", "events")
        .option("group", "spark")
        .option("maxRowsPerBatch", "400")
        .option("watermarkWaitMs", "100")
        .load()
    )
    return (
        df.select("message", "key", "headers")
        .writeStream.format("pgbroker")
        .option("dsn", dsn)
        .option("stream", "copied")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0.3 seconds")
        .start()
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_stream_read_exactly_once_with_a_late_commit_and_a_restart(
    spark: Any, dsn: str, conn: Conn, tmp_path: Path
) -> None:
    conn.execute("SELECT pgbroker.create_stream('events', 4)")
    conn.execute("SELECT pgbroker.create_stream('copied', 2)")
    send(conn, "events", 0, 1_000)  # before the query: the group starts at the start (default)
    producers, rounds, per_round = 3, 30, 20
    late_first = 100_000
    late_committed = threading.Event()
    seen_before_late_commit: list[int] = []

    def produce(worker: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            for r in range(rounds):
                send(c, "events", 10_000 + (worker * rounds + r) * per_round, per_round)
                time.sleep(0.05)

    def late() -> None:
        # Takes its ids early, commits 4 s later: ids above them are committed meanwhile.
        with psycopg.connect(dsn) as c:
            send(c, "events", late_first, 50)
            time.sleep(4)
            with psycopg.connect(dsn, autocommit=True) as look:
                seen_before_late_commit.extend(copied(look))
            c.commit()
            late_committed.set()

    checkpoint = tmp_path / "checkpoint"
    query = start_query(spark, dsn, checkpoint)
    threads = [threading.Thread(target=produce, args=(w,)) for w in range(producers)]
    threads.append(threading.Thread(target=late))
    try:
        # All of the first 1,000 copied before the late transaction opens, so that what was seen
        # before it commits does not depend on how fast a loaded machine runs the query.
        wait_for(lambda: len(copied(conn)) >= 1_000, 120, "the first 1,000", query=query)
        for thread in threads:
            thread.start()
        wait_for(lambda: len(batch_sizes(query)) >= 4, 120, "a few batches with the producers", query=query)
        assert acked_but_not_copied(conn) == 0
        query.stop()  # mid-way: the producers go on
        at_stop = len(copied(conn))
        query = start_query(spark, dsn, checkpoint)
        for thread in threads:
            thread.join()
        assert late_committed.is_set()
        total = 1_000 + producers * rounds * per_round + 50
        wait_for(lambda: len(copied(conn)) >= total, 180, f"{total} messages copied", query=query)
        assert acked_but_not_copied(conn) == 0
        # The last batch's cursor moves at the next trigger (Spark commits it then).
        wait_for(lambda: group_lag(conn, "spark") == 0, 60, "the group's lag to reach 0", query=query)
    finally:
        query.stop()

    expected = sorted(
        [
            *range(1_000),
            *range(10_000, 10_000 + producers * rounds * per_round),
            *range(late_first, late_first + 50),
        ]
    )
    assert copied(conn) == expected  # each exactly once, the late ones included
    assert 0 < at_stop < len(expected)
    # The late producer held the stream back, and nothing it wrote was passed over.
    assert len(seen_before_late_commit) >= 1_000
    assert not any(n >= late_first for n in seen_before_late_commit)
    # Batches respect maxRowsPerBatch (100 a partition), and the keys of the sink are trimmed.
    assert max(batch_sizes(query)) <= 400
    keys = conn.execute("SELECT count(DISTINCT batch_id) FROM pgbroker.spark_sink_commits").fetchone()
    assert keys is not None
    assert keys[0] <= 1


def test_batch_read_batch_write_and_errors(spark: Any, dsn: str, conn: Conn, tmp_path: Path) -> None:
    conn.execute("SELECT pgbroker.create_stream('events', 3)")
    conn.execute("SELECT pgbroker.create_stream('copied', 2)")
    send(conn, "events", 0, 300)

    whole = spark.read.format("pgbroker").option("dsn", dsn).option("stream", "events").load()
    assert whole.columns == ["partition", "id", "key", "enqueued_at", "headers", "message"]
    rows = whole.collect()
    assert sorted(r["id"] for r in rows) == list(range(1, 301))
    ranged = (
        spark.read.format("pgbroker")
        .option("dsn", dsn)
        .option("stream", "events")
        .option("fromId", "101")
        .option("toId", "150")
        .option("columns", "id,message")
        .load()
    )
    assert sorted(r["id"] for r in ranged.collect()) == list(range(101, 151))

    whole.select("message", "key", "headers").write.format("pgbroker").option("dsn", dsn).option(
        "stream", "copied"
    ).mode("append").save()
    assert copied(conn) == list(range(300))
    # The same key always lands in the same partition (order per key).
    spread = conn.execute("SELECT count(DISTINCT partition) FROM pgbroker.s_copied GROUP BY key").fetchall()
    assert all(n == 1 for (n,) in spread)

    # A group in a batch read: what it has not acknowledged; the cursor does not move.
    conn.execute("SELECT pgbroker.create_stream_group('events', 'late', 'end')")
    send(conn, "events", 300, 10)
    pending = (
        spark.read.format("pgbroker").option("dsn", dsn).option("stream", "events").option("group", "late")
    )
    assert sorted(r["id"] for r in pending.load().collect()) == list(range(301, 311))
    assert group_lag(conn, "late") == 10

    # Errors, on the driver where possible.
    reader = spark.readStream.format("pgbroker").option("dsn", dsn).option("stream", "events")
    query = reader.load().writeStream.format("noop").option("checkpointLocation", str(tmp_path)).start()
    with pytest.raises(Exception, match="needs option group"):
        query.awaitTermination(120)
    with pytest.raises(Exception, match="both given"):
        spark.read.format("pgbroker").option("dsn", dsn).option("stream", "events").option(
            "queue", "q"
        ).load()
    with pytest.raises(Exception, match='stream "nope" does not exist'):
        spark.read.format("pgbroker").option("dsn", dsn).option("stream", "nope").load()
    # A group that stream_read consumers share is not the query's to move.
    conn.execute("SELECT pgbroker.create_stream_group('events', 'workers', 'start')")
    conn.execute("SELECT count(*) FROM pgbroker.stream_read('events', 'workers', 'w1', 10)")
    with pytest.raises(psycopg.Error, match="has live consumers"):
        conn.execute("SELECT * FROM pgbroker.spark_stream_start('events', 'workers')")


def stream_query(dsn: str, checkpoint: Path) -> subprocess.Popen[str]:
    # Its own process group: the kill takes the driver, its JVM and their Python workers at once.
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.stream_query", dsn, str(checkpoint)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_driver_killed_mid_batch_then_restarted(dsn: str, conn: Conn, tmp_path: Path) -> None:
    """The driver SIGKILLed inside a micro-batch (some of its partitions appended, others not):
    the restarted query replays the batch from its checkpoint, the same rows, and the sink's keys
    skip what was appended; the group's cursor ends at the end."""
    require_spark()
    total, batch = 20_000, 2_000
    conn.execute("SELECT pgbroker.create_stream('events', 4)")
    conn.execute("SELECT pgbroker.create_stream('copied', 2)")
    send(conn, "events", 0, total)
    checkpoint = tmp_path / "checkpoint"

    job = stream_query(dsn, checkpoint)
    try:
        deadline = time.monotonic() + 600
        while True:
            done = len(copied(conn))
            # Inside a batch (a partition of 500 appended, not all four), or after a few batches.
            if (done >= 2 * batch and done % batch) or done >= 6 * batch:
                break
            assert job.poll() is None, job.communicate()[0]
            assert time.monotonic() < deadline, "the query made no progress"
            time.sleep(0.02)
        os.killpg(job.pid, signal.SIGKILL)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    at_kill = len(copied(conn))
    assert 0 < at_kill < total
    assert acked_but_not_copied(conn) == 0
    print(f"killed with {at_kill:,} of {total:,} messages copied ({at_kill % batch:,} of a batch)")

    restarted = stream_query(dsn, checkpoint)
    output, _ = restarted.communicate(timeout=600)
    assert restarted.returncode == 0, output
    assert "done" in output
    assert copied(conn) == list(range(total))  # each exactly once
    assert group_lag(conn, "spark") == 0  # the last batch committed: the cursor is at the end
