"""Streaming read in log mode: Spark is the queue's only consumer (or reads its archive), and an
offset is a msg_id.

Offsets are {"queue", "archive", "floor", "msg_id"}: the batch after offset s reads the
messages with s.msg_id < msg_id <= e.msg_id, all of them (vt and read_ct do not matter in a log).
An end offset never passes pgbroker.spark_safe_watermark, below which no message can still
appear, so a producer that took its msg_id early and committed late is not skipped; and since
nothing below the watermark changes until Spark releases it, a batch read again after a crash
reads the same rows. floor is where the query started (0, or the watermark for
startingOffset=latest): messages at or below it were never the query's to release.

While the queue is paused no batch is taken (the query idles, and resumes with the queue); a
queue with concurrency or rate limits is refused, since a log stream takes no leases to count
(read such a queue in claim mode). A stream that releases nothing (of the archive, or
release=none) only looks, and ignores both (82_spark.sql).

Release (archive or delete) happens only for committed batches, cumulatively over
floor < msg_id <= end, in commit(end) and also when Spark asks for the next offset: Spark calls
commit(end) only once a following batch exists, so the last batch of a run would otherwise stay.
It runs in the background (pgbroker.spark.queue.release) while the next batch is processed, and is
waited for when there is no next batch, so a Trigger.AvailableNow run ends with all released.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from psycopg import sql
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
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
from pgbroker.spark.connect import Connection, connect, queue_table, scalar, table_ident
from pgbroker.spark.options import ReadOptions
from pgbroker.spark.queue.partitions import RangePartition, split
from pgbroker.spark.queue.pause_log import PauseLog
from pgbroker.spark.queue.release import BackgroundRelease

log = logging.getLogger("pgbroker.spark")

Offset = dict[str, Any]

# Trigger.AvailableNow must fix its target; allow a slow writer this many times the usual wait.
TARGET_WAIT_FACTOR = 5
# How long the last release of a run is waited for before Spark is told there is nothing more.
RELEASE_WAIT_SECONDS = 300


class CheckpointMismatch(PgbrokerError):
    """The checkpoint was written by a query that read another queue or in another mode."""


class LogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    # Called in several Spark processes (the driver's source runner, the planners of read()):
    # no connection, no thread here.
    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._initial: Offset | None = None
        self._target: int | None = None
        self._table: str | None = None
        self._releaser: BackgroundRelease | None = None
        self._paused = PauseLog(options.queue)

    def __getstate__(self) -> dict[str, Any]:
        # The background thread and its connection belong to the driver's process: a copy
        # shipped elsewhere starts without them.
        return {**self.__dict__, "_releaser": None}

    # -- offsets (driver) -------------------------------------------------------------------------

    def initialOffset(self) -> Offset:
        floor = 0
        if self.options.starting_offset == "latest":
            with self._connect() as conn:
                floor = self._watermark_or_fail(conn)
        self._initial = {
            "queue": self.options.queue,
            "archive": self.options.archive,
            "floor": floor,
            "msg_id": floor,
        }
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_rows_per_batch is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_rows_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        with self._connect() as conn:
            self._target = self._watermark_or_fail(conn)

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        self._check(start)
        if start != self._initial:
            # Spark asks for the next offset only once the batch ending at start is committed.
            self._release(start)
        with self._connect() as conn:
            if not self._may_read(conn):
                self._flush()  # no batch follows while paused (the query may be about to stop)
                return start
            if self._target is not None:
                # Trigger.AvailableNow: everything up to the target was settled when it was taken.
                watermark = self._target
            else:
                found = self._watermark(conn, self.options.watermark_wait_ms)
                if found is None:
                    log.warning(
                        "pgbroker: queue %r: a transaction writing to it stayed open longer than %d ms; "
                        "the stream waits for it to end",
                        self.options.queue,
                        self.options.watermark_wait_ms,
                    )
                    return start
                watermark = found
            first = scalar(
                conn,
                sql.SQL(_sql.queries("spark_queue")["spark_queue_first_after"]).format(
                    table=table_ident(self._table_name(conn))
                ),
                (start["msg_id"], watermark),
            )
        if first is None:
            # No batch follows: finish releasing now (the query may be about to stop).
            self._flush()
            return start
        end = watermark
        if isinstance(limit, ReadMaxRows):
            end = min(watermark, first + limit.max_rows - 1)
        return {**start, "msg_id": end}

    def partitions(self, start: Offset, end: Offset) -> Sequence[RangePartition]:
        self._check(start)
        self._check(end)
        with self._connect() as conn:
            table = self._table_name(conn)
            row = conn.execute(
                sql.SQL(_sql.queries("spark_queue")["spark_queue_bounds_between"]).format(
                    table=table_ident(table)
                ),
                (start["msg_id"], end["msg_id"]),
            ).fetchone()
        if row is None or row[0] is None:
            return []
        cols = self.options.columns
        return [
            RangePartition(table, cols, a, b) for a, b in split(row[0], row[1], self.options.num_partitions)
        ]

    def commit(self, end: Offset) -> None:
        self._check(end)
        self._release(end)

    def stop(self) -> None:
        if self._releaser is not None:
            self._releaser.stop()

    # -- data (executors) -------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RangePartition)
        with connect(self.options.dsn, role="reader") as conn:
            select, body = partition.select(), self.options.body
            yield from copy_batches(conn, select, partition.columns, partition.settings, body)

    # -- helpers ----------------------------------------------------------------------------------

    def _connect(self) -> Any:
        # A watermark waits for senders on purpose, up to TARGET_WAIT_FACTOR times the option.
        waits = max(1000, self.options.watermark_wait_ms) * TARGET_WAIT_FACTOR / 1000
        return connect(self.options.dsn, role="stream source", answer_within=driver_answer_within(waits))

    def _table_name(self, conn: Connection) -> str:
        if self._table is None:
            self._table = queue_table(conn, self.options.queue, archive=self.options.archive)
        return self._table

    def _check(self, offset: Offset) -> None:
        mine = (self.options.queue, self.options.archive)
        theirs = (offset.get("queue"), offset.get("archive"))
        if theirs != mine or "msg_id" not in offset:
            raise CheckpointMismatch(
                f"the checkpoint's offset {offset} is not one of this stream "
                f"(queue {self.options.queue!r}, archive={self.options.archive}, log mode)",
                hint="Use a new checkpointLocation for a different queue, archive or mode.",
            )

    def _may_read(self, conn: Connection) -> bool:
        """False while the queue is paused; PB007 (InvalidArgument) when it has limits, which a
        log stream cannot honour (82_spark.sql). A stream that releases nothing (of the archive,
        or release=none) only looks, and reads whatever the queue's state."""
        consumes = not self.options.archive and self.options.release != "none"
        may = bool(
            scalar(conn, _sql.queries("spark_queue")["spark_queue_log_gate"], (self.options.queue, consumes))
        )
        self._paused.note(not may)
        return may

    def _watermark(self, conn: Connection, wait_ms: int) -> int | None:
        # Our own releaser only deletes: not a sender to wait for.
        pid = self._releaser.backend_pid if self._releaser is not None else None
        value = scalar(
            conn,
            _sql.queries("spark_queue")["spark_queue_safe_watermark"],
            (self.options.queue, self.options.archive, wait_ms, [pid] if pid else []),
        )
        return None if value is None else int(value)

    def _watermark_or_fail(self, conn: Connection) -> int:
        wait_ms = max(1000, self.options.watermark_wait_ms) * TARGET_WAIT_FACTOR
        started = time.monotonic()
        watermark = self._watermark(conn, wait_ms)
        if watermark is None:
            raise PgbrokerError(
                f"queue {self.options.queue!r}: a transaction writing to it stayed open for "
                f"{time.monotonic() - started:.0f} s, so no offset is safe to start from or stop at",
                hint="Find it in pg_stat_activity (state 'idle in transaction'?) and end it, then retry.",
            )
        return watermark

    def _release(self, offset: Offset) -> None:
        if self.options.release == "none":
            return
        if self._releaser is None:
            archive = self.options.release == "archive"
            self._releaser = BackgroundRelease(self.options.dsn, self.options.queue, archive=archive)
        self._releaser.request(offset["floor"], offset["msg_id"])

    def _flush(self) -> None:
        if self._releaser is not None and not self._releaser.flush(RELEASE_WAIT_SECONDS):
            log.warning("pgbroker: queue %r: releasing committed messages is taking long", self.options.queue)
