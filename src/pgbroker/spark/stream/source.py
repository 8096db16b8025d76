"""Reading a stream from Spark by offsets: a streaming query as a consumer group, exactly once
without claim tables, and batch reads of a range of ids.

An offset is {"stream", "group", "ids"}: ids[p] is the last id of partition p the query has
reached. The micro-batch after offset s holds, in each partition p, the rows with
s.ids[p] < id <= e.ids[p]. An end never passes the stream's safe id (every id at or below it is
committed or rolled back for good, see sql/functions/92_streams.sql), and nothing below it changes
but by retention; Spark's checkpoint holds the offsets, so a batch read again after a crash reads
the same rows. Once Spark has committed a batch, its ends become the group's acked_id
(pgbroker.spark_stream_commit): lag metrics and retention see the query as any consumer, and a
new checkpoint on the same group starts where the last one was committed. Spark calls
commit(end) only once a following batch exists, so the cursor also moves when Spark asks for the
offset after a committed batch (as in log mode on queues).

The group belongs to the query: live stream_read consumers in it are refused (their leases and
the query's offsets would move the same cursors).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pgbroker import _sql
from pgbroker.errors import PgbrokerError
from pgbroker.spark.arrow_read import copy_batches
from pgbroker.spark.bounded import driver_answer_within
from pgbroker.spark.connect import Connection, connect
from pgbroker.spark.queue.streaming_log import TARGET_WAIT_FACTOR, CheckpointMismatch
from pgbroker.spark.stream.options import StreamReadOptions
from pgbroker.spark.stream.ranges import batch_ends

log = logging.getLogger("pgbroker.spark")

Offset = dict[str, Any]

# Between two looks at the safe id while its candidate waits for producers to end.
BOUND_POLL_SECONDS = 0.01


@dataclass
class StreamPartition(InputPartition):
    """Rows first < id <= last of one partition of a stream's log."""

    table: str
    columns: tuple[str, ...]
    partition: int
    after: int
    last: int

    def select(self) -> sql.Composed:
        # The log's one index is (partition, id): an index walk, in id order (order per key).
        return sql.SQL(_sql.queries("spark_stream")["spark_stream_partition_rows"]).format(
            columns=sql.SQL(", ").join(map(sql.Identifier, self.columns)),
            table=sql.Identifier("pgbroker", self.table),
            partition=sql.Literal(self.partition),
            after=sql.Literal(self.after),
            last=sql.Literal(self.last),
        )


def log_table(stream: str) -> str:
    return f"s_{stream}"


def read_partition(dsn: str, partition: InputPartition) -> Iterator[Any]:
    assert isinstance(partition, StreamPartition)
    if partition.last <= partition.after:
        return
    with connect(dsn, role="reader") as conn:
        yield from copy_batches(conn, partition.select(), partition.columns)


def partitions_between(
    options: StreamReadOptions, starts: Sequence[int], ends: Sequence[int]
) -> list[StreamPartition]:
    """One Spark partition per stream partition with ids to read: order per key is kept within one."""
    table = log_table(options.stream)
    return [
        StreamPartition(table, options.columns, p, a, b)
        for p, (a, b) in enumerate(zip(starts, ends, strict=True))
        if b > a
    ]


def safe_id(conn: Connection, stream: str, wait_ms: int) -> tuple[int, bool]:
    """The stream's safe id, and whether it reached the newest id drawn when called.

    The safe id moves in two steps (a candidate, then the end of the producers that held the log
    when it was taken): look again until it passes the first candidate, for up to ``wait_ms``.
    """
    deadline = time.monotonic() + wait_ms / 1000
    bound = _sql.queries("spark_stream")["spark_stream_bound"]
    row = conn.execute(bound, (stream,)).fetchone()
    assert row is not None
    safe, target = int(row[0]), row[1]
    while target is not None and safe < target and time.monotonic() < deadline:
        time.sleep(BOUND_POLL_SECONDS)
        row = conn.execute(bound, (stream,)).fetchone()
        assert row is not None
        safe = int(row[0])
    return safe, target is None or safe >= target


class StreamOffsetReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    # Spark pickles it to several processes: no connection, no thread in it.
    def __init__(self, options: StreamReadOptions) -> None:
        assert options.group is not None
        self.options = options
        self.group = options.group
        self._initial: Offset | None = None
        self._committed: list[int] | None = None
        self._target: int | None = None

    # -- offsets (driver) -------------------------------------------------------------------------

    def initialOffset(self) -> Offset:
        start = "end" if self.options.starting_offset == "latest" else "start"
        with self._connect() as conn:
            rows = conn.execute(
                _sql.queries("spark_stream")["spark_stream_start"],
                (self.options.stream, self.group, start),
            ).fetchall()
        self._initial = self._offset([int(r[0]) for r in rows])
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_rows_per_batch is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_rows_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        wait_ms = max(1000, self.options.watermark_wait_ms) * TARGET_WAIT_FACTOR
        with self._connect() as conn:
            safe, reached = safe_id(conn, self.options.stream, wait_ms)
        if not reached:
            raise PgbrokerError(
                f"stream {self.options.stream!r}: a transaction writing to it stayed open for "
                f"{wait_ms / 1000:.0f} s, so no id is safe to stop at",
                hint="Find it in pg_stat_activity (state 'idle in transaction'?) and end it, then retry.",
            )
        self._target = safe

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        starts = self._ids(start)
        if start != self._initial:
            # Spark asks for the next offset only once the batch ending at start is committed.
            self._commit(starts)
        with self._connect() as conn:
            if self._target is not None:
                bound = self._target
            else:
                bound, reached = safe_id(conn, self.options.stream, self.options.watermark_wait_ms)
                if not reached:
                    log.warning(
                        "pgbroker: stream %r: a transaction writing to it stayed open longer than %d ms; "
                        "its messages wait for it to end",
                        self.options.stream,
                        self.options.watermark_wait_ms,
                    )
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            ends = batch_ends(conn, log_table(self.options.stream), starts, bound, max_rows)
        return start if ends == starts else self._offset(ends)

    def partitions(self, start: Offset, end: Offset) -> Sequence[StreamPartition]:
        return partitions_between(self.options, self._ids(start), self._ids(end))

    def commit(self, end: Offset) -> None:
        self._commit(self._ids(end))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.options.dsn, partition)

    # -- helpers ----------------------------------------------------------------------------------

    def _connect(self) -> Any:
        # The safe id is looked at again and again (safe_id): no statement waits on purpose.
        return connect(self.options.dsn, role="stream source", answer_within=driver_answer_within())

    def _offset(self, ids: list[int]) -> Offset:
        return {"stream": self.options.stream, "group": self.group, "ids": ids}

    def _ids(self, offset: Offset) -> list[int]:
        ids = offset.get("ids")
        if (offset.get("stream"), offset.get("group")) != (self.options.stream, self.group) or not isinstance(
            ids, list
        ):
            raise CheckpointMismatch(
                f"the checkpoint's offset {offset} is not one of this stream "
                f"(stream {self.options.stream!r}, group {self.group!r})",
                hint="Use a new checkpointLocation for a different stream, group, or queue.",
            )
        return [int(i) for i in ids]

    def _commit(self, ids: list[int]) -> None:
        if ids == self._committed:
            return
        with self._connect() as conn:
            conn.execute(
                _sql.queries("spark_stream")["spark_stream_commit"],
                (self.options.stream, self.group, list(range(len(ids))), ids),
            )
        self._committed = ids


class StreamRangeReader(DataSourceReader):
    """spark.read on a stream: ids fromId..toId (or up to the safe id) of every partition, or
    from a group's cursor (which does not move). Read-only, like a peek at a queue."""

    def __init__(self, options: StreamReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[StreamPartition]:
        opts = self.options
        with connect(opts.dsn, role="planner", answer_within=driver_answer_within()) as conn:
            bound, _ = safe_id(conn, opts.stream, opts.watermark_wait_ms)
            if opts.group is not None:
                conn.execute(
                    _sql.queries("spark_stream")["spark_stream_group_check"], (opts.stream, opts.group)
                )
                cursors = [
                    int(r[0])
                    for r in conn.execute(
                        _sql.queries("spark_stream")["spark_stream_group_cursors"],
                        (opts.stream, opts.group),
                    )
                ]
            else:
                row = conn.execute(
                    _sql.queries("spark_stream")["spark_stream_partitions"], (opts.stream,)
                ).fetchone()
                assert row is not None
                cursors = [0] * int(row[0])
        last = bound if opts.to_id is None else min(bound, opts.to_id)
        starts = [max(c, opts.from_id - 1) for c in cursors]
        found = partitions_between(opts, starts, [max(last, s) for s in starts])
        # Spark wants at least one partition; this one reads nothing.
        return found or [StreamPartition(log_table(opts.stream), opts.columns, 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.options.dsn, partition)
