"""Streaming reads in log mode, queue to queue: admission control, Trigger.AvailableNow, release
of committed batches (the last one included), restarts, startingOffset=latest, the archive, and
producers whose transactions commit late."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.spark.helpers import Conn, batch_sizes, count, create, fill, numbers, stream, wait_for


def test_available_now_moves_everything_in_admitted_batches(
    spark: Any, dsn: str, conn: Conn, tmp_path: Path
) -> None:
    create(conn, "src", "dst")
    fill(conn, "src", 25_000)

    query = stream(spark, dsn, "src", "dst", tmp_path, maxRowsPerBatch="10000", numPartitions="2")
    query.awaitTermination()

    assert batch_sizes(query) == [10_000, 10_000, 5_000]
    assert numbers(conn, "q_dst") == list(range(25_000))
    # Every batch released, the last one too (Spark never calls commit for it).
    assert count(conn, "q_src") == 0
    assert numbers(conn, "a_src") == list(range(25_000))
    # Only the last batch's keys are kept: it is the only one Spark may replay.
    keys = conn.execute("SELECT DISTINCT batch_id FROM pgbroker.spark_sink_commits").fetchall()
    assert keys == [(2,)]

    # Restarted from its checkpoint, the query takes only what came since.
    fill(conn, "src", 1_000, start=25_000)
    again = stream(spark, dsn, "src", "dst", tmp_path, maxRowsPerBatch="10000")
    again.awaitTermination()
    assert batch_sizes(again) == [1_000]
    assert numbers(conn, "q_dst") == list(range(26_000))
    assert count(conn, "q_src") == 0


def test_starting_latest_leaves_older_messages_and_delete_releases(
    spark: Any, dsn: str, conn: Conn, tmp_path: Path
) -> None:
    create(conn, "src", "dst")
    fill(conn, "src", 100)
    query = stream(
        spark, dsn, "src", "dst", tmp_path, available_now=False, startingOffset="latest", release="delete"
    )
    try:
        wait_for(lambda: query.recentProgress, 120, "the query's first trigger", query=query)
        fill(conn, "src", 50, start=100)
        wait_for(lambda: count(conn, "q_dst") == 50, 120, "the 50 new messages", query=query)
        # The last batch is released at the next trigger.
        wait_for(lambda: count(conn, "q_src") == 100, 60, "the release of the last batch", query=query)
    finally:
        query.stop()
    assert numbers(conn, "q_dst") == list(range(100, 150))
    assert numbers(conn, "q_src") == list(range(100))  # before the start: never the query's
    assert count(conn, "a_src") == 0  # release=delete


def test_reading_the_archive(spark: Any, dsn: str, conn: Conn, tmp_path: Path) -> None:
    create(conn, "jobs", "dst")
    fill(conn, "jobs", 50)
    conn.execute("SELECT pgmq.archive('jobs', ARRAY(SELECT generate_series(1, 30)::bigint))")
    conn.execute("SELECT pgmq.archive('jobs', ARRAY[40]::bigint[])")  # 31..39 may still be archived

    query = stream(spark, dsn, "jobs", "dst", tmp_path, archive="true")
    query.awaitTermination()

    assert numbers(conn, "q_dst") == list(range(30))
    assert count(conn, "a_jobs") == 31  # the archive is read, never released


def test_a_checkpoint_of_another_queue_is_refused(spark: Any, dsn: str, conn: Conn, tmp_path: Path) -> None:
    create(conn, "one", "two", "dst")
    fill(conn, "one", 10)
    fill(conn, "two", 10)
    stream(spark, dsn, "one", "dst", tmp_path).awaitTermination()
    query = stream(spark, dsn, "two", "dst", tmp_path)
    with pytest.raises(Exception, match="is not one of this stream"):
        query.awaitTermination()
    assert count(conn, "q_two") == 10


@pytest.mark.slow
def test_late_committing_producers_lose_nothing(spark: Any, dsn: str, conn: Conn, tmp_path: Path) -> None:
    """Producers take msg_ids, linger, then commit, so that higher ids often commit first: a
    stream reading "msg_id > last" would skip the late ones; the watermark must not."""
    create(conn, "src", "dst")
    producers, transactions, per_transaction = 8, 25, 10
    order = threading.Lock()
    committed: list[list[int]] = []

    def produce(worker: int) -> None:
        rng = random.Random(worker)
        with psycopg.connect(dsn) as c:
            for t in range(transactions):
                base = (worker * transactions + t) * per_transaction
                rows = c.execute(
                    "SELECT * FROM pgmq.send_batch('src', ARRAY(SELECT jsonb_build_object('n', g)"
                    " FROM generate_series(%s::int, %s::int) g ORDER BY g))",
                    (base, base + per_transaction - 1),
                ).fetchall()
                threading.Event().wait(rng.choice([0, 0, 0.05, 0.3]))
                with order:
                    c.commit()
                    committed.append([r[0] for r in rows])

    query = stream(
        spark, dsn, "src", "dst", tmp_path, available_now=False, trigger_seconds=0.1, maxRowsPerBatch="500"
    )
    try:
        threads = [threading.Thread(target=produce, args=(w,)) for w in range(producers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        total = producers * transactions * per_transaction
        wait_for(lambda: count(conn, "q_dst") >= total, 180, f"{total} messages in dst", query=query)
        wait_for(lambda: count(conn, "q_src") == 0, 60, "the release of every batch", query=query)
    finally:
        query.stop()

    # The race happened: transactions committed after others with higher msg_ids.
    highest = 0
    late = 0
    for ids in committed:
        late += min(ids) < highest
        highest = max(highest, *ids)
    assert late > 0
    assert numbers(conn, "q_dst") == list(range(total))
    assert len(batch_sizes(query)) > 3
