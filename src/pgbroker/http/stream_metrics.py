"""Lag per stream and consumer group, for /metrics (Prometheus) and the dashboard's feed, from
pgbroker.stream_groups() of every stream (sql/functions/92_streams.sql)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import psycopg
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from pgbroker import _sql as sql
from pgbroker.errors import from_postgres
from pgbroker.queues._client_async import AsyncBroker


@dataclass(frozen=True, slots=True)
class StreamGroupStats:
    stream: str
    group: str
    lag: int  # messages kept beyond the group's cursors
    oldest_unacked_age_sec: float | None
    consumers: int  # live consumers
    retry_queue: str | None  # None: a queue the key does not see (RETRY_QUEUE_UNSEEN)


RETRY_QUEUE_UNSEEN = (
    "the group's retry queue; null when the key's patterns do not cover it (a retry queue may be"
    " named by hand, outside the stream's patterns)"
)


async def stream_group_stats(broker: AsyncBroker) -> list[StreamGroupStats]:
    async with broker.connection() as conn:
        try:
            cur = await conn.execute(sql.queries("http")["stream_group_stats_for_metrics"])
            rows = await cur.fetchall()
        except psycopg.errors.UndefinedFunction:
            return []  # a database from before streams (the server may be newer than its schema)
        except psycopg.Error as exc:
            raise from_postgres(exc) from exc
    return [StreamGroupStats(*row) for row in rows]


class _StreamCollector(Collector):
    def __init__(self, stats: Sequence[StreamGroupStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["stream", "group"])

        lag = gauge("pgbroker_stream_lag", "Messages of the stream beyond the group's acknowledged cursors.")
        age = gauge(
            "pgbroker_stream_oldest_unacked_seconds",
            "Age of the group's oldest unacknowledged message (0: none).",
        )
        consumers = gauge("pgbroker_stream_consumers", "Live consumers of the group.")
        for s in self._stats:
            labels = [s.stream, s.group]
            lag.add_metric(labels, s.lag)
            age.add_metric(labels, s.oldest_unacked_age_sec or 0.0)
            consumers.add_metric(labels, s.consumers)
        yield from (lag, age, consumers)


def render(stats: Iterable[StreamGroupStats]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StreamCollector(list(stats)))
    return generate_latest(registry)


__all__ = ["StreamGroupStats", "render", "stream_group_stats"]
