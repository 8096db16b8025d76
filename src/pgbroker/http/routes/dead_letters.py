"""A queue's dead letters: listed oldest first (their headers say why), shown one by one with every
failed attempt, replayed to the queue as new messages, and purged. A letter's id is the msg_id it
had in the queue, the one its consumers saw and logged."""

from __future__ import annotations

from pgbroker.errors import InvalidArgument
from pgbroker.http.errors import ApiError
from pgbroker.http.models import (
    DeadLetterQuery,
    Message,
    Messages,
    MsgIds,
    Purged,
    ReplayBody,
    Replayed,
    ReplayedPair,
)
from pgbroker.http.operations import Call, Router
from pgbroker.http.validation import BIGINT_MAX

router = Router()


@router.get(
    "/v1/queues/{queue}/dead-letters",
    "the queue's dead letters, oldest first (headers say why: x-pgbroker-dead-letter)",
    scope="read",
    reporting=True,
)
async def dead_letters(call: Call, query: DeadLetterQuery) -> Messages:
    found = await call.broker.queue(call.queue).dead_letters(query.limit, after=query.after)
    return Messages(messages=[Message.of(m) for m in found])


@router.post(
    "/v1/queues/{queue}/dead-letters/replay",
    "send dead letters back to their queue as new messages: all, or those of msg_ids",
    scope="admin",
    body_required=False,
    errors={503: "queue_full (max_depth reached; see Retry-After) or database error"},
)
async def replay_dead_letters(call: Call, body: ReplayBody) -> Replayed:
    msg_ids = body.msg_ids if "msg_ids" in body.model_fields_set else None
    replayed = await call.broker.queue(call.queue).replay_dead_letters(msg_ids)
    return Replayed(
        replayed=[ReplayedPair(dead_letter_id=old, msg_id=new) for old, new in sorted(replayed.items())]
    )


@router.post(
    "/v1/queues/{queue}/dead-letters/purge",
    "delete dead letters: those of msg_ids (the dashboard's message browser deletes one)",
    scope="admin",
)
async def purge_dead_letters(call: Call, body: MsgIds) -> Purged:
    return Purged(purged=await call.broker.queue(call.queue).purge_dead_letters(body.msg_ids))


@router.get(
    "/v1/queues/{queue}/dead-letters/{msg_id}",
    "one dead letter, by the msg_id it had in the queue, with every failed attempt"
    " (headers x-pgbroker-dead-letter and x-pgbroker-attempts)",
    scope="read",
    errors={404: "dead_letter_not_found"},
)
async def dead_letter(call: Call) -> Message:
    msg_id = _path_msg_id(call)
    found = await call.broker.queue(call.queue).dead_letter(msg_id)
    if found is None:
        raise ApiError(404, "dead_letter_not_found", f'no dead letter {msg_id} from queue "{call.queue}"')
    return Message.of(found)


def _path_msg_id(call: Call) -> int:
    msg_id: int = call.request.path_params["msg_id"]  # digits only (the route's int convertor)
    if not 1 <= msg_id <= BIGINT_MAX:
        raise InvalidArgument(f"msg_id must be a positive 64-bit integer, got {msg_id}")
    return msg_id
