"""The query layer shared by the sync and asyncio clients.

Each function here turns one client operation into a Query (_query.py): the SQL text (from
_sql/queries/queues.sql), its parameters, checked by _arguments.py, and how to decode the rows
(_decoders.py). It does no I/O, so a sync and an async executor can run the same Query objects and
no operation is written twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, LiteralString
from uuid import UUID

from pgbroker import _sql as sql
from pgbroker import codecs
from pgbroker._db.names import check_dropped_queue_name, check_queue_name
from pgbroker.codecs import Codec
from pgbroker.errors import InvalidArgument, StaleReceipt
from pgbroker.queues import _arguments as arg
from pgbroker.queues import _decoders as decoded
from pgbroker.queues._arguments import Delay, Receivable
from pgbroker.queues._query import Query, Row
from pgbroker.queues._records import (
    BlockingSession,
    Message,
    Metrics,
    PeekedMessage,
    Policy,
    PolicyChanges,
    QueueInfo,
    Receipt,
    Schedule,
    ScheduleTick,
)


def _named(name: str) -> LiteralString:
    return sql.queries("queues")[name]


def _messages(
    name: str, params: dict[str, Any], make: Callable[[Row], Message] = decoded.message
) -> Query[list[Message]]:
    """A query whose rows are messages, each made as it is fetched (Query.row)."""
    return Query(_named(name), params, decoded.as_made, row=make)


# -- queue management ---------------------------------------------------------


def queue_create(queue: str, *, unlogged: bool = False) -> Query[None]:
    name = "queue_create_unlogged" if arg.flag(unlogged, "unlogged") else "queue_create"
    return Query(_named(name), {"queue": queue}, decoded.nothing)


def queue_drop(queue: str) -> Query[bool]:
    return Query(_named("queue_drop"), {"queue": queue}, decoded.scalar, check_dropped_queue_name)


def queue_list() -> Query[list[QueueInfo]]:
    return Query(_named("queue_list"), {}, decoded.queue_infos)


def blocking_sessions(older_than: float, stream: str | None) -> Query[list[BlockingSession]]:
    params = {"older_than": older_than, "of_stream": stream}
    return Query(_named("blocking_sessions"), params, lambda rows: [BlockingSession(*row) for row in rows])


def queue_metrics(queue: str) -> Query[Metrics]:
    return Query(_named("queue_metrics"), {"queue": queue}, lambda rows: decoded.metrics(rows)[0])


def queue_metrics_all() -> Query[list[Metrics]]:
    return Query(_named("queue_metrics_all"), {}, decoded.metrics)


def queue_purge(queue: str) -> Query[int]:
    return Query(_named("queue_purge"), {"queue": queue}, decoded.scalar)


def queue_pause(queue: str) -> Query[bool]:
    return Query(_named("queue_pause"), {"queue": queue}, decoded.scalar)


def queue_resume(queue: str) -> Query[bool]:
    return Query(_named("queue_resume"), {"queue": queue}, decoded.scalar)


# As pgmq.enable_notify_insert's default.
DEFAULT_NOTIFY_THROTTLE_MS = 250


def notify_enable(queue: str, throttle_ms: int = DEFAULT_NOTIFY_THROTTLE_MS) -> Query[None]:
    params = {"queue": queue, "throttle_ms": arg.count(throttle_ms, "throttle_ms")}
    return Query(_named("notify_enable"), params, decoded.nothing)


def notify_enable_if_disabled(queue: str, throttle_ms: int = DEFAULT_NOTIFY_THROTTLE_MS) -> Query[None]:
    params = {"queue": queue, "throttle_ms": arg.count(throttle_ms, "throttle_ms")}
    return Query(_named("notify_enable_if_disabled"), params, decoded.nothing)


def notify_disable(queue: str) -> Query[None]:
    return Query(_named("notify_disable"), {"queue": queue}, decoded.nothing)


def notify_channel(queue: str) -> Query[str]:
    return Query(_named("notify_channel"), {"queue": queue}, decoded.scalar)


# -- messages -----------------------------------------------------------------


def message_send_many(
    queue: str,
    messages: Iterable[Any],
    *,
    headers: Sequence[Mapping[str, Any] | None] | None = None,
    delay: Delay | None = None,
    codec: Codec | None = None,
    idempotency_key: str | None = None,
    idempotency_scope: str | None = None,
) -> Query[list[int]]:
    """``codec`` None: JSON, as pgmq stores it; another codec stores each body in an envelope.
    ``idempotency_key`` (in ``idempotency_scope``): through pgbroker.send_idempotent (34_dedup.sql),
    delay in seconds only."""
    encoded = [
        arg.encode_json(m) if codec is None else codecs.to_stored_text(m, codec)
        for m in arg.batch(messages, "messages")
    ]
    if not encoded:
        raise InvalidArgument("messages must not be empty", hint="Pass at least one message.")
    encoded_headers = None
    if headers is not None:
        if isinstance(headers, Mapping):
            raise InvalidArgument(
                "headers of send_many is one mapping (or None) per message, got a single mapping",
                hint="Pass headers=[{...}, ...] with one entry per message, or use send() for one message.",
            )
        encoded_headers = [arg.headers_object(h) for h in arg.batch(headers, "headers")]
        if len(encoded_headers) != len(encoded):
            raise InvalidArgument(
                f"headers has {len(encoded_headers)} entries for {len(encoded)} messages",
                hint="Give one headers mapping (or None) per message, or no headers at all.",
            )
    params: dict[str, Any] = {
        "queue": queue,
        "messages": arg.json_array(encoded),
        "headers": arg.json_array(encoded_headers),
    }
    if idempotency_key is not None:
        if isinstance(delay, datetime):
            raise InvalidArgument(
                "an idempotent send takes its delay in seconds, not as a time",
                hint="Pass delay as seconds (an int or a timedelta): a retry then sends the same request.",
            )
        seconds = 0 if delay is None else arg.whole_seconds(delay, "delay")
        params = {**params, "key": idempotency_key, "scope": idempotency_scope, "delay": seconds}
        return Query(_named("message_send_idempotent"), params, decoded.ids, sends=True)
    if delay is None:
        return Query(_named("message_send_many"), params, decoded.ids, sends=True)
    if isinstance(delay, datetime):
        if delay.tzinfo is None:
            raise InvalidArgument("delay must be a timezone-aware datetime (naive datetimes are ambiguous)")
        until = {**params, "delay": delay}
        return Query(_named("message_send_many_delay_until"), until, decoded.ids, sends=True)
    after = {**params, "delay": arg.whole_seconds(delay, "delay")}
    return Query(_named("message_send_many_delay_seconds"), after, decoded.ids, sends=True)


def message_read_many(
    queue: str,
    qty: int,
    *,
    vt: int | timedelta = 30,
    conditional: Mapping[str, Any] | None = None,
    decode: bool = True,
) -> Query[list[Message]]:
    """One read, never waiting: a waiting read repeats it (see pgbroker._db.wakeups.Waiting).
    ``decode=False`` leaves each body as stored (see decoded.stored_message)."""
    params: dict[str, Any] = {
        "queue": queue,
        "vt": arg.whole_seconds(vt, "vt"),
        "qty": arg.count(qty, "qty"),
        "conditional": arg.encode_json(dict(arg.mapping(conditional or {}, "conditional")), "conditional"),
    }
    return _messages(
        "message_read_many", params, decoded.message if arg.flag(decode, "decode") else decoded.stored_message
    )


def message_complete_and_read(
    queue: str, items: Iterable[Receivable], qty: int, *, vt: int | timedelta = 30
) -> Query[tuple[list[int], list[Message]]]:
    """Ack by the queue's policy, then read, in one statement: (msg_ids acked, messages read)."""
    params: dict[str, Any] = {
        "queue": queue,
        "receipts": arg.receipt_texts(items),
        "vt": arg.whole_seconds(vt, "vt"),
        "qty": arg.count(qty, "qty"),
        "conditional": "{}",
    }

    def make(row: Row) -> tuple[list[int] | None, Message | None]:
        return row[0], None if row[1] is None else decoded.message(row[1:])

    def decode(made: list[tuple[list[int] | None, Message | None]]) -> tuple[list[int], list[Message]]:
        acked = list(made[0][0]) if made and made[0][0] is not None else []
        return acked, [message for _, message in made if message is not None]

    return Query(_named("message_complete_and_read"), params, decode, row=make)


def message_pop_many(queue: str, qty: int) -> Query[list[Message]]:
    return _messages("message_pop_many", {"queue": queue, "qty": arg.count(qty, "qty")})


def _held(queue: str, receipt: Receipt) -> Callable[[list[Row]], Any]:
    """Decode a single fenced operation: its result, or StaleReceipt with the server's reason."""

    def decode(rows: list[Row]) -> Any:
        done, reason = rows[0]
        if done is None:
            raise StaleReceipt(
                f'stale receipt for message {receipt.msg_id} in queue "{queue}": {reason}',
                hint="Another consumer may now hold the message; extend leases before they run out.",
            )
        return done

    return decode


def message_ack(queue: str, item: Receivable, *, archive: bool = True) -> Query[None]:
    receipt = arg.receipt_of(item)
    params = {"queue": queue, "receipt": str(receipt), "archive": arg.flag(archive, "archive")}
    return Query(_named("message_ack"), params, _held(queue, receipt))


def message_ack_many(queue: str, items: Iterable[Receivable], *, archive: bool = True) -> Query[list[int]]:
    params = {"queue": queue, "receipts": arg.receipt_texts(items), "archive": arg.flag(archive, "archive")}
    return Query(_named("message_ack_many"), params, decoded.ids)


def message_nack(queue: str, item: Receivable, *, delay: int | timedelta = 0) -> Query[None]:
    receipt = arg.receipt_of(item)
    params = {"queue": queue, "receipt": str(receipt), "delay": arg.whole_seconds(delay, "delay")}
    return Query(_named("message_nack"), params, _held(queue, receipt))


def message_nack_many(
    queue: str, items: Iterable[Receivable], *, delay: int | timedelta = 0
) -> Query[list[int]]:
    params = {
        "queue": queue,
        "receipts": arg.receipt_texts(items),
        "delay": arg.whole_seconds(delay, "delay"),
    }
    return Query(_named("message_nack_many"), params, decoded.ids)


def message_extend(queue: str, item: Receivable, *, vt: int | timedelta) -> Query[Receipt]:
    receipt = arg.receipt_of(item)
    params = {"queue": queue, "receipt": str(receipt), "vt": arg.whole_seconds(vt, "vt")}
    held = _held(queue, receipt)
    return Query(_named("message_extend"), params, lambda rows: Receipt.issued(held(rows)))


def message_extend_many(
    queue: str, items: Iterable[Receivable], *, vt: int | timedelta
) -> Query[dict[int, Receipt]]:
    params = {"queue": queue, "receipts": arg.receipt_texts(items), "vt": arg.whole_seconds(vt, "vt")}
    return Query(
        _named("message_extend_many"),
        params,
        lambda rows: {msg_id: Receipt.issued(token) for msg_id, token in rows},
    )


def _msg_ids(msg_ids: Iterable[int]) -> list[int]:
    ids = arg.batch(msg_ids, "msg_ids")
    for msg_id in ids:
        if isinstance(msg_id, bool) or not isinstance(msg_id, int) or not 0 <= msg_id <= arg.BIGINT_MAX:
            raise InvalidArgument(f"msg_id must be an integer from 0 to {arg.BIGINT_MAX}, got {msg_id!r}")
    return ids


def message_archive_many(queue: str, msg_ids: Iterable[int]) -> Query[list[int]]:
    return Query(_named("message_archive_many"), {"queue": queue, "msg_ids": _msg_ids(msg_ids)}, decoded.ids)


def message_delete_many(queue: str, msg_ids: Iterable[int]) -> Query[list[int]]:
    return Query(_named("message_delete_many"), {"queue": queue, "msg_ids": _msg_ids(msg_ids)}, decoded.ids)


def message_set_vt_many(
    queue: str, msg_ids: Iterable[int], vt: int | timedelta | datetime
) -> Query[list[Message]]:
    params: dict[str, Any] = {"queue": queue, "msg_ids": _msg_ids(msg_ids)}
    if isinstance(vt, datetime):
        if vt.tzinfo is None:
            raise InvalidArgument("vt must be a timezone-aware datetime (naive datetimes are ambiguous)")
        return _messages("message_set_vt_until", {**params, "vt": vt})
    seconds = arg.whole_seconds(vt, "vt")
    return _messages("message_set_vt_seconds", {**params, "vt": seconds})


PEEK_STATES = ("waiting", "delayed", "in_flight", "dead")


def message_peek_many(
    queue: str,
    qty: int,
    *,
    after: int = 0,
    state: str | None = None,
    before: int | None = None,
    header: str | None = None,
    header_value: str | None = None,
    enqueued_after: datetime | None = None,
    enqueued_before: datetime | None = None,
    contains: Mapping[str, Any] | None = None,
) -> Query[list[PeekedMessage]]:
    """Messages with after < msg_id <= before, oldest first, without leasing or changing them:
    in ``state`` (one of PEEK_STATES; None: every state but dead), with ``header`` (equal to
    ``header_value`` when given), enqueued in [enqueued_after, enqueued_before), whose JSON body
    contains ``contains`` (such as {"sku": "A-001"}: those fields with those values)."""
    if contains is not None and not isinstance(contains, Mapping):
        raise InvalidArgument(f"contains must be a mapping of body fields, got {contains!r}")
    if state is not None and state not in PEEK_STATES:
        raise InvalidArgument(f"unknown message state {state!r}", hint=f"States: {', '.join(PEEK_STATES)}.")
    for name, value in (("header", header), ("header_value", header_value)):
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"{name} must be a string, got {value!r}")
    for name, moment in (("enqueued_after", enqueued_after), ("enqueued_before", enqueued_before)):
        if moment is not None and (not isinstance(moment, datetime) or moment.tzinfo is None):
            raise InvalidArgument(f"{name} must be a timezone-aware datetime, got {moment!r}")
    params = {
        "queue": queue,
        "qty": arg.count(qty, "qty"),
        "after": _msg_ids([after])[0],
        "state": state,
        "before": None if before is None else _msg_ids([before])[0],
        "header_key": header,
        "header_value": header_value,
        "contains": None if contains is None else arg.encode_json(dict(contains), "contains"),
        "enqueued_after": enqueued_after,
        "enqueued_before": enqueued_before,
    }
    return Query(_named("message_peek_many"), params, _peeked)


def _peeked(rows: list[Row]) -> list[PeekedMessage]:
    """Each row's message decoded as a read decodes it (its codec), with its state; the receipt
    stays None: a peek takes no lease."""
    peeked = []
    for row in rows:
        m = decoded.message(row[:7])
        peeked.append(
            PeekedMessage(
                m.msg_id,
                m.read_ct,
                m.enqueued_at,
                m.last_read_at,
                m.vt,
                m.message,
                m.headers,
                None,
                m.codec,
                m.codec_error,
                state=row[7],
            )
        )
    return peeked


# -- outcomes by policy, dead letters and retention ------------------------------


def message_complete_many(queue: str, items: Iterable[Receivable]) -> Query[list[int]]:
    """Ack with the queue's policy (archive or delete); returns the msg_ids whose receipts held."""
    params = {"queue": queue, "receipts": arg.receipt_texts(items)}
    return Query(_named("message_complete_many"), params, decoded.ids)


def message_fail(
    queue: str, item: Receivable, *, error: str | None = None, traceback: str | None = None
) -> Query[str]:
    """Retry later with the policy's back-off, or dead-letter: 'retry' or 'dead_lettered'."""
    receipt = arg.receipt_of(item)
    params = {
        "queue": queue,
        "receipt": str(receipt),
        "error": _error_text(error, "error"),
        "traceback": _error_text(traceback, "traceback"),
    }
    return Query(_named("message_fail"), params, _held(queue, receipt))


def _error_text(text: str | None, name: str) -> str | None:
    if text is not None and not isinstance(text, str):
        raise InvalidArgument(f"{name} must be a string or None, got {type(text).__name__}")
    # libpq cannot send NUL; an exception's text may carry one.
    return None if text is None else text.replace("\x00", "")


def message_fail_many(
    queue: str,
    items: Iterable[Receivable],
    *,
    error: str | None = None,
    traceback: str | None = None,
    default_max_deliveries: int | None = None,
) -> Query[dict[int, str]]:
    """message_fail for many receipts with one error: {msg_id: outcome} for those that held.
    default_max_deliveries: dead-letter at this delivery when the queue's policy sets no limit."""
    params = {
        "queue": queue,
        "receipts": arg.receipt_texts(items),
        "error": _error_text(error, "error"),
        "traceback": _error_text(traceback, "traceback"),
        "default_max_deliveries": default_max_deliveries,
    }
    return Query(_named("message_fail_many"), params, lambda rows: dict(rows))


def _policies(rows: list[Row]) -> list[Policy]:
    return [Policy(*row) for row in rows]


def policy_get(queue: str) -> Query[Policy]:
    return Query(_named("policy_get"), {"queue": queue}, lambda rows: _policies(rows)[0])


def policy_list() -> Query[list[Policy]]:
    return Query(_named("policy_list"), {}, _policies)


_POLICY_LIMITS = {
    "max_deliveries": arg.INTEGER_MAX,
    "backoff_base_seconds": arg.INTEGER_MAX,
    "backoff_max_seconds": arg.INTEGER_MAX,
    "max_depth": arg.BIGINT_MAX,
    "archive_retention_seconds": arg.BIGINT_MAX,
    "archive_max_rows": arg.BIGINT_MAX,
    "dedup_window_seconds": arg.INTEGER_MAX,
    "max_in_flight": arg.INTEGER_MAX,
    "max_in_flight_per_key": arg.INTEGER_MAX,
}
_POLICY_TEXTS = ("backoff", "dead_letter_queue", "ack_mode", "codec", "dedup_mode")
_POLICY_FLAGS = ("backoff_jitter", "priorities")


def policy_set(queue: str, changes: PolicyChanges) -> Query[Policy]:
    """Change the settings given; the server checks their values (InvalidArgument naming the setting)."""
    settings = [*_POLICY_LIMITS, *_POLICY_TEXTS, *_POLICY_FLAGS, "rate_limit_per_second"]
    params: dict[str, Any] = {"queue": queue, **dict.fromkeys(settings)}
    for name, value in changes.items():
        if name not in settings:
            hint = f"Settings: {', '.join(settings)}."
            raise InvalidArgument(f"unknown policy setting {name!r}", hint=hint)
        limit = _POLICY_LIMITS.get(name)
        # The server checks ranges; here only what could not even be sent as the right type.
        if limit is not None and not (
            isinstance(value, int) and not isinstance(value, bool) and abs(value) <= limit
        ):
            raise InvalidArgument(f"{name} must be a whole number up to {limit}, got {value!r}")
        if name in _POLICY_TEXTS and not isinstance(value, str):
            raise InvalidArgument(f"{name} must be a string, got {value!r}")
        if name in _POLICY_FLAGS and not isinstance(value, bool):
            raise InvalidArgument(f"{name} must be True or False, got {value!r}")
        if name == "rate_limit_per_second" and (
            isinstance(value, bool) or not isinstance(value, int | float) or value != value
        ):
            raise InvalidArgument(f"rate_limit_per_second must be a number, got {value!r}")
        params[name] = value
    return Query(_named("policy_set"), params, lambda rows: _policies(rows)[0])


def queue_codec(queue: str) -> Query[str]:
    """The codec name a queue's sends use by default (its policy's; 'json' without one)."""
    return Query(_named("queue_codec"), {"queue": queue}, decoded.scalar)


def _optional_ids(msg_ids: Iterable[int] | None) -> list[int] | None:
    return None if msg_ids is None else _msg_ids(msg_ids)


def dead_letter_list(queue: str, qty: int, *, after: int = 0) -> Query[list[Message]]:
    """The queue's dead letters (in its dead-letter queue, or its archive), oldest first."""
    params = {"queue": queue, "qty": arg.count(qty, "qty"), "after": _msg_ids([after])[0]}
    return _messages("dead_letter_list", params)


def dead_letter_get(queue: str, msg_id: int) -> Query[Message | None]:
    """One dead letter, by the msg_id it had in the queue; None when there is none."""
    params = {"queue": queue, "msg_id": _msg_ids([msg_id])[0]}
    return Query(_named("dead_letter_get"), params, lambda rows: decoded.message(rows[0]) if rows else None)


def dead_letter_replay_many(queue: str, msg_ids: Iterable[int] | None = None) -> Query[dict[int, int]]:
    """Send dead letters back to their queue (by the msg_ids they had in it): {that msg_id: new
    msg_id}; None replays all."""
    params = {"queue": queue, "msg_ids": _optional_ids(msg_ids)}
    return Query(_named("dead_letter_replay_many"), params, lambda rows: {row[0]: row[1] for row in rows})


def dead_letter_purge_many(queue: str, msg_ids: Iterable[int] | None = None) -> Query[int]:
    """Delete dead letters (None: all of the queue's); returns how many."""
    params = {"queue": queue, "msg_ids": _optional_ids(msg_ids)}
    return Query(_named("dead_letter_purge_many"), params, decoded.scalar)


# Rows deleted per statement by archive retention: short transactions, few round trips.
DEFAULT_TRIM_BATCH = 10_000


def archive_trim(queue: str, batch_size: int = DEFAULT_TRIM_BATCH) -> Query[int]:
    """One arg.batch of archive retention; returns the rows deleted (repeat until 0)."""
    params = {"queue": queue, "batch_size": arg.count(batch_size, "batch_size")}
    return Query(_named("archive_trim"), params, decoded.scalar)


def dedup_keys_trim(queue: str | None, batch_size: int = DEFAULT_TRIM_BATCH) -> Query[int]:
    """One arg.batch of expired dedup keys removed; returns how many (repeat until 0)."""
    params = {"queue": queue, "batch_size": arg.count(batch_size, "batch_size")}
    return Query(_named("dedup_keys_trim"), params, decoded.scalar, _queue_or_every_queue)


def _queue_or_every_queue(name: object) -> object:
    return None if name is None else check_queue_name(name)


# -- the RabbitMQ bridge ------------------------------------------------------------


def message_ack_published_many(
    queue: str, items: Sequence[Receivable], published: Sequence[Mapping[str, Any]]
) -> Query[list[int]]:
    """Ack (by policy) messages the broker confirmed; archived ones keep their publish record."""
    if len(items) != len(published):
        raise InvalidArgument(f"{len(published)} publish records for {len(items)} receipts")
    params = {
        "queue": queue,
        "receipts": arg.receipt_texts(items),
        "published": [arg.encode_json(dict(p), "publish record") for p in published],
    }
    return Query(_named("message_ack_published_many"), params, decoded.ids)


def message_receive_many(
    queue: str,
    message_ids: Sequence[str | None],
    messages: Sequence[Any],
    headers: Sequence[Mapping[str, Any] | None],
    *,
    seen_within: float,
) -> Query[list[tuple[str | None, int]]]:
    """Send the messages whose ids were not seen within ``seen_within`` seconds, in one transaction.

    Returns (message_id, msg_id) per message sent; the others were duplicates. A message
    without an id (None) cannot be recognised again, so it is always sent.
    """
    if not len(message_ids) == len(messages) == len(headers):
        raise InvalidArgument("message_ids, messages and headers must have one entry per message")
    params = {
        "queue": queue,
        "message_ids": list(message_ids),
        "messages": arg.json_array([arg.encode_json(m) for m in messages]),
        "headers": arg.json_array([arg.headers_object(h) for h in headers]),
        "seen_within": arg.duration(seen_within, "seen_within"),
    }
    return Query(_named("message_receive_many"), params, lambda rows: [(r[0], r[1]) for r in rows])


def inbound_seen_prune(
    seen_within: float, batch_size: int = DEFAULT_TRIM_BATCH, queue: str | None = None
) -> Query[int]:
    """One arg.batch of forgetting inbound message ids older than ``seen_within`` seconds, of
    ``queue`` or (None) of every queue (repeat until 0)."""
    params = {
        "seen_within": arg.duration(seen_within, "seen_within"),
        "batch_size": arg.count(batch_size, "batch_size"),
        "queue": queue,
    }
    return Query(_named("inbound_seen_prune"), params, decoded.scalar, _queue_or_every_queue)


# -- schedules (sql/functions/78_schedules.sql) ------------------------------------------


def _schedules(rows: list[Row]) -> list[Schedule]:
    return [Schedule(*row) for row in rows]


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, got {value!r}")
    return value


def schedule_add(
    name: str,
    queue: str,
    cron: str,
    message: Any,
    *,
    headers: Mapping[str, Any] | None = None,
    timezone: str = "UTC",
    replace: bool = False,
) -> Query[Schedule]:
    """Add a schedule (the server checks the cron expression, the time zone and the queue)."""
    params = {
        "name": _text(name, "schedule name"),
        "queue": _text(queue, "queue"),
        "cron": _text(cron, "cron"),
        "message": arg.encode_json(message),
        "headers": arg.headers_object(headers),
        "timezone": _text(timezone, "timezone"),
        "replace": bool(replace),
    }
    return Query(_named("schedule_add"), params, lambda rows: _schedules(rows)[0])


def schedule_list() -> Query[list[Schedule]]:
    return Query(_named("schedule_list"), {}, _schedules)


def schedule_remove(name: str) -> Query[bool]:
    return Query(_named("schedule_remove"), {"name": _text(name, "schedule name")}, decoded.scalar)


def schedule_pause(name: str) -> Query[Schedule]:
    params = {"name": _text(name, "schedule name")}
    return Query(_named("schedule_pause"), params, lambda rows: _schedules(rows)[0])


def schedule_resume(name: str) -> Query[Schedule]:
    params = {"name": _text(name, "schedule name")}
    return Query(_named("schedule_resume"), params, lambda rows: _schedules(rows)[0])


def schedule_tick(as_of: datetime | None = None) -> Query[list[ScheduleTick]]:
    """Send every due tick (as of ``as_of``, default now) once, whoever else is ticking."""
    if as_of is not None and (not isinstance(as_of, datetime) or as_of.tzinfo is None):
        raise InvalidArgument(f"as_of must be a timezone-aware datetime, got {as_of!r}")
    return Query(_named("schedule_tick"), {"as_of": as_of}, lambda rows: [ScheduleTick(*r) for r in rows])


def schedule_next_wake() -> Query[float | None]:
    """Seconds until the next tick of any running schedule (0: one is due), None without one."""
    return Query(_named("schedule_next_wake"), {}, decoded.scalar)


def schedules_channel() -> Query[str]:
    return Query(_named("schedules_channel"), {}, decoded.scalar)


# -- workers ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerBeat:
    """What a queue worker tells in its heartbeat (pgbroker.worker_heartbeat)."""

    worker_id: UUID
    queue: str
    host: str
    pid: int
    concurrency: int
    in_flight: int
    completed: int
    retried: int
    dead_lettered: int


def worker_heartbeat(beat: WorkerBeat) -> Query[None]:
    """Register a queue worker, or renew its row."""
    params = {field: getattr(beat, field) for field in WorkerBeat.__slots__}
    return Query(_named("worker_heartbeat"), params, decoded.nothing)


def worker_stopped(worker_id: UUID, queue: str) -> Query[None]:
    return Query(_named("worker_stopped"), {"worker_id": worker_id, "queue": queue}, decoded.nothing)
