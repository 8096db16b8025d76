"""The dashboard's memory and its view of the consumers: the stats history ``pgbroker serve``
samples into Postgres (pgbroker.sample_queue_history, sql/functions/96_monitoring.sql), so that
charts survive a reload and cover hours, and the workers and stream consumers running now.

Sampling runs in every server on its interval; the engine lets one of them write each sample.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg

from pgbroker import _sql as sql
from pgbroker._db.listen_async import nap
from pgbroker._db.liveness import answered_within, stops_with
from pgbroker.errors import from_postgres
from pgbroker.queues._client_async import AsyncBroker

log = logging.getLogger("pgbroker.http")

# The least time a sampling round may go unanswered before it is given up (a round takes
# milliseconds; its lock waits 2 s at most).
SAMPLE_ANSWER_WITHIN = 10.0


@dataclass(frozen=True, slots=True)
class HistorySample:
    """One queue's stats at one time; the counters' differences between samples are the rates."""

    queue_name: str
    sampled_at: datetime
    queue_length: int
    in_flight: int
    oldest_msg_age_sec: float | None
    total_sent: int
    total_consumed: int
    total_retried: int
    total_dead_lettered: int


@dataclass(frozen=True, slots=True)
class QueueWorker:
    """A queue worker of the runtime, as its last heartbeat told."""

    worker_id: UUID
    queue_name: str
    host: str
    pid: int
    concurrency: int
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_sec: float
    in_flight: int  # messages it holds now
    completed: int
    retried: int
    dead_lettered: int


@dataclass(frozen=True, slots=True)
class StreamConsumer:
    """A member of a stream's consumer group."""

    stream: str
    group: str
    consumer: str
    renewed_at: datetime
    expires_at: datetime
    renewed_age_sec: float


async def _rows(broker: AsyncBroker, name: str, params: dict[str, Any] | None = None) -> list[Any]:
    async with broker.connection() as conn:
        try:
            cur = await conn.execute(sql.queries("http")[name], params)
            return await cur.fetchall()
        except psycopg.Error as exc:
            raise from_postgres(exc) from exc


async def history(broker: AsyncBroker, minutes: int, points: int) -> list[HistorySample]:
    """The samples of the last ``minutes`` (on the server's clock), about ``points`` a queue."""
    rows = await _rows(broker, "history_since", {"minutes": minutes, "points": points})
    return [HistorySample(*row) for row in rows]


async def queue_workers(broker: AsyncBroker) -> list[QueueWorker]:
    return [QueueWorker(*row) for row in await _rows(broker, "queue_workers")]


async def stream_consumers(broker: AsyncBroker) -> list[StreamConsumer]:
    return [StreamConsumer(*row) for row in await _rows(broker, "stream_consumers")]


async def sample(broker: AsyncBroker, interval: timedelta, retention: timedelta, exact_below: int) -> int:
    """One round of sampling: the rows recorded (0 when another server had just sampled)."""
    params = {
        "interval": interval.total_seconds() * 0.9,  # the next round must not find its own sample fresh
        "retention": retention.total_seconds(),
        "exact_below": exact_below,
    }
    [(recorded,)] = await _rows(broker, "history_sample", params)
    result: int = recorded
    return result


async def keep_sampling(
    broker: AsyncBroker, interval: timedelta, retention: timedelta, exact_below: int, stopping: asyncio.Event
) -> None:
    """Sample every ``interval`` until ``stopping`` is set. A failed round (the database away) is
    logged once per outage and tried again next round: the API does not depend on it. A round
    unanswered within a few intervals (SAMPLE_ANSWER_WITHIN at least) fails too: a hung server, a
    stuck pooler or a network that drops packets without a word would otherwise stop the history
    for good. Once stopping, a round in flight gets STOP_PATIENCE at most (stops_with): cancelled
    instead, it waited for psycopg's cancellation of its query, 5 s more on a hung server."""
    failing = False
    within = max(SAMPLE_ANSWER_WITHIN, 3 * interval.total_seconds())
    with stops_with(stopping):
        while not stopping.is_set():
            try:
                await answered_within(within, sample(broker, interval, retention, exact_below))
                failing = False
            except Exception as exc:
                if stopping.is_set():
                    return
                if not failing:
                    log.warning("serve.history_sample_failed error=%s", json.dumps(str(exc)))
                failing = True
            await nap(stopping, None, interval.total_seconds())


__all__ = [
    "HistorySample",
    "QueueWorker",
    "StreamConsumer",
    "history",
    "keep_sampling",
    "queue_workers",
    "sample",
    "stream_consumers",
]
