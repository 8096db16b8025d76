"""One writer task's partition sent to a queue exactly once: the partition's key is recorded in
the transaction that sends its messages (table pgbroker.spark_sink_commits).

A retried task, a speculative copy, or a micro-batch replayed after a driver crash carries the
same key; it finds the key committed and sends nothing. This holds as long as a replayed batch
puts the same rows in the same partitions, which Spark guarantees for a deterministic plan over
a source that replays exactly (both pgbroker stream modes do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage

from pgbroker import _sql
from pgbroker.spark.arrow_write import send_batches
from pgbroker.spark.bounded import driver_answer_within
from pgbroker.spark.connect import Connection, connect
from pgbroker.spark.schema import WriteLayout


@dataclass(frozen=True)
class SinkKey:
    query_id: str
    batch_id: int
    partition_id: int


@dataclass
class PartitionWritten(WriterCommitMessage):
    """What a writer task reports to the driver."""

    query_id: str
    batch_id: int
    partition_id: int
    messages: int
    # True when an earlier attempt had already sent this partition: nothing was sent again.
    duplicate: bool


def write_partition(
    dsn: str, queue: str, layout: WriteLayout, key: SinkKey, batches: Iterable[Any]
) -> PartitionWritten:
    return write_keyed(dsn, queue, key, lambda conn: send_batches(conn, queue, layout, batches))


def write_keyed(dsn: str, target: str, key: SinkKey, send: Callable[[Connection], int]) -> PartitionWritten:
    """Run ``send`` (which returns how many messages it sent to ``target``, a queue or a stream)
    in the transaction that records ``key``, unless an earlier attempt already committed it."""
    with connect(dsn, role="writer") as conn, conn.transaction():
        row = conn.execute(
            _sql.queries("spark")["spark_sink_begin"],
            (key.query_id, key.batch_id, key.partition_id, target),
        ).fetchone()
        if row is None or not row[0]:
            return PartitionWritten(key.query_id, key.batch_id, key.partition_id, 0, duplicate=True)
        sent = send(conn)
        conn.execute(
            _sql.queries("spark")["spark_sink_finish"],
            (key.query_id, key.batch_id, key.partition_id, sent),
        )
    return PartitionWritten(key.query_id, key.batch_id, key.partition_id, sent, duplicate=False)


def forget(dsn: str, query_id: str, before_batch: int) -> None:
    """Drop the keys of batches before ``before_batch``: they can never be replayed."""
    with connect(dsn, role="writer commit", answer_within=driver_answer_within()) as conn:
        conn.execute(_sql.queries("spark")["spark_sink_forget"], (query_id, before_batch))
