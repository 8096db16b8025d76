"""Streaming read in claim mode: Spark shares the queue with other consumers, through pgbroker's
fenced read, extend and ack.

A micro-batch is a claim: messages leased with pgbroker.read and recorded, with their receipts,
as (consumer, seq) in pgbroker.spark_claims (see migration 0007). Offsets are
{"queue", "consumer", "seq"}; the batch after seq s is claim s + 1. A claim is made when Spark
asks for the next offset and reused, never read anew, if it already exists (Spark crashed after
asking), so a replayed batch reads the same messages. A thread of the driver's source process
renews the leases of unreleased claims every third of the lease; a message whose lease was lost
anyway leaves its claim (another consumer has it now). Claims are acknowledged, archiving or
deleting their messages, once Spark has committed their batch: in commit(end) and when Spark
asks for the next offset, as in log mode.

pgbroker.read follows the queue's pause and limits, so claims do too: a paused queue gives no
claim (the query idles, and resumes with the queue), and a claim takes what the limits allow,
its messages counting as in flight until their batch is committed (82_spark.sql).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pgbroker import _sql
from pgbroker._db.backoff import Backoff
from pgbroker.spark.arrow_read import copy_batches
from pgbroker.spark.bounded import driver_answer_within
from pgbroker.spark.connect import Connection, KeptConnection, connect, queue_table, scalar
from pgbroker.spark.options import MAX_CLAIM, ReadOptions
from pgbroker.spark.queue.partitions import ClaimPartition, split
from pgbroker.spark.queue.pause_log import PauseLog
from pgbroker.spark.queue.streaming_log import CheckpointMismatch

log = logging.getLogger("pgbroker.spark")

Offset = dict[str, Any]

# Trigger.AvailableNow on a limited queue: how often a claim the limits left empty is tried again,
# and how often the wait is logged.
LIMITED_RETRY_SECONDS = 0.2
LIMITED_WARN_SECONDS = 30.0
# The first pause before a failed lease renewal is tried again.
RETRY_SECONDS = 1.0


class LeaseRenewer:
    """Renews a consumer's claims every third of the lease, on its own connection and thread.

    A renewal the server does not answer within a sixth of the lease (a hung server, a frozen
    session) fails as a lost connection; failed renewals are tried again on a new connection
    after a pause that doubles from RETRY_SECONDS (at most a sixth of the lease) up to a third of
    it. A round that hangs then leaves, of the lease renewed a third of it earlier, a third for
    the next try."""

    def __init__(self, dsn: str, consumer: str, lease_seconds: int) -> None:
        self.consumer = consumer
        self.lease_seconds = lease_seconds
        self._conn = KeptConnection(dsn, role="lease renewer")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"pgbroker-renew-{self.consumer}", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._conn.close()

    def renew(self) -> int:
        """Renew now; returns how many leases were found lost."""
        lost = self._conn.scalar(
            _sql.queries("spark_queue")["spark_queue_renew"],
            (self.consumer, self.lease_seconds),
            within=self.lease_seconds / 6,
        )
        return int(lost or 0)

    def _run(self) -> None:
        every = self.lease_seconds / 3
        retries = Backoff(min(RETRY_SECONDS, self.lease_seconds / 6), every)
        pause = every
        while not self._stop.wait(pause):
            try:
                lost = self.renew()
            except Exception as exc:  # the lease still held leaves time to try again
                pause = retries.next()
                log.warning(
                    "pgbroker: consumer %r: renewing leases failed (%s); trying again in %.1f s",
                    self.consumer,
                    exc,
                    pause,
                )
                continue
            retries.reset()
            pause = every
            if lost:
                log.warning(
                    "pgbroker: consumer %r lost the lease of %d claimed messages; another consumer "
                    "may process them (raise leaseSeconds if batches take longer than it)",
                    self.consumer,
                    lost,
                )


class ClaimStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    # Called in several Spark processes: no connection, no thread here (see start of renewals).
    def __init__(self, options: ReadOptions) -> None:
        assert options.consumer is not None
        self.options = options
        self.consumer = options.consumer
        self._released = -1
        self._target: int | None = None
        self._table: str | None = None
        self._renewer: LeaseRenewer | None = None
        self._paused = PauseLog(options.queue)

    def __getstate__(self) -> dict[str, Any]:
        # The background thread and its connection belong to the driver's process: a copy
        # shipped elsewhere starts without them.
        return {**self.__dict__, "_renewer": None}

    # -- offsets (driver) -------------------------------------------------------------------------

    def initialOffset(self) -> Offset:
        with self._connect() as conn:
            seq = scalar(
                conn, _sql.queries("spark_queue")["spark_queue_consumer"], (self.consumer, self.options.queue)
            )
        return {"queue": self.options.queue, "consumer": self.consumer, "seq": int(seq)}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_rows_per_batch is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_rows_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        # Claims take nothing sent after this: the newest msg_id handed out so far.
        with self._connect() as conn:
            self._target = int(
                scalar(
                    conn,
                    _sql.queries("spark_queue")["spark_queue_last_msg_id"],
                    (self.options.queue,),
                )
            )

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        self._check(start)
        qty = min(limit.max_rows, MAX_CLAIM) if isinstance(limit, ReadMaxRows) else MAX_CLAIM
        with self._connect() as conn:
            # Spark asks for the next offset only once the batch ending at start is committed.
            self._release(conn, start["seq"])
            claimed = self._claim(conn, start["seq"] + 1, qty)
        if not claimed:
            return start
        if self._renewer is None:
            self._renewer = LeaseRenewer(self.options.dsn, self.consumer, self.options.lease_seconds)
            self._renewer.start()
        return {**start, "seq": start["seq"] + 1}

    def partitions(self, start: Offset, end: Offset) -> Sequence[ClaimPartition]:
        self._check(start)
        self._check(end)
        with self._connect() as conn:
            table = self._table_name(conn)
            claims = conn.execute(
                _sql.queries("spark_queue")["spark_queue_claims_between"],
                (self.consumer, start["seq"], end["seq"]),
            ).fetchall()
        found = [seq for seq, _ in claims]
        if found != list(range(start["seq"] + 1, end["seq"] + 1)):
            raise CheckpointMismatch(
                f"consumer {self.consumer!r}: claims {start['seq'] + 1}..{end['seq']} are needed to "
                f"replay this batch, but only {found or 'none'} exist: they were released by another "
                "query using the same consumer name",
                hint="Give every streaming query its own consumer name.",
            )
        cols = self.options.columns
        return [
            ClaimPartition(table, cols, self.consumer, seq, a, b)
            for seq, size in claims
            for a, b in split(1, size, self.options.num_partitions)
        ]

    def commit(self, end: Offset) -> None:
        self._check(end)
        with self._connect() as conn:
            self._release(conn, end["seq"])

    def stop(self) -> None:
        if self._renewer is not None:
            self._renewer.stop()

    # -- data (executors) -------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, ClaimPartition)
        with connect(self.options.dsn, role="reader") as conn:
            yield from copy_batches(conn, partition.select(), partition.columns, body=self.options.body)

    # -- helpers ----------------------------------------------------------------------------------

    def _connect(self) -> Any:
        return connect(self.options.dsn, role="stream source", answer_within=driver_answer_within())

    def _table_name(self, conn: Connection) -> str:
        if self._table is None:
            self._table = queue_table(conn, self.options.queue)
        return self._table

    def _check(self, offset: Offset) -> None:
        if (offset.get("queue"), offset.get("consumer")) != (
            self.options.queue,
            self.consumer,
        ) or "seq" not in offset:
            raise CheckpointMismatch(
                f"the checkpoint's offset {offset} is not one of this stream "
                f"(queue {self.options.queue!r}, claim mode, consumer {self.consumer!r})",
                hint="Use a new checkpointLocation for a different queue, mode or consumer.",
            )

    def _claim(self, conn: Connection, seq: int, qty: int) -> int:
        """Claim seq; how many messages it holds. An empty claim of a paused queue is logged;
        under Trigger.AvailableNow, one that the queue's limits left empty is tried again until
        they give room (ending the run would leave messages it was to read)."""
        waited_since = time.monotonic()
        warned_at = waited_since
        while True:
            claimed = scalar(
                conn,
                _sql.queries("spark_queue")["spark_queue_claim"],
                (self.consumer, seq, qty, self.options.lease_seconds, self._target),
            )
            if claimed:
                self._paused.note(False)
                return int(claimed)
            held = scalar(
                conn, _sql.queries("spark_queue")["spark_queue_held_back"], (self.options.queue, self._target)
            )
            self._paused.note(held == "paused")
            if held != "limited" or self._target is None:
                return 0
            if time.monotonic() - warned_at >= LIMITED_WARN_SECONDS:
                warned_at = time.monotonic()
                log.warning(
                    "pgbroker: queue %r: its limits have given this run no room for %.0f s",
                    self.options.queue,
                    warned_at - waited_since,
                )
            time.sleep(LIMITED_RETRY_SECONDS)

    def _release(self, conn: Connection, seq: int) -> None:
        if self.options.release == "none" or seq <= self._released:
            return
        scalar(
            conn,
            _sql.queries("spark_queue")["spark_queue_release_claims"],
            (self.consumer, seq, self.options.release == "archive"),
        )
        self._released = seq
