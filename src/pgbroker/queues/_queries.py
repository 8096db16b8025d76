"""The query layer shared by the sync and asyncio clients.

Each function here turns one client operation into a Query: the SQL text
(from _sql/queries/queues.sql), its parameters, and how to decode the rows. It does
no I/O, so a sync and an async executor can run the same Query objects and
no operation is written twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Generic, LiteralString, TypeAlias, TypeVar
from uuid import UUID

from pgbroker import _sql as sql
from pgbroker import codecs
from pgbroker._db.names import check_dropped_queue_name, check_queue_name, check_stream_name
from pgbroker.codecs import Codec, CodecError
from pgbroker.errors import InvalidArgument, InvalidMessage, StaleReceipt
from pgbroker.queues._records import (
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

T = TypeVar("T")
Row: TypeAlias = tuple[Any, ...]
Delay: TypeAlias = int | timedelta | datetime
Receivable: TypeAlias = Receipt | Message | str


@dataclass(frozen=True, slots=True)
class Query(Generic[T]):
    sql: LiteralString
    params: Mapping[str, Any]
    decode: Callable[[list[Row]], T]
    check_queue: Callable[[object], object] = check_queue_name

    def __post_init__(self) -> None:
        # Every name is judged before any query, by the engine's rule (a NUL, which libpq cannot
        # even send, included).
        if "queue" in self.params:
            self.check_queue(self.params["queue"])
        if "stream" in self.params:
            check_stream_name(self.params["stream"])


def _named(name: str) -> LiteralString:
    return sql.queries("queues")[name]


# -- encoding -----------------------------------------------------------------


def encode_json(value: Any, what: str = "message") -> str:
    """JSON text for a payload or headers object, or InvalidMessage naming the problem."""
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(
            f"{what} is not JSON-serialisable: {exc}",
            hint="Send dicts, lists, strings, numbers, booleans or None (no NaN or Infinity).",
        ) from None
    except RecursionError:
        # The encoder meets the depth as it goes: nothing walks a message twice to measure it.
        raise InvalidMessage(
            f"{what} is nested too deeply to encode", hint="Flatten it: jsonb is no place for deep trees."
        ) from None


def _headers_object(headers: Mapping[str, Any] | None) -> str | None:
    if headers is None:
        return None
    if not isinstance(headers, Mapping):
        raise InvalidMessage(f"headers must be a mapping, got {type(headers).__name__}")
    return encode_json(dict(headers), "headers")


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{what} must be a mapping, got {type(value).__name__} {value!r}")
    return value


def flag(value: Any, what: str) -> bool:
    """``value`` if it is True or False, else InvalidArgument naming ``what`` (1 and "no" are
    not flags: a truthy string would turn a setting on by accident)."""
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be True or False, got {value!r}")
    return value


def batch(values: Any, what: str) -> list[Any]:
    """The items of an iterable argument as a list, refusing a lone string, bytes or mapping
    (iterable, but surely meant as one item) and anything not iterable."""
    if isinstance(values, str | bytes | bytearray | Mapping) or not isinstance(values, Iterable):
        raise InvalidArgument(
            f"{what} must be a list (or another iterable) of items, got {type(values).__name__}",
            hint="Pass [item] for one item; the single-item methods take one directly.",
        )
    return list(values)


def duration(value: int | float | timedelta, what: str) -> float:
    """Seconds >= 0 from a number or timedelta, or InvalidArgument naming ``what``."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        raise InvalidArgument(f"{what} must be a number of seconds, got {value!r}")
    if seconds < 0:
        raise InvalidArgument(f"{what} must be >= 0 seconds, got {value!r}")
    return float(seconds)


_INTEGER_MAX = 2**31 - 1  # SQL integer: vt, qty, delay
_BIGINT_MAX = 2**63 - 1  # SQL bigint: msg_id


def _seconds(value: int | float | timedelta, what: str) -> int:
    """Whole seconds >= 0 that fit SQL's integer, rounding fractions up so a wait is never shorter."""
    seconds = math.ceil(duration(value, what))
    if seconds > _INTEGER_MAX:
        raise InvalidArgument(f"{what} must be at most {_INTEGER_MAX} seconds, got {value!r}")
    return seconds


def _count(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INTEGER_MAX:
        raise InvalidArgument(f"{what} must be an integer from 0 to {_INTEGER_MAX}, got {value!r}")
    return value


def receipt_of(item: Receivable) -> Receipt:
    """The receipt carried by a message, or the receipt itself (object or text form)."""
    if isinstance(item, Receipt):
        return item
    if isinstance(item, Message):
        if item.receipt is None:
            raise InvalidArgument(
                f"message {item.msg_id} carries no receipt (it was popped or set with set_vt)",
                hint="Only messages read through pgbroker can be acked, nacked or extended.",
            )
        return item.receipt
    if isinstance(item, str):
        return Receipt.parse(item)
    raise InvalidArgument(f"expected a Receipt, Message or receipt text, got {type(item).__name__}")


def _receipts(items: Iterable[Receivable]) -> list[str]:
    """The text of each item's receipt, for a batch operation."""
    return [str(receipt_of(item)) for item in batch(items, "items")]


# -- decoding -----------------------------------------------------------------


def _message(row: Row) -> Message:
    stored = _stored_message(row)
    if stored.codec == codecs.JsonCodec.name:  # not an envelope: the JSON fast path
        return stored
    try:
        body = codecs.from_stored(stored.message)
    except CodecError as exc:
        # Not an error of the read: the message is leased all the same, and the caller decides
        # (the worker fails it, so that it is retried and, in the end, dead-lettered).
        return replace(stored, codec_error=exc)
    return replace(stored, message=body.value, codec=body.codec)


def _messages(rows: list[Row]) -> list[Message]:
    return [_message(row) for row in rows]


def _stored_message(row: Row) -> Message:
    """A message with its body as stored, undecoded (a binary body stays its JSON envelope) and
    its codec named: what a bridge forwards as it is, without the codec's schema or class."""
    receipt = Receipt.parse(row[7]) if len(row) > 7 and row[7] is not None else None
    msg_id, read_ct, enqueued_at, last_read_at, vt, stored, headers = row[:7]
    codec = codecs.envelope_codec(stored) if codecs.is_envelope(stored) else codecs.JsonCodec.name
    return Message(msg_id, read_ct, enqueued_at, last_read_at, vt, stored, headers, receipt, codec)


def _stored_messages(rows: list[Row]) -> list[Message]:
    return [_stored_message(row) for row in rows]


def _ids(rows: list[Row]) -> list[int]:
    return [row[0] for row in rows]


def _scalar(rows: list[Row]) -> Any:
    return rows[0][0]


def _nothing(rows: list[Row]) -> None:
    return None


def _metrics(rows: list[Row]) -> list[Metrics]:
    return [Metrics(*row) for row in rows]


def _queue_infos(rows: list[Row]) -> list[QueueInfo]:
    return [QueueInfo(*row) for row in rows]


# -- queue management ---------------------------------------------------------


def queue_create(queue: str, *, unlogged: bool = False) -> Query[None]:
    name = "queue_create_unlogged" if flag(unlogged, "unlogged") else "queue_create"
    return Query(_named(name), {"queue": queue}, _nothing)


def queue_drop(queue: str) -> Query[bool]:
    return Query(_named("queue_drop"), {"queue": queue}, _scalar, check_dropped_queue_name)


def queue_list() -> Query[list[QueueInfo]]:
    return Query(_named("queue_list"), {}, _queue_infos)


def queue_metrics(queue: str) -> Query[Metrics]:
    return Query(_named("queue_metrics"), {"queue": queue}, lambda rows: _metrics(rows)[0])


def queue_metrics_all() -> Query[list[Metrics]]:
    return Query(_named("queue_metrics_all"), {}, _metrics)


def queue_purge(queue: str) -> Query[int]:
    return Query(_named("queue_purge"), {"queue": queue}, _scalar)


def queue_pause(queue: str) -> Query[bool]:
    return Query(_named("queue_pause"), {"queue": queue}, _scalar)


def queue_resume(queue: str) -> Query[bool]:
    return Query(_named("queue_resume"), {"queue": queue}, _scalar)


# As pgmq.enable_notify_insert's default.
DEFAULT_NOTIFY_THROTTLE_MS = 250


def notify_enable(queue: str, throttle_ms: int = DEFAULT_NOTIFY_THROTTLE_MS) -> Query[None]:
    params = {"queue": queue, "throttle_ms": _count(throttle_ms, "throttle_ms")}
    return Query(_named("notify_enable"), params, _nothing)


def notify_enable_if_disabled(queue: str, throttle_ms: int = DEFAULT_NOTIFY_THROTTLE_MS) -> Query[None]:
    params = {"queue": queue, "throttle_ms": _count(throttle_ms, "throttle_ms")}
    return Query(_named("notify_enable_if_disabled"), params, _nothing)


def notify_disable(queue: str) -> Query[None]:
    return Query(_named("notify_disable"), {"queue": queue}, _nothing)


def notify_channel(queue: str) -> Query[str]:
    return Query(_named("notify_channel"), {"queue": queue}, _scalar)


# -- messages -----------------------------------------------------------------


def message_send_many(
    queue: str,
    messages: Iterable[Any],
    *,
    headers: Sequence[Mapping[str, Any] | None] | None = None,
    delay: Delay | None = None,
    codec: Codec | None = None,
) -> Query[list[int]]:
    """``codec`` None: JSON, as pgmq stores it; another codec stores each body in an envelope."""
    encoded = [
        encode_json(m) if codec is None else codecs.to_stored_text(m, codec)
        for m in batch(messages, "messages")
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
        encoded_headers = [_headers_object(h) for h in batch(headers, "headers")]
        if len(encoded_headers) != len(encoded):
            raise InvalidArgument(
                f"headers has {len(encoded_headers)} entries for {len(encoded)} messages",
                hint="Give one headers mapping (or None) per message, or no headers at all.",
            )
    params: dict[str, Any] = {"queue": queue, "messages": encoded, "headers": encoded_headers}
    if delay is None:
        return Query(_named("message_send_many"), params, _ids)
    if isinstance(delay, datetime):
        if delay.tzinfo is None:
            raise InvalidArgument("delay must be a timezone-aware datetime (naive datetimes are ambiguous)")
        return Query(_named("message_send_many_delay_until"), {**params, "delay": delay}, _ids)
    seconds = _seconds(delay, "delay")
    return Query(_named("message_send_many_delay_seconds"), {**params, "delay": seconds}, _ids)


def message_read_many(
    queue: str,
    qty: int,
    *,
    vt: int | timedelta = 30,
    conditional: Mapping[str, Any] | None = None,
    decode: bool = True,
) -> Query[list[Message]]:
    """One read, never waiting: a waiting read repeats it (see pgbroker._db.wakeups.Waiting).
    ``decode=False`` leaves each body as stored (see _stored_message)."""
    params: dict[str, Any] = {
        "queue": queue,
        "vt": _seconds(vt, "vt"),
        "qty": _count(qty, "qty"),
        "conditional": encode_json(dict(_mapping(conditional or {}, "conditional")), "conditional"),
    }
    return Query(
        _named("message_read_many"), params, _messages if flag(decode, "decode") else _stored_messages
    )


def message_complete_and_read(
    queue: str, items: Iterable[Receivable], qty: int, *, vt: int | timedelta = 30
) -> Query[tuple[list[int], list[Message]]]:
    """Ack by the queue's policy, then read, in one statement: (msg_ids acked, messages read)."""
    params: dict[str, Any] = {
        "queue": queue,
        "receipts": _receipts(items),
        "vt": _seconds(vt, "vt"),
        "qty": _count(qty, "qty"),
        "conditional": "{}",
    }

    def decode(rows: list[Row]) -> tuple[list[int], list[Message]]:
        acked = list(rows[0][0]) if rows and rows[0][0] is not None else []
        return acked, [_message(row[1:]) for row in rows if row[1] is not None]

    return Query(_named("message_complete_and_read"), params, decode)


def message_pop_many(queue: str, qty: int) -> Query[list[Message]]:
    return Query(_named("message_pop_many"), {"queue": queue, "qty": _count(qty, "qty")}, _messages)


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
    receipt = receipt_of(item)
    params = {"queue": queue, "receipt": str(receipt), "archive": flag(archive, "archive")}
    return Query(_named("message_ack"), params, _held(queue, receipt))


def message_ack_many(queue: str, items: Iterable[Receivable], *, archive: bool = True) -> Query[list[int]]:
    params = {"queue": queue, "receipts": _receipts(items), "archive": flag(archive, "archive")}
    return Query(_named("message_ack_many"), params, _ids)


def message_nack(queue: str, item: Receivable, *, delay: int | timedelta = 0) -> Query[None]:
    receipt = receipt_of(item)
    params = {"queue": queue, "receipt": str(receipt), "delay": _seconds(delay, "delay")}
    return Query(_named("message_nack"), params, _held(queue, receipt))


def message_nack_many(
    queue: str, items: Iterable[Receivable], *, delay: int | timedelta = 0
) -> Query[list[int]]:
    params = {
        "queue": queue,
        "receipts": _receipts(items),
        "delay": _seconds(delay, "delay"),
    }
    return Query(_named("message_nack_many"), params, _ids)


def message_extend(queue: str, item: Receivable, *, vt: int | timedelta) -> Query[Receipt]:
    receipt = receipt_of(item)
    params = {"queue": queue, "receipt": str(receipt), "vt": _seconds(vt, "vt")}
    held = _held(queue, receipt)
    return Query(_named("message_extend"), params, lambda rows: Receipt.parse(held(rows)))


def message_extend_many(
    queue: str, items: Iterable[Receivable], *, vt: int | timedelta
) -> Query[dict[int, Receipt]]:
    params = {"queue": queue, "receipts": _receipts(items), "vt": _seconds(vt, "vt")}
    return Query(
        _named("message_extend_many"),
        params,
        lambda rows: {msg_id: Receipt.parse(token) for msg_id, token in rows},
    )


def _msg_ids(msg_ids: Iterable[int]) -> list[int]:
    ids = batch(msg_ids, "msg_ids")
    for msg_id in ids:
        if isinstance(msg_id, bool) or not isinstance(msg_id, int) or not 0 <= msg_id <= _BIGINT_MAX:
            raise InvalidArgument(f"msg_id must be an integer from 0 to {_BIGINT_MAX}, got {msg_id!r}")
    return ids


def message_archive_many(queue: str, msg_ids: Iterable[int]) -> Query[list[int]]:
    return Query(_named("message_archive_many"), {"queue": queue, "msg_ids": _msg_ids(msg_ids)}, _ids)


def message_delete_many(queue: str, msg_ids: Iterable[int]) -> Query[list[int]]:
    return Query(_named("message_delete_many"), {"queue": queue, "msg_ids": _msg_ids(msg_ids)}, _ids)


def message_set_vt_many(
    queue: str, msg_ids: Iterable[int], vt: int | timedelta | datetime
) -> Query[list[Message]]:
    params: dict[str, Any] = {"queue": queue, "msg_ids": _msg_ids(msg_ids)}
    if isinstance(vt, datetime):
        if vt.tzinfo is None:
            raise InvalidArgument("vt must be a timezone-aware datetime (naive datetimes are ambiguous)")
        return Query(_named("message_set_vt_until"), {**params, "vt": vt}, _messages)
    return Query(_named("message_set_vt_seconds"), {**params, "vt": _seconds(vt, "vt")}, _messages)


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
        "qty": _count(qty, "qty"),
        "after": _msg_ids([after])[0],
        "state": state,
        "before": None if before is None else _msg_ids([before])[0],
        "header_key": header,
        "header_value": header_value,
        "contains": None if contains is None else encode_json(dict(contains), "contains"),
        "enqueued_after": enqueued_after,
        "enqueued_before": enqueued_before,
    }
    return Query(_named("message_peek_many"), params, _peeked)


def _peeked(rows: list[Row]) -> list[PeekedMessage]:
    """Each row's message decoded as a read decodes it (its codec), with its state; the receipt
    stays None: a peek takes no lease."""
    peeked = []
    for row in rows:
        m = _message(row[:7])
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
    params = {"queue": queue, "receipts": _receipts(items)}
    return Query(_named("message_complete_many"), params, _ids)


def message_fail(
    queue: str, item: Receivable, *, error: str | None = None, traceback: str | None = None
) -> Query[str]:
    """Retry later with the policy's back-off, or dead-letter: 'retry' or 'dead_lettered'."""
    receipt = receipt_of(item)
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
    queue: str, items: Iterable[Receivable], *, error: str | None = None, traceback: str | None = None
) -> Query[dict[int, str]]:
    """message_fail for many receipts with one error: {msg_id: outcome} for those that held."""
    params = {
        "queue": queue,
        "receipts": _receipts(items),
        "error": _error_text(error, "error"),
        "traceback": _error_text(traceback, "traceback"),
    }
    return Query(_named("message_fail_many"), params, lambda rows: dict(rows))


def _policies(rows: list[Row]) -> list[Policy]:
    return [Policy(*row) for row in rows]


def policy_get(queue: str) -> Query[Policy]:
    return Query(_named("policy_get"), {"queue": queue}, lambda rows: _policies(rows)[0])


def policy_list() -> Query[list[Policy]]:
    return Query(_named("policy_list"), {}, _policies)


_POLICY_LIMITS = {
    "max_deliveries": _INTEGER_MAX,
    "backoff_base_seconds": _INTEGER_MAX,
    "backoff_max_seconds": _INTEGER_MAX,
    "max_depth": _BIGINT_MAX,
    "archive_retention_seconds": _BIGINT_MAX,
    "archive_max_rows": _BIGINT_MAX,
    "dedup_window_seconds": _INTEGER_MAX,
    "max_in_flight": _INTEGER_MAX,
    "max_in_flight_per_key": _INTEGER_MAX,
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
    return Query(_named("queue_codec"), {"queue": queue}, _scalar)


def _optional_ids(msg_ids: Iterable[int] | None) -> list[int] | None:
    return None if msg_ids is None else _msg_ids(msg_ids)


def dead_letter_list(queue: str, qty: int, *, after: int = 0) -> Query[list[Message]]:
    """The queue's dead letters (in its dead-letter queue, or its archive), oldest first."""
    params = {"queue": queue, "qty": _count(qty, "qty"), "after": _msg_ids([after])[0]}
    return Query(_named("dead_letter_list"), params, _messages)


def dead_letter_get(queue: str, msg_id: int) -> Query[Message | None]:
    """One dead letter, by the msg_id it had in the queue; None when there is none."""
    params = {"queue": queue, "msg_id": _msg_ids([msg_id])[0]}
    return Query(_named("dead_letter_get"), params, lambda rows: _message(rows[0]) if rows else None)


def dead_letter_replay_many(queue: str, msg_ids: Iterable[int] | None = None) -> Query[dict[int, int]]:
    """Send dead letters back to their queue (by the msg_ids they had in it): {that msg_id: new
    msg_id}; None replays all."""
    params = {"queue": queue, "msg_ids": _optional_ids(msg_ids)}
    return Query(_named("dead_letter_replay_many"), params, lambda rows: {row[0]: row[1] for row in rows})


def dead_letter_purge_many(queue: str, msg_ids: Iterable[int] | None = None) -> Query[int]:
    """Delete dead letters (None: all of the queue's); returns how many."""
    params = {"queue": queue, "msg_ids": _optional_ids(msg_ids)}
    return Query(_named("dead_letter_purge_many"), params, _scalar)


# Rows deleted per statement by archive retention: short transactions, few round trips.
DEFAULT_TRIM_BATCH = 10_000


def archive_trim(queue: str, batch_size: int = DEFAULT_TRIM_BATCH) -> Query[int]:
    """One batch of archive retention; returns the rows deleted (repeat until 0)."""
    params = {"queue": queue, "batch_size": _count(batch_size, "batch_size")}
    return Query(_named("archive_trim"), params, _scalar)


def dedup_keys_trim(queue: str | None, batch_size: int = DEFAULT_TRIM_BATCH) -> Query[int]:
    """One batch of expired dedup keys removed; returns how many (repeat until 0)."""
    params = {"queue": queue, "batch_size": _count(batch_size, "batch_size")}
    return Query(_named("dedup_keys_trim"), params, _scalar, _queue_or_every_queue)


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
        "receipts": _receipts(items),
        "published": [encode_json(dict(p), "publish record") for p in published],
    }
    return Query(_named("message_ack_published_many"), params, _ids)


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
        "messages": [encode_json(m) for m in messages],
        "headers": [_headers_object(h) for h in headers],
        "seen_within": duration(seen_within, "seen_within"),
    }
    return Query(_named("message_receive_many"), params, lambda rows: [(r[0], r[1]) for r in rows])


def inbound_seen_prune(seen_within: float, batch_size: int = DEFAULT_TRIM_BATCH) -> Query[int]:
    """One batch of forgetting inbound message ids older than ``seen_within`` seconds (repeat until 0)."""
    params = {
        "seen_within": duration(seen_within, "seen_within"),
        "batch_size": _count(batch_size, "batch_size"),
    }
    return Query(_named("inbound_seen_prune"), params, _scalar)


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
        "message": encode_json(message),
        "headers": _headers_object(headers),
        "timezone": _text(timezone, "timezone"),
        "replace": bool(replace),
    }
    return Query(_named("schedule_add"), params, lambda rows: _schedules(rows)[0])


def schedule_list() -> Query[list[Schedule]]:
    return Query(_named("schedule_list"), {}, _schedules)


def schedule_remove(name: str) -> Query[bool]:
    return Query(_named("schedule_remove"), {"name": _text(name, "schedule name")}, _scalar)


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
    return Query(_named("schedule_next_wake"), {}, _scalar)


def schedules_channel() -> Query[str]:
    return Query(_named("schedules_channel"), {}, _scalar)


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
    return Query(_named("worker_heartbeat"), params, _nothing)


def worker_stopped(worker_id: UUID) -> Query[None]:
    return Query(_named("worker_stopped"), {"worker_id": worker_id}, _nothing)
