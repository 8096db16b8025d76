"""Batch reads (a peek at a queue or its archive) and batch writes through the ``pgbroker`` data
source, on local Spark and a real database."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F

from pgbroker.spark.schema import WriteLayout
from pgbroker.spark.sink import SinkKey, write_partition
from tests.spark.helpers import Conn, count, create, fill, numbers


def reader(spark: Any, dsn: str, queue: str, **options: str) -> Any:
    return spark.read.format("pgbroker").option("queue", queue).option("dsn", dsn).options(**options)


def test_peek_reads_every_message_without_a_lease(spark: Any, dsn: str, conn: Conn) -> None:
    create(conn, "jobs")
    fill(conn, "jobs", 10_001)
    conn.execute("SELECT * FROM pgmq.read('jobs', 30, 3)")  # three in flight: a peek sees them too
    before = conn.execute("SELECT msg_id, read_ct, vt FROM pgmq.q_jobs ORDER BY msg_id").fetchall()

    df = reader(spark, dsn, "jobs", numPartitions="3").load()
    assert df.rdd.getNumPartitions() == 3
    rows = df.select("msg_id", "read_ct", "message", "headers", "enqueued_at").collect()

    assert sorted(r.msg_id for r in rows) == [m for m, _, _ in before]
    assert sorted(json.loads(r.message)["n"] for r in rows) == list(range(10_001))
    assert sum(r.read_ct for r in rows) == 3
    assert all(r.headers is None and r.enqueued_at is not None for r in rows)
    assert conn.execute("SELECT msg_id, read_ct, vt FROM pgmq.q_jobs ORDER BY msg_id").fetchall() == before


def test_timestamps_are_the_database_instants(spark: Any, dsn: str, conn: Conn) -> None:
    create(conn, "jobs")
    conn.execute("""SELECT pgmq.send('jobs', '{"a": 1}', '{"h": "x"}', 0)""")
    row = conn.execute("SELECT enqueued_at, vt FROM pgmq.q_jobs").fetchone()
    assert row is not None
    got = (
        reader(spark, dsn, "jobs").load().select(F.unix_micros("enqueued_at"), F.unix_micros("vt"), "headers")
    )
    first = got.first()
    assert first is not None
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert first[0] == (row[0] - epoch) // timedelta(microseconds=1)
    assert first[1] == (row[1] - epoch) // timedelta(microseconds=1)
    assert json.loads(first[2]) == {"h": "x"}


def test_archive_and_columns(spark: Any, dsn: str, conn: Conn) -> None:
    create(conn, "jobs")
    fill(conn, "jobs", 100)
    conn.execute("SELECT pgmq.archive('jobs', ARRAY(SELECT generate_series(1, 40)::bigint))")

    archive = reader(spark, dsn, "jobs", archive="true", columns="archived_at,msg_id").load()
    assert archive.columns == ["msg_id", "archived_at"]
    rows = archive.collect()
    assert sorted(r.msg_id for r in rows) == list(range(1, 41))
    assert all(r.archived_at is not None for r in rows)
    assert reader(spark, dsn, "jobs").load().count() == 60


def test_empty_queue(spark: Any, dsn: str, conn: Conn) -> None:
    create(conn, "empty")
    assert reader(spark, dsn, "empty").load().count() == 0


def test_unknown_queue_fails_at_load(spark: Any, dsn: str) -> None:
    with pytest.raises(PySparkException, match='queue "nope" does not exist') as failure:
        reader(spark, dsn, "nope").load()
    assert "pgbroker create nope" in str(failure.value)


def test_bad_option_fails_at_load(spark: Any, dsn: str, conn: Conn) -> None:
    create(conn, "jobs")
    with pytest.raises(PySparkException, match="unknown option 'batchsize'"):
        reader(spark, dsn, "jobs", batchSize="10").load()
    with pytest.raises(PySparkException, match="numPartitions must be at least 1"):
        reader(spark, dsn, "jobs", numPartitions="0").load()


def test_unreachable_database_names_the_option(spark: Any, conn: Conn) -> None:
    with pytest.raises(PySparkException, match="cannot connect to the database"):
        reader(spark, "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2", "jobs").load()


def test_write_sends_messages_headers_and_delays(spark: Any, dsn: str, conn: Conn) -> None:
    create(conn, "out")
    rows = [
        (json.dumps({"n": n}), json.dumps({"k": n}) if n % 2 else None, 3600 if n < 5 else None)
        for n in range(1000)
    ]
    df = spark.createDataFrame(rows, "message string, headers string, delay int").repartition(3)

    df.write.format("pgbroker").option("queue", "out").option("dsn", dsn).mode("append").save()

    assert numbers(conn, "q_out") == list(range(1000))
    got = conn.execute(
        "SELECT (message->>'n')::int, headers, vt > now() + interval '50 minutes' FROM pgmq.q_out ORDER BY 1"
    ).fetchall()
    assert [h for _, h, _ in got] == [{"k": n} if n % 2 else None for n in range(1000)]
    assert [n for n, _, later in got if later] == [0, 1, 2, 3, 4]
    # The write's keys served their purpose and are gone.
    assert count(conn, "q_out") == 1000
    assert conn.execute("SELECT count(*) FROM pgbroker.spark_sink_commits").fetchone() == (0,)


def test_write_delay_until_a_time(spark: Any, dsn: str, conn: Conn) -> None:
    create(conn, "out")
    until = datetime.now(UTC) + timedelta(hours=2)
    df = spark.createDataFrame(
        [("{}", until), ("[]", None), ('{"a": 1}', until)], "message string, delay timestamp"
    )
    # One partition: one transaction, one send per delay, each keeping its rows' order.
    df.coalesce(1).write.format("pgbroker").option("queue", "out").option("dsn", dsn).mode("append").save()
    got = conn.execute("SELECT message, vt FROM pgmq.q_out ORDER BY msg_id").fetchall()
    assert [m for m, _ in got] == [{}, {"a": 1}, []]
    assert abs((got[0][1] - until).total_seconds()) < 0.001
    assert got[1][1] == got[0][1]
    assert got[2][1] <= datetime.now(UTC)


def test_write_refuses_a_schema_that_does_not_fit(spark: Any, dsn: str, conn: Conn) -> None:
    create(conn, "out")
    df = spark.createDataFrame([(1, "{}")], "msg_id long, message string")
    with pytest.raises(PySparkException, match="cannot write column 'msg_id' to a queue"):
        df.write.format("pgbroker").option("queue", "out").option("dsn", dsn).mode("append").save()
    structured = spark.createDataFrame([(1,)], "id int").select(F.struct("id").alias("message"))
    with pytest.raises(PySparkException, match=r"(?s)must be a STRING holding JSON.*to_json"):
        structured.write.format("pgbroker").option("queue", "out").option("dsn", dsn).mode("append").save()
    assert count(conn, "q_out") == 0


def test_write_refuses_overwrite_and_bad_json(spark: Any, dsn: str, conn: Conn) -> None:
    create(conn, "out")
    df = spark.createDataFrame([("{}",), ("not json",)], "message string")
    with pytest.raises(PySparkException, match="append only"):
        df.write.format("pgbroker").option("queue", "out").option("dsn", dsn).mode("overwrite").save()
    with pytest.raises(PySparkException, match="invalid input syntax for type json"):
        df.coalesce(1).write.format("pgbroker").option("queue", "out").option("dsn", dsn).mode(
            "append"
        ).save()
    # The partition's transaction rolled back: not even the valid message was sent.
    assert count(conn, "q_out") == 0


def test_write_to_unknown_queue(spark: Any, dsn: str) -> None:
    df = spark.createDataFrame([("{}",)], "message string")
    with pytest.raises(PySparkException, match='queue "nowhere" does not exist'):
        df.write.format("pgbroker").option("queue", "nowhere").option("dsn", dsn).mode("append").save()


def test_a_partition_key_sends_once(dsn: str, conn: Conn) -> None:
    """A retried task (same key) finds its partition sent and sends nothing again."""
    create(conn, "out")
    batch = pa.record_batch([pa.array(['{"n": 1}', '{"n": 2}'])], names=["message"])
    key = SinkKey("query-1", 7, 0)
    layout = WriteLayout(headers=False, delay=None)

    first = write_partition(dsn, "out", layout, key, [batch])
    again = write_partition(dsn, "out", layout, key, [batch])
    other = write_partition(dsn, "out", layout, SinkKey("query-1", 7, 1), [batch])

    assert (first.messages, first.duplicate) == (2, False)
    assert (again.messages, again.duplicate) == (0, True)
    assert (other.messages, other.duplicate) == (2, False)
    assert numbers(conn, "q_out") == [1, 1, 2, 2]


def test_binary_arrays_keep_every_value_and_the_order(dsn: str, conn: Conn) -> None:
    """Messages and headers go to send_batch as binary jsonb[]: NULLs, escapes and non-ASCII text
    survive, whatever the Arrow string type, across calls of SEND_ROWS messages."""
    create(conn, "out")
    texts = [json.dumps({"n": n, "s": 'q"\\é\n'}) for n in range(2_500)]
    headers = [None if n % 3 else json.dumps({"k": n}) for n in range(2_500)]
    layout = WriteLayout(headers=True, delay=None)
    parts = [(pa.string(), 0, 1_200), (pa.large_string(), 1_200, 2_500)]
    for partition, (kind, first, last) in enumerate(parts):
        batches = [
            pa.record_batch(
                [
                    pa.array(texts[a : min(a + 500, last)], kind),
                    pa.array(headers[a : min(a + 500, last)], kind),
                ],
                names=["MESSAGE", "headers"],
            )
            for a in range(first, last, 500)
        ]
        sent = write_partition(dsn, "out", layout, SinkKey("q", 0, partition), batches)
        assert sent.messages == last - first
    rows = conn.execute("SELECT message, headers FROM pgmq.q_out ORDER BY msg_id").fetchall()
    assert [m for m, _ in rows] == [json.loads(t) for t in texts]
    assert [h for _, h in rows] == [None if h is None else json.loads(h) for h in headers]
