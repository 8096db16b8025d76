"""Queues: list, create (idempotent), drop, exact metrics and purge."""

from __future__ import annotations

from pgbroker.http.errors import ApiError
from pgbroker.http.models import Created, CreateQueue, Dropped, Purged, QueueList
from pgbroker.http.operations import Call, Router
from pgbroker.queues._records import Metrics

router = Router()


@router.get("/v1/queues", "list the queues the key can see", reporting=True)
async def list_queues(call: Call) -> QueueList:
    queues = await call.broker.list_queues()
    return QueueList(queues=[q for q in queues if call.caller.sees(q.queue_name)])


@router.post(
    "/v1/queues",
    "create a queue (idempotent)",
    scope="admin",
    scope_field="name",
    status=201,
    errors={409: "queue_name_conflict"},
)
async def create_queue(call: Call, body: CreateQueue) -> Created:
    await call.broker.create_queue(body.name, unlogged=body.unlogged, notify=body.notify)
    return Created(queue_name=body.name)


@router.delete("/v1/queues/{queue}", "drop a queue and its archive", scope="admin")
async def drop_queue(call: Call) -> Dropped:
    if not await call.broker.drop_queue(call.queue):
        raise ApiError(404, "queue_not_found", f'queue "{call.queue}" does not exist')
    return Dropped(dropped=call.queue)


@router.get("/v1/queues/{queue}/metrics", "exact lengths and ages of one queue", scope="read", reporting=True)
async def queue_metrics(call: Call) -> Metrics:
    return await call.broker.metrics(call.queue)


@router.post("/v1/queues/{queue}/purge", "delete every message of the queue", scope="admin")
async def purge(call: Call) -> Purged:
    return Purged(purged=await call.broker.queue(call.queue).purge())
