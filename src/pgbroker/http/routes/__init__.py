"""The API's operations, one module per resource: queues, their messages, their dead letters,
statistics and their history, workers, the calling key, and the service's own pages (health,
spec, reference, dashboard)."""

from __future__ import annotations

from pgbroker.http.operations import Operation
from pgbroker.http.routes import (
    dead_letters,
    keys,
    messages,
    monitoring,
    pause,
    peek,
    queues,
    schedules,
    service,
    stats,
    streams,
)

ROUTERS = (
    queues.router,
    pause.router,
    messages.router,
    peek.router,
    dead_letters.router,
    schedules.router,
    streams.router,
    stats.router,
    monitoring.router,
    keys.router,
    service.router,
)


def all_operations() -> tuple[Operation, ...]:
    return tuple(operation for router in ROUTERS for operation in router.operations)
