"""The query layer of streams, shared by the sync and asyncio stream clients: one Query per
operation (SQL from _sql/queries/streams.sql, its parameters, how to decode the rows), no I/O."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, LiteralString

from pgbroker import _sql as sql
from pgbroker.errors import InvalidArgument
from pgbroker.queues._arguments import duration, encode_json, json_array
from pgbroker.queues._queries import DEFAULT_TRIM_BATCH
from pgbroker.queues._query import Query, Row
from pgbroker.streams._records import (
    PartitionLag,
    StreamBatch,
    StreamGroupInfo,
    StreamInfo,
    StreamMessage,
    ack_failures,
    build_stream_message,
)

START_POSITIONS = ("start", "end")


def _named(name: str) -> LiteralString:
    return sql.queries("streams")[name]


def _scalar(rows: list[Row]) -> Any:
    return rows[0][0]


def _by_partition(rows: list[Row]) -> dict[int, Any]:
    """Rows of (partition, value) as {partition: value}."""
    return {row[0]: row[1] for row in rows}


def _ids(rows: list[Row]) -> list[int]:
    return [row[0] for row in rows]


def _whole_seconds(value: int | float | timedelta | None, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        duration(value, what)  # the checks
        return max(1, value)
    return max(1, math.ceil(duration(value, what)))


def _info(row: Row) -> StreamInfo:
    return StreamInfo(*row)


def stream_create(
    stream: str,
    *,
    partitions: int = 4,
    retention: int | float | timedelta | None = None,
    retention_bytes: int | None = None,
    truncate_consumed: bool = True,
    segment_rows: int = 1_000_000,
    segments: int = 4,
    notify: bool = False,
) -> Query[StreamInfo]:
    params = {
        "stream": stream,
        "partitions": partitions,
        "retention_seconds": _whole_seconds(retention, "retention"),
        "retention_bytes": retention_bytes,
        "truncate_consumed": truncate_consumed,
        "segment_rows": segment_rows,
        "segments": segments,
        "notify": notify,
    }
    return Query(_named("stream_create"), params, lambda rows: _info(rows[0]))


def stream_drop(stream: str) -> Query[bool]:
    return Query(_named("stream_drop"), {"stream": stream}, _scalar)


def stream_list() -> Query[list[StreamInfo]]:
    return Query(_named("stream_list"), {}, lambda rows: [_info(r) for r in rows])


def stream_send_many(
    stream: str,
    messages: Iterable[Any],
    *,
    headers: Sequence[Mapping[str, Any] | None] | None = None,
    keys: Sequence[str | None] | None = None,
    idempotency_key: str | None = None,
    idempotency_scope: str | None = None,
) -> Query[list[int]]:
    """``idempotency_key`` (in ``idempotency_scope``): through pgbroker.stream_send_idempotent
    (92_streams.sql)."""
    encoded = [encode_json(m) for m in messages]
    if not encoded:
        raise InvalidArgument("messages must not be empty", hint="Pass at least one message.")
    encoded_headers = None
    if headers is not None:
        encoded_headers = [None if h is None else encode_json(dict(h), "headers") for h in headers]
    for given, what in ((encoded_headers, "headers"), (keys, "keys")):
        if given is not None and len(given) != len(encoded):
            raise InvalidArgument(
                f"{what} has {len(given)} entries for {len(encoded)} messages",
                hint=f"Give one entry (or None) per message, or no {what} at all.",
            )
    params = {
        "stream": stream,
        "messages": json_array(encoded),
        "headers": json_array(encoded_headers),
        "keys": None if keys is None else list(keys),
    }
    if idempotency_key is not None:
        scoped = {**params, "key": idempotency_key, "scope": idempotency_scope}
        return Query(_named("stream_send_idempotent"), scoped, _ids, sends=True)
    return Query(_named("stream_send_many"), params, _ids, sends=True)


def stream_receive_many(
    stream: str,
    message_ids: Sequence[str | None],
    messages: Sequence[Any],
    headers: Sequence[Mapping[str, Any] | None],
    keys: Sequence[str | None],
    *,
    seen_within: float,
) -> Query[list[tuple[str | None, int]]]:
    """Append the messages whose ids were not seen within ``seen_within`` seconds, in one
    transaction (an inbound bridge; sql/functions/94_stream_bridge.sql). Returns (message_id, id)
    per message appended; the others were duplicates. A message without an id is always appended."""
    if not len(message_ids) == len(messages) == len(headers) == len(keys):
        raise InvalidArgument("message_ids, messages, headers and keys must have one entry per message")
    params = {
        "stream": stream,
        "message_ids": list(message_ids),
        "messages": json_array([encode_json(m) for m in messages]),
        "headers": json_array([None if h is None else encode_json(dict(h), "headers") for h in headers]),
        "keys": list(keys),
        "seen_within": duration(seen_within, "seen_within"),
    }
    return Query(_named("stream_receive_many"), params, lambda rows: [(r[0], r[1]) for r in rows])


def stream_inbound_seen_prune(
    stream: str, seen_within: float, batch_size: int = DEFAULT_TRIM_BATCH
) -> Query[int]:
    """One batch of forgetting ``stream``'s inbound message ids older than ``seen_within`` seconds."""
    params = {"stream": stream, "seen_within": duration(seen_within, "seen_within"), "batch_size": batch_size}
    return Query(_named("stream_inbound_seen_prune"), params, _scalar)


def stream_notify_channel(stream: str) -> Query[str]:
    return Query(_named("stream_notify_channel"), {"stream": stream}, _scalar)


def stream_group_create(
    stream: str,
    group: str,
    *,
    start: str | datetime = "end",
    retry_queue: str | None = None,
) -> Query[str]:
    """``start``: 'start', 'end', or a timezone-aware datetime. Decodes to the retry queue's name."""
    if isinstance(start, datetime):
        if start.tzinfo is None:
            raise InvalidArgument("start must be a timezone-aware datetime (naive datetimes are ambiguous)")
        start_from, start_time = "time", start
    elif start in START_POSITIONS:
        start_from, start_time = start, None
    else:
        raise InvalidArgument(f"start must be 'start', 'end' or a datetime, got {start!r}")
    params = {
        "stream": stream,
        "group": group,
        "start_from": start_from,
        "start_time": start_time,
        "retry_queue": retry_queue,
    }
    return Query(_named("stream_group_create"), params, lambda rows: rows[0][2])


def stream_group_drop(stream: str, group: str) -> Query[bool]:
    return Query(_named("stream_group_drop"), {"stream": stream, "group": group}, _scalar)


def stream_group_list(stream: str) -> Query[list[StreamGroupInfo]]:
    return Query(
        _named("stream_group_list"), {"stream": stream}, lambda rows: [StreamGroupInfo(*r) for r in rows]
    )


def stream_lag(stream: str) -> Query[list[PartitionLag]]:
    return Query(_named("stream_lag"), {"stream": stream}, lambda rows: [PartitionLag(*r) for r in rows])


def _batch_query(name: str, stream: str, params: dict[str, Any]) -> Query[StreamBatch]:
    """A query of a batch of ``stream``: its rows made into messages as they are fetched."""

    def make(row: Row) -> StreamMessage:
        return build_stream_message(stream, *row)

    return Query(_named(name), params, StreamBatch, row=make)


def _consumer_params(
    stream: str,
    group: str,
    consumer: str,
    qty: int,
    lease: int | float | timedelta,
    generation: int | None,
    lease_only: bool,
) -> dict[str, Any]:
    if isinstance(qty, bool) or not isinstance(qty, int) or not 1 <= qty <= 100_000:
        raise InvalidArgument(f"qty must be an integer from 1 to 100000, got {qty!r}")
    return {
        "stream": stream,
        "group": group,
        "consumer": consumer,
        "qty": qty,
        "lease": _whole_seconds(lease, "lease"),
        "generation": generation,
        "lease_only": lease_only,
    }


def stream_read(
    stream: str,
    group: str,
    consumer: str,
    qty: int,
    lease: int | float | timedelta,
    generation: int | None,
    lease_only: bool = False,
) -> Query[StreamBatch]:
    params = _consumer_params(stream, group, consumer, qty, lease, generation, lease_only)
    return _batch_query("stream_read", stream, params)


def _ack_params(batch: StreamBatch | None) -> dict[str, Any]:
    if batch is None or not batch.messages:
        return {"partitions": None, "epochs": None, "last_ids": None, "failed_ids": None, "errors": None}
    partitions, epochs, last_ids = batch.ack_ranges()
    failed_ids, errors = ack_failures(batch.failures)
    return {
        "partitions": partitions,
        "epochs": epochs,
        "last_ids": last_ids,
        "failed_ids": failed_ids,
        "errors": errors,
    }


def stream_consume(
    stream: str,
    group: str,
    consumer: str,
    qty: int,
    lease: int | float | timedelta,
    acked: StreamBatch | None,
    generation: int | None,
    lease_only: bool = False,
) -> Query[StreamBatch]:
    """Ack ``acked`` (if any) and read the next batch, in one call."""
    params = {
        **_consumer_params(stream, group, consumer, qty, lease, generation, lease_only),
        **_ack_params(acked),
    }
    return _batch_query("stream_consume", stream, params)


def stream_ack(stream: str, group: str, consumer: str, batch: StreamBatch) -> Query[dict[int, bool]]:
    """Decodes to {partition: whether the ack held} (False: the partition changed hands)."""
    params = {"stream": stream, "group": group, "consumer": consumer, **_ack_params(batch)}
    return Query(_named("stream_ack"), params, _by_partition)


def stream_release(stream: str, group: str, consumer: str) -> Query[int]:
    return Query(_named("stream_release"), {"stream": stream, "group": group, "consumer": consumer}, _scalar)


def stream_rewind(stream: str, group: str, consumer: str, generation: int | None) -> Query[int]:
    params = {"stream": stream, "group": group, "consumer": consumer, "generation": generation}
    return Query(_named("stream_rewind"), params, _scalar)


def stream_heartbeat(
    stream: str, group: str, consumer: str, lease: int | float | timedelta, lease_only: bool = False
) -> Query[dict[int, int]]:
    """Decodes to {partition: epoch} of the partitions the consumer owns."""
    params = {
        "stream": stream,
        "group": group,
        "consumer": consumer,
        "lease": _whole_seconds(lease, "lease"),
        "lease_only": lease_only,
    }
    return Query(_named("stream_heartbeat"), params, _by_partition)


def stream_maintain(stream: str) -> Query[int]:
    return Query(_named("stream_maintain"), {"stream": stream}, _scalar)
