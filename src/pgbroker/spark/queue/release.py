"""Log mode's release of committed ranges, on a thread of the driver's source process, so that
archiving batch N (about 0.6 s per 100,000 messages here) overlaps reading and writing batch N+1.

Releases are cumulative (after_id < msg_id <= up_to, see pgbroker.spark_release), so only the
highest range asked for matters and a lost one is redone by the next: a restarted query releases
everything up to its start offset again. The thread's connection only deletes from the queue and
inserts into the archive, never sends, so the safe watermark need not wait for it (its backend
pid is passed to pgbroker.spark_safe_watermark as one to ignore). A release that the server does
not answer (a hung server, a frozen session: pgbroker.spark.bounded) fails as a lost connection
and is tried again on a new one.
"""

from __future__ import annotations

import logging
import threading

from pgbroker import _sql
from pgbroker._db.backoff import Backoff
from pgbroker.spark.connect import KeptConnection

log = logging.getLogger("pgbroker.spark")

RETRY_SECONDS = 1.0
# How long a release may go without an answer before its connection counts as lost (a hung
# server); archiving takes about 0.6 s per 100,000 messages here. Each try after a release given
# up this way waits twice as long, up to RELEASE_ANSWER_MOST: a release that is merely that slow
# ends.
RELEASE_ANSWER_SECONDS = 120.0
RELEASE_ANSWER_MOST = 3600.0


class BackgroundRelease:
    def __init__(
        self, dsn: str, queue: str, *, archive: bool, answer_within: float = RELEASE_ANSWER_SECONDS
    ) -> None:
        self.queue = queue
        self.archive = archive
        self._answer_within = Backoff(answer_within, max(answer_within, RELEASE_ANSWER_MOST), jitter=0)
        self._cond = threading.Condition()
        self._wanted: tuple[int, int] | None = None  # (after_id, up_to) of the highest request
        self._done = -1
        self._stopping = False
        self._conn = KeptConnection(dsn, role="release")
        self._thread: threading.Thread | None = None

    @property
    def backend_pid(self) -> int | None:
        return self._conn.backend_pid

    def request(self, after_id: int, up_to: int) -> None:
        """Release after_id < msg_id <= up_to soon; returns at once."""
        with self._cond:
            if up_to <= max(self._done, self._wanted[1] if self._wanted else -1):
                return
            self._wanted = (after_id, up_to)
            if self._thread is None:
                self._conn.open()  # its pid known before the first release: the watermark ignores it
                self._thread = threading.Thread(
                    target=self._run, name=f"pgbroker-release-{self.queue}", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every request so far is done; False if that took longer than timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._wanted is None, timeout)

    def stop(self, timeout: float = 60.0) -> None:
        if not self.flush(timeout):
            log.warning(
                "pgbroker: queue %r: the last release did not finish; a restart redoes it", self.queue
            )
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._conn.close()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._wanted is not None or self._stopping)
                if self._wanted is None:
                    return
                after_id, up_to = self._wanted
                # Below _done everything is gone already: a narrower range scans less.
                after_id = max(after_id, self._done)
            try:
                self._conn.scalar(
                    _sql.queries("spark_queue")["spark_queue_release"],
                    (self.queue, after_id, up_to, self.archive),
                    within=self._answer_within.next(),
                )
            except Exception as exc:  # the database went away, say: retry, the range is still wanted
                log.warning(
                    "pgbroker: queue %r: releasing up to %d failed (%s); retrying", self.queue, up_to, exc
                )
                with self._cond:
                    if self._cond.wait_for(lambda: self._stopping, RETRY_SECONDS):
                        self._wanted = None
                        self._cond.notify_all()
                        return
                continue
            self._answer_within.reset()
            with self._cond:
                self._done = max(self._done, up_to)
                if self._wanted is not None and self._wanted[1] <= self._done:
                    self._wanted = None
                self._cond.notify_all()
