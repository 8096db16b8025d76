"""Streams (docs/streams.md): list, create, drop, send, groups with their lag, and a group's
consumers reading batches and acknowledging them. A key's queue patterns apply to stream names,
its group patterns to the groups: a group it may not use is answered as one that does not exist,
and left out of every list."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime
from typing import NoReturn

import psycopg

from pgbroker import _sql as sql
from pgbroker._db.names import check_stream_name
from pgbroker.errors import from_postgres
from pgbroker.http import stream_metrics
from pgbroker.http.errors import ApiError
from pgbroker.http.idempotency import IDEMPOTENCY_ERRORS, IDEMPOTENCY_KEY, SEND_HEADERS, idempotency_scope
from pgbroker.http.operations import Call, Router
from pgbroker.http.stream_models import (
    GROUP_NAME_PATTERN,
    STREAM_NAME_PATTERN,
    AckResult,
    CreateGroup,
    CreateStream,
    GroupCreated,
    GroupDropped,
    GroupInfo,
    GroupList,
    HeartbeatAnswer,
    OwnedPartition,
    StreamAck,
    StreamAcked,
    StreamBatch,
    StreamDropped,
    StreamHeartbeat,
    StreamIds,
    StreamList,
    StreamRead,
    StreamSendBatch,
    StreamStatsList,
)
from pgbroker.streams import _client_async as aio_streams
from pgbroker.streams._client_async import AsyncStream
from pgbroker.streams._records import StreamBatch as Batch
from pgbroker.streams._records import StreamInfo as Info
from pgbroker.streams._records import StreamMessage as Read

router = Router()

_QUERIES = sql.queries("http")

_EPOCH = datetime.fromtimestamp(0, UTC)  # an ack range needs no send time


def _stream(call: Call, scope: str) -> AsyncStream:
    """The stream of the path, once the key may do ``scope`` on it."""
    name = check_stream_name(call.request.path_params["stream"])
    if not re.match(STREAM_NAME_PATTERN, name):
        raise ApiError(404, "stream_not_found", f"no stream may be named {name!r}")
    if not call.caller.allows(scope, name):
        raise ApiError(403, "forbidden", f"key {call.caller.name!r} may not {scope} on stream {name!r}")
    return AsyncStream(call.broker, name)


async def _group(call: Call, stream: AsyncStream) -> str:
    """The group of the path, once the key may use it: one its group patterns do not cover is
    answered as a group the stream does not have, whether it has it or not."""
    group: str = call.request.path_params["group"]
    if not re.match(GROUP_NAME_PATTERN, group):
        raise ApiError(404, "stream_group_not_found", f"no group may be named {group!r}")
    if not call.caller.sees_group(group):
        await _refuse_as_missing(call, stream.name, group)
    return group


async def _refuse_as_missing(call: Call, stream: str, group: str) -> NoReturn:
    """The engine's own refusal of a group the stream does not have (of the stream, when it does
    not exist either), word for word."""
    async with call.broker.connection() as conn:
        try:
            await conn.execute(_QUERIES["stream_group_unseen"], {"stream": stream, "group": group})
        except psycopg.Error as exc:
            raise from_postgres(exc) from exc
    raise AssertionError("pgbroker._stream_no_group refuses every group")


@router.get(
    "/v1/streams/stats",
    "lag per stream and group, for the streams and groups the key can see",
    reporting=True,
)
async def stream_stats(call: Call) -> StreamStatsList:
    found = await stream_metrics.stream_group_stats(call.broker)
    return StreamStatsList(
        groups=[
            dataclasses.replace(s, retry_queue=_seen(call, s.retry_queue))
            for s in found
            if call.caller.sees_stream_group(s.stream, s.group)
        ]
    )


def _seen(call: Call, queue: str | None) -> str | None:
    """``queue``'s name when the key sees it: a group's retry queue may be named by hand, outside
    the stream's patterns, and lists name nothing the key does not see."""
    return queue if queue is not None and call.caller.sees(queue) else None


@router.get("/v1/streams", "list the streams the key can see")
async def list_streams(call: Call) -> StreamList:
    found = await aio_streams.list_streams(call.broker)
    return StreamList(streams=[s for s in found if call.caller.sees(s.name)])


@router.post(
    "/v1/streams",
    "create a stream (idempotent)",
    scope="admin",
    scope_field="name",
    status=201,
    errors={409: "stream_conflict"},
)
async def create_stream(call: Call, body: CreateStream) -> Info:
    existing = next((s for s in await aio_streams.list_streams(call.broker) if s.name == body.name), None)
    if existing is not None and existing.partitions != body.partitions:
        raise ApiError(
            409,
            "stream_conflict",
            f'stream "{body.name}" exists with {existing.partitions} partitions',
            hint="Partitions are fixed when a stream is made: drop it first, or use another name.",
        )
    info = await AsyncStream(call.broker, body.name).create(
        partitions=body.partitions,
        retention=body.retention_seconds,
        retention_bytes=body.retention_bytes,
        truncate_consumed=body.truncate_consumed,
        notify=body.notify,
    )
    return info


_NO_STREAM = {404: "stream_not_found"}
_NO_GROUP = {404: "stream_not_found, stream_group_not_found (also for a group the key may not use)"}


@router.delete(
    "/v1/streams/{stream}",
    "drop a stream, its groups and cursors, and the retry queues its groups made; the key's group patterns"
    " must cover every group ('*'), its queue patterns those retry queues",
    scope="admin",
    errors=_NO_STREAM,
)
async def drop_stream(call: Call) -> StreamDropped:
    stream = _stream(call, "admin")
    if not call.caller.sees_every_group:
        # Every group goes with the stream: a key for some groups would drop the others' too.
        raise ApiError(
            403,
            "forbidden",
            f"key {call.caller.name!r} may not drop stream {stream.name!r}: its groups go with it, and"
            " the key's group patterns do not cover every group",
            hint="Drop it with a key whose group patterns include '*'.",
        )
    await _refuse_unseen_retry_queues_made(call, stream.name, None)
    if not await stream.drop():
        raise ApiError(404, "stream_not_found", f'stream "{stream.name}" does not exist')
    return StreamDropped(dropped=stream.name)


@router.post(
    "/v1/streams/{stream}/messages",
    "send messages (each with an optional key)",
    scope="send",
    errors={**_NO_STREAM, **IDEMPOTENCY_ERRORS},
    headers=SEND_HEADERS,
)
async def stream_send(call: Call, body: StreamSendBatch) -> StreamIds:
    stream = _stream(call, "send")
    ids = await stream.send_many(
        [m.message for m in body.messages],
        keys=[m.key for m in body.messages],
        headers=[m.headers for m in body.messages],
        idempotency_key=call.request.headers.get(IDEMPOTENCY_KEY),
        idempotency_scope=idempotency_scope(call.key),
    )
    return StreamIds(ids=ids)


@router.get(
    "/v1/streams/{stream}/groups",
    "the stream's groups the key may use, with their lag",
    scope="read",
    errors=_NO_STREAM,
)
async def stream_groups(call: Call) -> GroupList:
    found = await _stream(call, "read").groups()
    return GroupList(
        groups=[
            GroupInfo.model_validate(g).model_copy(update={"retry_queue": _seen(call, g.retry_queue)})
            for g in found
            if call.caller.sees_group(g.name)
        ]
    )


@router.post(
    "/v1/streams/{stream}/groups",
    "create a consumer group (idempotent); the key's group patterns must cover it, and its queue"
    " patterns the group's retry queue (<stream>_<group>_retry unless named), which no other group may have",
    scope="admin",
    status=201,
    errors={**_NO_STREAM, 409: "queue_name_conflict (the retry queue is another group's)"},
)
async def create_stream_group(call: Call, body: CreateGroup) -> GroupCreated:
    stream = _stream(call, "admin")
    if not call.caller.sees_group(body.group):
        raise ApiError(
            403,
            "forbidden",
            f"key {call.caller.name!r} may not admin on group {body.group!r}: its group patterns do not"
            " cover it",
        )
    # The group's failures go to its retry queue, which it takes over if the queue exists: a key
    # that may not use that queue would send into it (as failures) what it liked.
    retry_queue = body.retry_queue or await _default_retry_queue(call, stream.name, body.group)
    if not call.caller.allows("admin", retry_queue):
        raise ApiError(
            403,
            "forbidden",
            f"key {call.caller.name!r} may not admin on queue {retry_queue!r}, the group's retry queue",
            hint=f"A key that makes groups of stream {stream.name!r} needs a pattern such as "
            f"'{stream.name}_*' too, or a retry queue named within its patterns (\"retry_queue\").",
        )
    # An existing group is answered as it is, its retry queue perhaps named by hand.
    made = await stream.create_group(body.group, start=body.start, retry_queue=retry_queue)
    return GroupCreated(group=body.group, retry_queue=_seen(call, made))


@router.delete(
    "/v1/streams/{stream}/groups/{group}",
    "drop a consumer group, its cursors and consumers, and its retry queue if the group made it; the key's"
    " queue patterns must cover that queue",
    scope="admin",
    errors=_NO_GROUP,
)
async def drop_stream_group(call: Call) -> GroupDropped:
    stream = _stream(call, "admin")
    group = await _group(call, stream)
    await _refuse_unseen_retry_queues_made(call, stream.name, group)
    if not await stream.drop_group(group):
        await _refuse_as_missing(call, stream.name, group)
    return GroupDropped(dropped=group)


async def _refuse_unseen_retry_queues_made(call: Call, stream: str, group: str | None) -> None:
    """403 unless the key sees each retry queue that dropping ``group`` (None: every group of the
    stream) drops with it: a queue its group made may be named by hand, outside the key's patterns.
    The answer names no queue."""
    async with call.broker.connection() as conn:
        cur = await conn.execute(_QUERIES["stream_retry_queues_made"], {"stream": stream, "group": group})
        made = [name for (name,) in await cur.fetchall()]
    if not all(call.caller.sees(name) for name in made):
        dropped = f"group {group!r} of stream {stream!r}" if group is not None else f"stream {stream!r}"
        raise ApiError(
            403,
            "forbidden",
            f"key {call.caller.name!r} may not drop {dropped}: a retry queue its group made goes with it,"
            " and the key's patterns do not cover that queue",
            hint="Drop it with a key whose patterns cover the group's retry queue.",
        )


@router.post(
    "/v1/streams/{stream}/groups/{group}/read",
    "read a batch as one of the group's consumers (ack it with .../ack)",
    scope="read",
    errors=_NO_GROUP,
)
async def stream_read(call: Call, body: StreamRead) -> StreamBatch:
    stream = _stream(call, "read")
    # A consumer object per request: it names no generation, so no rewind of its fences a read. Live
    # by its lease: a pooled session holding a lock for every consumer name it was given filled the
    # server's lock table.
    consumer = stream.consumer(
        await _group(call, stream),
        name=body.consumer,
        lease=body.lease_seconds,
        fenced=False,
        lease_only=True,
    )
    batch = await consumer.read(body.qty, wait=body.wait)
    return StreamBatch(messages=batch.messages)


@router.post(
    "/v1/streams/{stream}/groups/{group}/ack",
    "acknowledge batches up to an id per partition; failed messages go to the group's retry queue"
    " (which the key must see)",
    scope="read",
    errors=_NO_GROUP,
)
async def stream_ack(call: Call, body: StreamAck) -> StreamAcked:
    stream = _stream(call, "read")
    group = await _group(call, stream)
    if body.failed:
        await _refuse_unseen_retry_queue(call, stream.name, group)
    consumer = stream.consumer(group, name=body.consumer)
    # A batch of one message per acknowledged partition carries the ranges; failures by id.
    batch = Batch(
        [Read(stream.name, a.partition, a.last_id, a.epoch, None, _EPOCH, None, None) for a in body.acks],
        {f.id: f.error for f in body.failed},
    )
    held = await consumer.ack(batch)
    return StreamAcked(partitions=[AckResult(partition=p, acked=ok) for p, ok in sorted(held.items())])


async def _default_retry_queue(call: Call, stream: str, group: str) -> str:
    """The retry queue the engine gives a group that names none."""
    async with call.broker.connection() as conn:
        params = {"stream": stream, "group": group}
        cur = await conn.execute(_QUERIES["stream_group_default_retry_queue"], params)
        ((name,),) = await cur.fetchall()
    return str(name)


async def _refuse_unseen_retry_queue(call: Call, stream: str, group: str) -> None:
    """403 unless the key sees the group's retry queue, where an ack's failures are sent: it may be
    named by hand, outside the stream's patterns. The answer names no queue the key does not see."""
    async with call.broker.connection() as conn:
        cur = await conn.execute(_QUERIES["stream_group_retry_queue"], {"stream": stream, "group": group})
        row = await cur.fetchone()
    if row is not None and not call.caller.sees(row[0]):
        raise ApiError(
            403,
            "forbidden",
            f"key {call.caller.name!r} may not send failures to the retry queue of group {group!r}"
            f" of stream {stream!r}: its patterns do not cover that queue",
            hint="Ack without 'failed' (the messages are settled), or use a key whose patterns cover the"
            " group's retry queue.",
        )


@router.post(
    "/v1/streams/{stream}/groups/{group}/heartbeat",
    "renew a consumer's lease between reads, while it handles a batch that outlasts the lease",
    scope="read",
    errors=_NO_GROUP,
)
async def stream_heartbeat(call: Call, body: StreamHeartbeat) -> HeartbeatAnswer:
    stream = _stream(call, "read")
    group = await _group(call, stream)
    consumer = stream.consumer(group, name=body.consumer, lease=body.lease_seconds, lease_only=True)
    owned = await consumer.heartbeat()
    return HeartbeatAnswer(
        partitions=[OwnedPartition(partition=p, epoch=e) for p, e in sorted(owned.items())]
    )
