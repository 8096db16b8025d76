"""Streaming write into a queue, exactly once per micro-batch.

Each task sends its partition under the key (query id, batch id, partition id), recorded in the
same transaction (pgbroker.spark.sink). The query id is the streaming query's id, which Spark
keeps in the checkpoint, so a batch replayed after a restart has the keys of its first run.
commit() runs on the driver in a fresh writer object once every task succeeded; abort() may
follow a commit that already succeeded, so it never takes anything back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from pgbroker.errors import PgbrokerError
from pgbroker.spark.options import WriteOptions
from pgbroker.spark.schema import WriteLayout
from pgbroker.spark.sink import PartitionWritten, SinkKey, forget, write_partition

log = logging.getLogger("pgbroker.spark")

# Set by Spark's micro-batch execution on every job it runs, and passed to the tasks.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


class StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions, layout: WriteLayout) -> None:
        self.options = options
        self.layout = layout

    def write(self, iterator: Iterator[Any]) -> PartitionWritten:
        return write_partition(self.options.dsn, self.options.queue, self.layout, task_key(), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Spark replays only the last batch of a query: keys of earlier ones can go.
        for query_id in {m.query_id for m in messages if isinstance(m, PartitionWritten)}:
            forget(self.options.dsn, query_id, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # The partitions that committed stay sent, and keep their keys: when Spark runs the batch
        # again, they are skipped and only the others are sent.
        done = [m for m in messages if isinstance(m, PartitionWritten)]
        log.warning(
            "pgbroker: batch %d to queue %r aborted; %d partitions committed stay sent and will not be "
            "sent again",
            batchId,
            self.options.queue,
            len(done),
        )


def task_key() -> SinkKey:
    context = TaskContext.get()
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
    batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
    if context is None or query_id is None or batch_id is None:
        raise PgbrokerError(
            "the pgbroker stream writer ran outside a streaming query's micro-batch",
            hint="Use it through df.writeStream.format('pgbroker'); "
            "inside foreachBatch, use batch_df.write.format('pgbroker').",
        )
    return SinkKey(query_id, int(batch_id), context.partitionId())
