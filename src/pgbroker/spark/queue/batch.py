"""Batch reads (a peek at a queue or its archive) and batch writes (messages into a queue).

A read takes no lease and changes nothing: it splits the table's msg_id span into ranges read
in parallel, each in its own snapshot, up to the largest msg_id seen when the job was planned.
A write sends each partition in one transaction, keyed so that a retried task sends nothing
twice (see pgbroker.spark.sink).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from psycopg import sql
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

from pgbroker import _sql
from pgbroker.spark.arrow_read import copy_batches
from pgbroker.spark.bounded import driver_answer_within
from pgbroker.spark.connect import connect, queue_table, table_ident
from pgbroker.spark.options import ReadOptions, WriteOptions
from pgbroker.spark.queue.partitions import RangePartition, split
from pgbroker.spark.schema import WriteLayout
from pgbroker.spark.sink import PartitionWritten, SinkKey, forget, write_partition


class BatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[RangePartition]:
        opts = self.options
        with connect(opts.dsn, role="planner", answer_within=driver_answer_within()) as conn:
            table = queue_table(conn, opts.queue, archive=opts.archive)
            row = conn.execute(
                sql.SQL(_sql.queries("spark_queue")["spark_queue_bounds"]).format(table=table_ident(table))
            ).fetchone()
        first, last = row if row is not None else (None, None)
        if first is None or last is None:
            # Spark wants at least one partition; this one reads nothing.
            return [RangePartition(table, opts.columns, 1, 0)]
        return [RangePartition(table, opts.columns, a, b) for a, b in split(first, last, opts.num_partitions)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RangePartition)
        if partition.last < partition.first:
            return
        with connect(self.options.dsn, role="reader") as conn:
            select, body = partition.select(), self.options.body
            yield from copy_batches(conn, select, partition.columns, partition.settings, body)


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions, layout: WriteLayout) -> None:
        self.options = options
        self.layout = layout
        # Made once on the driver and shipped to every task: the key of this write job.
        self.write_id = f"batch:{uuid.uuid4()}"

    def write(self, iterator: Iterator[Any]) -> PartitionWritten:
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        key = SinkKey(self.write_id, 0, partition)
        return write_partition(self.options.dsn, self.options.queue, self.layout, key, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        # Every task is done: no attempt of this job can come again, the keys have served.
        forget(self.options.dsn, self.write_id, 1)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Partitions that committed stay sent (a queue cannot take messages back once a
        # consumer may have read them); their keys stay too, harmless, and the job fails.
        pass
