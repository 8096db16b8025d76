"""Statistics of the queues a key can see: the dashboard's JSON feed and Prometheus' /metrics,
read from the replica when the server has one (with its replay lag)."""

from __future__ import annotations

from starlette.responses import Response

from pgbroker.http import metrics as prom
from pgbroker.http import stream_metrics
from pgbroker.http.models import StatsList
from pgbroker.http.operations import Call, Router

router = Router()


async def _replica_lag(call: Call) -> float | None:
    return await prom.replay_lag(call.broker) if call.from_replica else None


@router.get(
    "/v1/stats", "cheap statistics of the queues the key can see (the dashboard's feed)", reporting=True
)
async def stats(call: Call) -> StatsList:
    found = await prom.queue_stats(call.broker, call.settings.stats_exact_below)
    return StatsList(
        queues=[s for s in found if call.caller.sees(s.queue_name)],
        replica_lag_seconds=await _replica_lag(call),
    )


@router.get(
    "/metrics",
    "queue statistics in the Prometheus text format",
    access="metrics",
    media_type="text/plain",
    reporting=True,
)
async def metrics(call: Call) -> Response:
    found = await prom.queue_stats(call.broker, call.settings.stats_exact_below)
    schedules = await call.broker.schedules()
    streams = await stream_metrics.stream_group_stats(call.broker)
    if call.key is not None:
        found = [s for s in found if call.key.sees(s.queue_name)]
        schedules = [s for s in schedules if call.key.sees(s.queue_name)]
        streams = [s for s in streams if call.key.sees_stream_group(s.stream, s.group)]
    text = prom.render(found, schedules, await _replica_lag(call)) + stream_metrics.render(streams)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")
