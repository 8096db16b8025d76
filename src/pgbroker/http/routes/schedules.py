"""Schedules: cron schedules that send a message to a queue at every tick (sql/functions/78_schedules.sql).

A key sees, and with the admin scope changes, the schedules of the queues its patterns match; a
schedule of another queue answers 404, as if it did not exist.
"""

from __future__ import annotations

from pgbroker.http.errors import ApiError
from pgbroker.http.models import AddSchedule, ScheduleList, ScheduleRemoved
from pgbroker.http.operations import Call, Router
from pgbroker.queues._records import Schedule

router = Router()

_MISSING = {404: "schedule_not_found"}


@router.get("/v1/schedules", "the schedules of the queues the key can see", scope="read", reporting=True)
async def list_schedules(call: Call) -> ScheduleList:
    schedules = await call.broker.schedules()
    return ScheduleList(schedules=[s for s in schedules if call.caller.sees(s.queue_name)])


@router.post(
    "/v1/schedules",
    "add a schedule (or redefine one, with replace)",
    scope="admin",
    scope_field="queue",
    status=201,
    errors={404: "queue_not_found"},
)
async def add_schedule(call: Call, body: AddSchedule) -> Schedule:
    # The scope is checked on the body's queue, and the engine replaces a schedule of that name
    # whatever queue it sends to: only one of a queue the key sees is replaced; one of another
    # queue is refused as a taken name is without replace (the key learns nothing more).
    replace = body.replace and any(
        s.name == body.name and call.caller.sees(s.queue_name) for s in await call.broker.schedules()
    )
    return await call.broker.add_schedule(
        body.name,
        body.queue,
        body.cron,
        body.message,
        headers=body.headers,
        timezone=body.timezone,
        replace=replace,
    )


async def _visible(call: Call) -> str:
    """The path's schedule name, when the key may see its queue; else 404."""
    name: str = call.request.path_params["name"]
    for schedule in await call.broker.schedules():
        if schedule.name == name and call.caller.sees(schedule.queue_name):
            return name
    raise ApiError(404, "schedule_not_found", f'schedule "{name}" does not exist')


@router.delete("/v1/schedules/{name}", "remove a schedule", scope="admin", errors=_MISSING)
async def remove_schedule(call: Call) -> ScheduleRemoved:
    name = await _visible(call)
    await call.broker.remove_schedule(name)
    return ScheduleRemoved(removed=name)


@router.post("/v1/schedules/{name}/pause", "stop sending a schedule's ticks", scope="admin", errors=_MISSING)
async def pause_schedule(call: Call) -> Schedule:
    return await call.broker.pause_schedule(await _visible(call))


@router.post(
    "/v1/schedules/{name}/resume",
    "send a paused schedule's ticks again, from the next one",
    scope="admin",
    errors=_MISSING,
)
async def resume_schedule(call: Call) -> Schedule:
    return await call.broker.resume_schedule(await _visible(call))
