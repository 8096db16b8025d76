"""/metrics: queue statistics in the Prometheus text format, from pgbroker.queue_stats(), and the
replay lag of the replica they come from when the server reports from one.

The statistics are read asynchronously per scrape and handed to a collector on a registry made
for that scrape: prometheus_client's collectors are synchronous, and a scrape must reflect the
database now, not a cache.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from pgbroker import _sql as sql
from pgbroker.errors import from_postgres
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.queues._records import Schedule


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A row of pgbroker.queue_stats(): counts past ``exact_below`` are estimates."""

    queue_name: str
    queue_length: int
    visible_length: int
    length_is_estimate: bool
    oldest_msg_age_sec: float | None
    newest_msg_age_sec: float | None
    total_sent: int
    dead_letter_length: int | None
    scrape_time: datetime
    total_consumed: int  # pgbroker.messages_consumed(): approximate, resets with the statistics
    paused: bool  # pgbroker.pause()
    in_flight: int  # pgbroker.queue_activity(): delivered, not visible again yet
    total_retried: int  # failed deliveries given back with the back-off
    total_dead_lettered: int


async def queue_stats(broker: AsyncBroker, exact_below: int = 10_000) -> list[QueueStats]:
    async with broker.connection() as conn:
        try:
            query = sql.queries("http")["queue_stats_for_metrics"]
            cur = await conn.execute(query, {"exact_below": exact_below})
            rows = await cur.fetchall()
        except psycopg.Error as exc:
            raise from_postgres(exc) from exc
    return [QueueStats(*row) for row in rows]


async def replay_lag(broker: AsyncBroker) -> float:
    """Seconds the server of ``broker`` is behind its primary (0 on a primary, or on a standby
    that has replayed everything its running WAL receiver got)."""
    async with broker.connection() as conn:
        try:
            cur = await conn.execute(sql.queries("http")["replica_replay_lag"])
            row = await cur.fetchone()
        except psycopg.Error as exc:
            raise from_postgres(exc) from exc
    assert row is not None
    return float(row[0])


class _QueueCollector(Collector):
    def __init__(self, stats: Sequence[QueueStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["queue"])

        length = gauge("pgbroker_queue_length", "Messages in the queue (estimated past a bound).")
        visible = gauge("pgbroker_queue_visible_length", "Messages a read could take now.")
        estimated = gauge("pgbroker_queue_length_estimated", "1 when the lengths are planner estimates.")
        oldest = gauge("pgbroker_queue_oldest_message_age_seconds", "Age of the oldest message.")
        newest = gauge("pgbroker_queue_newest_message_age_seconds", "Age of the newest message.")
        dead = gauge("pgbroker_queue_dead_letters", "Dead letters of the queue (absent when costly).")
        paused = gauge("pgbroker_queue_paused", "1 while the queue is paused: its reads return nothing.")
        in_flight = gauge("pgbroker_queue_in_flight", "Messages delivered and not visible again yet.")
        retried = CounterMetricFamily(
            "pgbroker_queue_messages_retried",
            "Failed deliveries given back with the back-off.",
            labels=["queue"],
        )
        dead_lettered = CounterMetricFamily(
            "pgbroker_queue_messages_dead_lettered", "Messages dead-lettered.", labels=["queue"]
        )
        sent = CounterMetricFamily(
            "pgbroker_queue_messages_sent",
            "Messages ever sent to the queue (its msg_id sequence).",
            labels=["queue"],
        )
        # The consume rate is rate() of this counter: the server keeps no clock of its own.
        consumed = CounterMetricFamily(
            "pgbroker_queue_messages_consumed",
            "Messages removed from the queue: acked, deleted, archived, popped or dead-lettered"
            " (from Postgres' table statistics: approximate, reset with them).",
            labels=["queue"],
        )
        for s in self._stats:
            labels = [s.queue_name]
            length.add_metric(labels, s.queue_length)
            visible.add_metric(labels, s.visible_length)
            estimated.add_metric(labels, 1.0 if s.length_is_estimate else 0.0)
            # An empty queue has no oldest message: 0 keeps age alerts quiet and series continuous.
            oldest.add_metric(labels, s.oldest_msg_age_sec or 0.0)
            newest.add_metric(labels, s.newest_msg_age_sec or 0.0)
            sent.add_metric(labels, s.total_sent)
            consumed.add_metric(labels, s.total_consumed)
            paused.add_metric(labels, 1.0 if s.paused else 0.0)
            in_flight.add_metric(labels, s.in_flight)
            retried.add_metric(labels, s.total_retried)
            dead_lettered.add_metric(labels, s.total_dead_lettered)
            if s.dead_letter_length is not None:
                dead.add_metric(labels, s.dead_letter_length)
        yield from (length, visible, estimated, oldest, newest, sent, consumed, dead, paused, in_flight)
        yield from (retried, dead_lettered)


class _ScheduleCollector(Collector):
    """The cron schedules (sql/functions/78_schedules.sql): when each ticks next and ticked last. An
    alert on ``time() - pgbroker_schedule_next_run_timestamp_seconds > 60`` finds schedules no
    scheduler is sending."""

    def __init__(self, schedules: Sequence[Schedule]) -> None:
        self._schedules = schedules

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["schedule", "queue"])

        next_run = gauge("pgbroker_schedule_next_run_timestamp_seconds", "Its next tick (Unix time).")
        last_run = gauge("pgbroker_schedule_last_run_timestamp_seconds", "Its last tick sent (Unix time).")
        paused = gauge("pgbroker_schedule_paused", "1 while the schedule is paused.")
        failed = gauge("pgbroker_schedule_last_send_failed", "1 when the queue refused the last tick's send.")
        for s in self._schedules:
            labels = [s.name, s.queue_name]
            next_run.add_metric(labels, s.next_run.timestamp())
            if s.last_run is not None:
                last_run.add_metric(labels, s.last_run.timestamp())
            paused.add_metric(labels, 1.0 if s.paused else 0.0)
            failed.add_metric(labels, 1.0 if s.last_error else 0.0)
        yield from (next_run, last_run, paused, failed)


class _ReplicaCollector(Collector):
    def __init__(self, lag: float) -> None:
        self._lag = lag

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "pgbroker_replica_replay_lag_seconds",
            "How far behind its primary the replica these figures come from is (0: caught up).",
            value=self._lag,
        )


def render(
    stats: Iterable[QueueStats], schedules: Iterable[Schedule] = (), replica_lag: float | None = None
) -> bytes:
    """The exposition text for these statistics (and the replica's lag, when they come from one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_QueueCollector(list(stats)))
    registry.register(_ScheduleCollector(list(schedules)))
    if replica_lag is not None:
        registry.register(_ReplicaCollector(replica_lag))
    return generate_latest(registry)
