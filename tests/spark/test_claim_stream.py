"""Claim mode: Spark sharing a queue with other consumers through pgbroker's fenced read, extend
and ack; claims reused after a crash, leases renewed, lost leases leaving the claim."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from pgbroker import Broker
from pgbroker.spark.arrow_read import copy_batches
from pgbroker.spark.connect import connect
from pgbroker.spark.options import parse_read
from pgbroker.spark.queue.streaming_claim import ClaimStreamReader
from tests.spark.helpers import Conn, count, create, fill, numbers, stream, wait_for


def claims(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT consumer, seq, cardinality(msg_ids), cardinality(array_remove(receipts, NULL))"
        " FROM pgbroker.spark_claims ORDER BY consumer, seq"
    ).fetchall()


@pytest.mark.slow
def test_spark_and_a_plain_consumer_share_the_queue(spark: Any, dsn: str, conn: Conn, tmp_path: Path) -> None:
    create(conn, "src", "dst")
    total = 20_000
    fill(conn, "src", total)
    consumed: list[int] = []
    spark_done = threading.Event()

    def plain_consumer() -> None:
        with Broker(dsn, max_connections=1) as broker:
            queue = broker.queue("src")
            while True:
                batch = queue.read_many(200, vt=300)
                if not batch:
                    if spark_done.is_set():
                        return
                    time.sleep(0.05)
                    continue
                consumed.extend(m.message["n"] for m in batch)
                assert len(queue.ack_many(batch)) == len(batch)
                time.sleep(0.05)  # slower than Spark, so that both get a share

    query = stream(
        spark, dsn, "src", "dst", tmp_path, mode="claim", consumer="spark-1", maxRowsPerBatch="2000"
    )
    consumer = threading.Thread(target=plain_consumer)
    try:
        # Spark takes seconds to start: let the plain consumer in once Spark holds a claim.
        wait_for(lambda: claims(conn) or not query.isActive, 180, "Spark's first claim")
        consumer.start()
        query.awaitTermination()
    finally:
        spark_done.set()
        if consumer.is_alive():
            consumer.join()

    by_spark = numbers(conn, "q_dst")
    assert by_spark
    assert consumed
    assert not set(by_spark) & set(consumed)
    assert sorted(by_spark + consumed) == list(range(total))
    assert count(conn, "q_src") == 0
    assert count(conn, "a_src") == total
    assert claims(conn) == []


def reader(dsn: str, **options: str) -> ClaimStreamReader:
    opts = parse_read({"queue": "jobs", "dsn": dsn, "mode": "claim", "consumer": "c1", **options})
    return ClaimStreamReader(opts)


def read_all(dsn: str, r: ClaimStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[int]:
    found = []
    with connect(dsn, role="test") as c:
        for partition in r.partitions(start, end):
            for batch in copy_batches(c, partition.select(), partition.columns):
                found += [json.loads(m)["n"] for m in batch.column("message").to_pylist()]
    return sorted(found)


def test_a_claim_is_reused_after_a_crash(dsn: str, conn: Conn) -> None:
    create(conn, "jobs")
    fill(conn, "jobs", 20)
    first = reader(dsn, numPartitions="2")
    start = first.initialOffset()
    end = first.latestOffset(start, ReadMaxRows(5))
    assert end["seq"] == start["seq"] + 1
    assert read_all(dsn, first, start, end) == [0, 1, 2, 3, 4]
    first.stop()  # the driver dies here, before Spark committed the batch

    again = reader(dsn, numPartitions="3")
    assert again.initialOffset() == start  # nothing was released
    assert again.latestOffset(start, ReadMaxRows(8)) == end  # the same claim, not a new read
    assert read_all(dsn, again, start, end) == [0, 1, 2, 3, 4]
    again.commit(end)
    again.stop()

    assert numbers(conn, "a_jobs") == [0, 1, 2, 3, 4]
    assert claims(conn) == []
    assert reader(dsn).initialOffset()["seq"] == end["seq"]


def test_leases_are_renewed_and_a_lost_one_leaves_the_claim(dsn: str, conn: Conn) -> None:
    create(conn, "jobs")
    fill(conn, "jobs", 4)
    r = reader(dsn, leaseSeconds="3")
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(3))
    try:
        time.sleep(4.5)  # longer than the lease: only renewals keep it
        leased = conn.execute("SELECT count(*) FROM pgmq.q_jobs WHERE vt > clock_timestamp()").fetchone()
        assert leased == (3,)
        assert claims(conn) == [("c1", 1, 3, 3)]

        # Another consumer takes message 1 (n = 0) once its lease has run out.
        conn.execute("SELECT pgmq.set_vt('jobs', 1, 0)")
        stolen = conn.execute("SELECT msg_id FROM pgmq.read('jobs', 300, 1)").fetchall()
        assert stolen == [(1,)]
        time.sleep(1.5)
        assert claims(conn) == [("c1", 1, 3, 2)]
        assert read_all(dsn, r, start, end) == [1, 2]
        r.commit(end)
    finally:
        r.stop()
    assert numbers(conn, "a_jobs") == [1, 2]
    assert numbers(conn, "q_jobs") == [0, 3]  # the stolen one is its new consumer's


def test_a_claim_under_available_now_takes_nothing_newer(conn: Conn) -> None:
    create(conn, "jobs")
    fill(conn, "jobs", 10)
    conn.execute("SELECT pgbroker.spark_consumer('c', 'jobs')")

    def claim(seq: int, qty: int, target: int | None) -> int:
        row = conn.execute("SELECT pgbroker.spark_claim('c', %s, %s, 60, %s)", (seq, qty, target)).fetchone()
        assert row is not None
        return int(row[0])

    assert claim(1, 4, 6) == 4
    assert claim(2, 100, 6) == 2  # read 6 (ids 5..10), rolled back, read again for 2
    assert claim(3, 100, 6) == 0
    assert conn.execute("SELECT read_ct, count(*) FROM pgmq.q_jobs GROUP BY 1 ORDER BY 1").fetchall() == [
        (0, 4),
        (1, 6),
    ]
    assert claim(2, 1, 6) == 2  # an existing claim is reused whatever qty says


def test_one_consumer_name_per_queue(conn: Conn) -> None:
    create(conn, "a", "b")
    conn.execute("SELECT pgbroker.spark_consumer('c', 'a')")
    with pytest.raises(Exception, match='consumer "c" already reads queue "a"'):
        conn.execute("SELECT pgbroker.spark_consumer('c', 'b')")
