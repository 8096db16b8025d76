"""What the dashboard keeps open: the stats history the server samples (so that its charts survive
a reload and cover hours), and the workers and stream consumers running now."""

from __future__ import annotations

from pgbroker.http import monitoring
from pgbroker.http.models import History, HistoryQuery, Workers
from pgbroker.http.operations import Call, Router

router = Router()


@router.get(
    "/v1/stats/history",
    "samples of the stats of the queues the key can see, over the last minutes (the dashboard's charts)",
    reporting=True,
)
async def stats_history(call: Call, query: HistoryQuery) -> History:
    samples = await monitoring.history(call.broker, query.minutes, query.points)
    settings = call.settings
    return History(
        interval_seconds=settings.history_interval_seconds if settings.history_retention_seconds else 0,
        retention_seconds=settings.history_retention_seconds,
        samples=[s for s in samples if call.caller.sees(s.queue_name)],
    )


@router.get(
    "/v1/workers",
    "the queue workers and stream consumers (of the groups the key may use) of what the key can see, and"
    " their heartbeats",
    reporting=True,
)
async def workers(call: Call) -> Workers:
    queue_workers = await monitoring.queue_workers(call.broker)
    consumers = await monitoring.stream_consumers(call.broker)
    return Workers(
        queue_workers=[w for w in queue_workers if call.caller.sees(w.queue_name)],
        stream_consumers=[c for c in consumers if call.caller.sees_stream_group(c.stream, c.group)],
    )
