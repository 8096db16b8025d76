"""Peek: a queue's messages in every state (or its dead letters) without changing them, filtered
and paged by msg_id (sql/functions/77_peek.sql). A read scope suffices: nothing is leased."""

from __future__ import annotations

from pgbroker.http.models import Message, PeekedMessage, PeekedMessages, PeekQuery
from pgbroker.http.operations import Call, Router

router = Router()


@router.get(
    "/v1/queues/{queue}/peek",
    "look at messages without taking them: no lease, no read count, no lock",
    scope="read",
    reporting=True,
)
async def peek(call: Call, query: PeekQuery) -> PeekedMessages:
    found = await call.broker.queue(call.queue).peek(
        query.limit,
        after=query.after,
        state=query.state,
        before=query.before,
        header=query.header,
        header_value=query.header_value,
        enqueued_after=query.enqueued_after,
        enqueued_before=query.enqueued_before,
        contains=query.body_fields,
    )
    messages = [PeekedMessage(**Message.of(m).model_dump(), state=m.state) for m in found]
    full = len(found) == query.limit
    return PeekedMessages(messages=messages, next_after=found[-1].msg_id if full else None)
