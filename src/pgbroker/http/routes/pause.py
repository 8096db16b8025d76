"""Pause and resume a queue: while paused every read of it returns nothing; sends go on."""

from __future__ import annotations

from pgbroker.http.models import PauseState
from pgbroker.http.operations import Call, Router

router = Router()


@router.post("/v1/queues/{queue}/pause", "stop every read of the queue (sends still succeed)", scope="admin")
async def pause(call: Call) -> PauseState:
    changed = await call.broker.queue(call.queue).pause()
    return PauseState(queue_name=call.queue, paused=True, changed=changed)


@router.post("/v1/queues/{queue}/resume", "let the queue's messages be read again", scope="admin")
async def resume(call: Call) -> PauseState:
    changed = await call.broker.queue(call.queue).resume()
    return PauseState(queue_name=call.queue, paused=False, changed=changed)
