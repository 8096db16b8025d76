"""Writing to a stream from Spark: df.write / df.writeStream with option ``stream``.

A DataFrame written to a stream has ``message`` (JSON text), and optionally ``key`` (text: the
partition, and so the order, of the message) and ``headers`` (a JSON object as text). Each task
appends its partition with pgbroker.stream_send_many, in calls of SEND_ROWS, in the transaction
that records its key (query, batch, partition) in pgbroker.spark_sink_commits
(pgbroker.spark.sink): a retried task or a replayed micro-batch appends nothing twice, exactly as
the queue sink.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from pgbroker import _sql
from pgbroker.spark.arrow_write import chunks
from pgbroker.spark.connect import Connection
from pgbroker.spark.jsonb_array import JsonbArray, JsonbArrayDumper, jsonb_array
from pgbroker.spark.queue.streaming_write import task_key
from pgbroker.spark.schema import SchemaMismatch
from pgbroker.spark.sink import PartitionWritten, SinkKey, forget, write_keyed
from pgbroker.spark.stream.options import StreamWriteOptions

log = logging.getLogger("pgbroker.spark")

STREAM_WRITE_COLUMNS = ("message", "key", "headers")


def stream_write_columns(schema: Any) -> tuple[str, ...]:
    """Check a DataFrame's schema (a pyspark StructType) against what a stream takes; returns the
    columns to send, in STREAM_WRITE_COLUMNS order."""
    from pyspark.sql import types as T

    fields = {field.name.lower(): field.dataType for field in schema.fields}
    extra = [name for name in fields if name not in STREAM_WRITE_COLUMNS]
    if extra:
        raise SchemaMismatch(
            f"cannot write column{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))} to a stream: "
            "a stream's message is the columns message (JSON text), key (text, optional) and headers "
            "(JSON object text, optional)",
            hint="Select them first, for example df.select(to_json(struct('*')).alias('message'), 'key').",
        )
    if "message" not in fields:
        raise SchemaMismatch(
            "a DataFrame written to a stream needs a column 'message' (JSON text)",
            hint="For example df.select(to_json(struct('*')).alias('message')).",
        )
    for name in fields:
        if not isinstance(fields[name], T.StringType):
            raise SchemaMismatch(
                f"column {name!r} written to a stream must be a STRING, not {fields[name].simpleString()}",
                hint="message and headers are JSON text: to_json(...); "
                "a key is text: col('key').cast('string').",
            )
    return tuple(c for c in STREAM_WRITE_COLUMNS if c in fields)


def send_to_stream(conn: Connection, stream: str, columns: tuple[str, ...], batches: Iterable[Any]) -> int:
    """Append the rows of ``batches`` to ``stream`` in the caller's transaction; returns how many."""
    conn.adapters.register_dumper(JsonbArray, JsonbArrayDumper)
    sent = 0
    for chunk in chunks(batches, columns):
        row = conn.execute(
            _sql.queries("spark_stream")["spark_stream_send"],
            (
                stream,
                jsonb_array(chunk.column("message")),
                jsonb_array(chunk.column("headers")) if "headers" in columns else None,
                chunk.column("key").to_pylist() if "key" in columns else None,
            ),
        ).fetchone()
        sent += int(row[0]) if row else 0
    return sent


class _StreamSink:
    def __init__(self, options: StreamWriteOptions, columns: tuple[str, ...]) -> None:
        self.options = options
        self.columns = columns

    def _write(self, key: SinkKey, batches: Iterator[Any]) -> PartitionWritten:
        stream = self.options.stream
        return write_keyed(
            self.options.dsn, stream, key, lambda conn: send_to_stream(conn, stream, self.columns, batches)
        )


class StreamAppendWriter(_StreamSink, DataSourceStreamArrowWriter):
    """writeStream: exactly once per (query, batch, partition), as the queue sink."""

    def write(self, iterator: Iterator[Any]) -> PartitionWritten:
        return self._write(task_key(), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Spark replays only the last batch of a query: keys of earlier ones can go.
        for query_id in {m.query_id for m in messages if isinstance(m, PartitionWritten)}:
            forget(self.options.dsn, query_id, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Committed partitions stay appended and keep their keys: a rerun of the batch skips them.
        log.warning("pgbroker: batch %d to stream %r aborted", batchId, self.options.stream)


class StreamBatchAppendWriter(_StreamSink, DataSourceArrowWriter):
    """df.write: each partition once, even when its task is retried."""

    def __init__(self, options: StreamWriteOptions, columns: tuple[str, ...]) -> None:
        super().__init__(options, columns)
        self.write_id = f"batch:{uuid.uuid4()}"

    def write(self, iterator: Iterator[Any]) -> PartitionWritten:
        context = TaskContext.get()
        return self._write(SinkKey(self.write_id, 0, context.partitionId() if context else 0), iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        forget(self.options.dsn, self.write_id, 1)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # what committed stays appended (a stream takes nothing back)
