"""A queue's messages: send, read (lease), and settle by receipt (ack, nack, extend) or, unfenced,
by msg_id (archive, delete). A receipt form takes one receipt (a stale one answers 409) or a batch
(stale ones are listed in the answer)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from pgbroker.http.idempotency import IDEMPOTENCY_ERRORS, IDEMPOTENCY_KEY, SEND_HEADERS, idempotency_scope
from pgbroker.http.models import (
    AckBody,
    Acked,
    Archived,
    Deleted,
    ExtendBody,
    Extended,
    FailBody,
    Failed,
    Message,
    Messages,
    MsgIdList,
    MsgIds,
    NackBody,
    Nacked,
    OneReceipt,
    ReadBody,
    ReceiptBatch,
    Retried,
    SendBody,
    SendOne,
)
from pgbroker.http.operations import Call, Router
from pgbroker.queues._arguments import receipt_of
from pgbroker.queues._job_headers import with_job_headers

router = Router()
_SEND_ERRORS = {
    400: "invalid JSON, queue name, argument or message (invalid_message: a value the codec cannot "
    "encode), or unknown_codec (a codec the server does not know: see the hint)",
    501: "codec_not_installed (the server lacks the codec's library)",
    **IDEMPOTENCY_ERRORS,
    503: f"queue_full (max_depth reached; see Retry-After), {IDEMPOTENCY_ERRORS[503]}",
}
_STALE = {409: "stale_receipt (single receipt form only)"}
T = TypeVar("T")


@router.post(
    "/v1/queues/{queue}/messages",
    "send one message (message) or a batch (messages)",
    scope="send",
    status=201,
    errors=_SEND_ERRORS,
    headers=SEND_HEADERS,
)
async def send(call: Call, body: SendBody) -> MsgIdList:
    headers: list[Mapping[str, Any] | None]
    if isinstance(body, SendOne):
        one = with_job_headers(
            body.headers,
            priority=body.priority,
            dedup_key=body.dedup_key,
            concurrency_key=body.concurrency_key,
        )
        messages, headers = [body.message], [one]
    else:
        messages, headers = body.messages, list(body.headers or [None] * len(body.messages))
    ids = await call.broker.queue(call.queue).send_many(
        messages,
        headers=None if all(h is None for h in headers) else headers,
        delay=body.delay,
        codec=body.codec,
        idempotency_key=call.request.headers.get(IDEMPOTENCY_KEY),
        idempotency_scope=idempotency_scope(call.key),
    )
    return MsgIdList(msg_ids=ids)


@router.post(
    "/v1/queues/{queue}/read",
    "lease up to qty visible messages for vt seconds, waiting up to wait seconds",
    scope="read",
    body_required=False,
)
async def read(call: Call, body: ReadBody) -> Messages:
    found = await call.broker.queue(call.queue).read_many(body.qty, vt=body.vt, wait=body.wait)
    return Messages(messages=[Message.of(m) for m in found])


async def _settle(
    body: OneReceipt | ReceiptBatch,
    one: Callable[[str], Awaitable[T]],
    many: Callable[[list[str]], Awaitable[dict[int, T]]],
) -> tuple[dict[int, T], list[str]]:
    """What settling the body's receipts returned by msg_id, and the receipts that were stale.
    One receipt goes through the single call, so that a stale one raises (409)."""
    receipts = body.receipt_list()
    if isinstance(body, OneReceipt):
        done = {receipt_of(body.receipt).msg_id: await one(body.receipt)}
    else:
        done = await many(receipts)
    return done, [r for r in receipts if receipt_of(r).msg_id not in done]


def _by_msg_id(
    settled: Callable[[list[str]], Awaitable[list[int]]],
) -> Callable[[list[str]], Awaitable[dict[int, None]]]:
    async def settle(receipts: list[str]) -> dict[int, None]:
        return dict.fromkeys(await settled(receipts))

    return settle


@router.post("/v1/queues/{queue}/ack", "acknowledge by receipt", scope="read", errors=_STALE)
async def ack(call: Call, body: AckBody) -> Acked:
    q = call.broker.queue(call.queue)
    done, stale = await _settle(
        body,
        lambda r: q.ack(r, archive=body.archive),
        _by_msg_id(lambda rs: q.ack_many(rs, archive=body.archive)),
    )
    return Acked(acked=list(done), stale=stale)


@router.post(
    "/v1/queues/{queue}/fail",
    "report failed deliveries by the queue's policy: retried after its back-off, or dead-lettered after"
    " max_deliveries; the error and traceback are kept with each message",
    scope="read",
    errors=_STALE,
)
async def fail(call: Call, body: FailBody) -> Failed:
    q = call.broker.queue(call.queue)
    done, stale = await _settle(
        body,
        lambda r: q.fail(r, error=body.error, traceback=body.traceback),
        lambda rs: q.fail_many(rs, error=body.error, traceback=body.traceback),
    )
    return Failed(outcomes={str(msg_id): outcome for msg_id, outcome in done.items()}, stale=stale)


@router.post(
    "/v1/queues/{queue}/nack", "give messages back, visible after delay seconds", scope="read", errors=_STALE
)
async def nack(call: Call, body: NackBody) -> Nacked:
    q = call.broker.queue(call.queue)
    done, stale = await _settle(
        body, lambda r: q.nack(r, delay=body.delay), _by_msg_id(lambda rs: q.nack_many(rs, delay=body.delay))
    )
    return Nacked(nacked=list(done), stale=stale)


@router.post(
    "/v1/queues/{queue}/extend",
    "extend leases to vt seconds from now; returns the new receipts by msg_id",
    scope="read",
    errors=_STALE,
)
async def extend(call: Call, body: ExtendBody) -> Extended:
    q = call.broker.queue(call.queue)
    done, stale = await _settle(
        body, lambda r: q.extend(r, vt=body.vt), lambda rs: q.extend_many(rs, vt=body.vt)
    )
    return Extended(receipts={str(msg_id): str(r) for msg_id, r in done.items()}, stale=stale)


@router.post("/v1/queues/{queue}/archive", "archive messages by msg_id (unfenced)", scope="read")
async def archive(call: Call, body: MsgIds) -> Archived:
    return Archived(archived=await call.broker.queue(call.queue).archive_many(body.msg_ids))


@router.post("/v1/queues/{queue}/delete", "delete messages by msg_id (unfenced)", scope="read")
async def delete(call: Call, body: MsgIds) -> Deleted:
    return Deleted(deleted=await call.broker.queue(call.queue).delete_many(body.msg_ids))


@router.post(
    "/v1/queues/{queue}/retry",
    "make messages visible now, by msg_id: a delayed one, one waiting out a back-off, or a leased one"
    " (its holder's receipt then no longer holds)",
    scope="admin",
)
async def retry_now(call: Call, body: MsgIds) -> Retried:
    queue = call.broker.queue(call.queue)
    retried = [msg_id for msg_id in dict.fromkeys(body.msg_ids) if await queue.set_vt(msg_id, 0)]
    return Retried(retried=retried)
