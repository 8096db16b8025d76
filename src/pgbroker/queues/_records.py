"""Typed records returned by the clients: messages, receipts, queues, metrics."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypedDict

from pgbroker._frozen import builder
from pgbroker.codecs.errors import CodecError
from pgbroker.errors import InvalidArgument

_RECEIPT = re.compile(r"^([0-9]{1,19}):([0-9]{1,10}):(-?[0-9]{1,19})$")
_BIGINT_MAX = 2**63 - 1
_INTEGER_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Receipt:
    """Proof of one delivery of one message, needed to ack, nack or extend it.

    Its text form ``<msg_id>:<read_ct>:<lease>`` is made by the SQL function
    pgbroker.receipt(); here it is only carried and parsed, never computed.
    """

    msg_id: int
    read_ct: int
    lease: int  # the lease's end (the message's vt) in microseconds since the epoch

    @classmethod
    def parse(cls, token: str) -> Receipt:
        match = _RECEIPT.match(token.strip())
        # The same rules as pgbroker._parse_receipt: integers within their SQL types.
        if (
            match is None
            or int(match[1]) > _BIGINT_MAX
            or int(match[2]) > _INTEGER_MAX
            or not -_BIGINT_MAX - 1 <= int(match[3]) <= _BIGINT_MAX
        ):
            raise InvalidArgument(
                f"malformed receipt {token!r}: expected <msg_id>:<read_ct>:<lease>",
                hint="Pass the receipt exactly as the read returned it.",
            )
        return cls(int(match[1]), int(match[2]), int(match[3]))

    @classmethod
    def issued(cls, token: str) -> Receipt:
        """A receipt as the server just issued it (pgbroker.receipt(), in a read's or an extend's
        row): split, not checked, which is a third of a worker's cost of decoding a message. A
        receipt from anywhere else (a caller, a command line) goes through parse()."""
        msg_id, read_ct, lease = token.split(":")
        return _build_receipt(int(msg_id), int(read_ct), int(lease))

    def __str__(self) -> str:
        return f"{self.msg_id}:{self.read_ct}:{self.lease}"


_build_receipt = builder(Receipt)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def message_identity(position: str, enqueued_at: datetime) -> str:
    """``<position>@<enqueued_at>``, the time in whole microseconds since the Unix epoch.

    A msg_id alone is not unique across a failover: sends acknowledged on the old primary and
    not yet replicated are lost with their sequence values, and the new primary hands the same
    msg_ids out again, to other messages. enqueued_at is set by the server when the message is
    sent and kept by every redelivery, retry, archive and move, so the pair names one message
    on every publish attempt, and a reissued msg_id (sent later) gets another identity.
    """
    return f"{position}@{(enqueued_at - _EPOCH) // timedelta(microseconds=1)}"


@dataclass(frozen=True, slots=True)
class Message:
    """A message as read, popped or returned by set_vt.

    ``receipt`` is set for messages read through pgbroker (a lease is held)
    and is None for popped messages and set_vt results.

    ``message`` is the body decoded by the codec it was sent with, named by ``codec``
    (pgbroker.codecs). A body that cannot be decoded (its codec unknown to this process, or
    its bytes damaged) is left as stored, its JSON envelope, and ``codec_error`` says why.
    """

    msg_id: int
    read_ct: int
    enqueued_at: datetime
    last_read_at: datetime | None
    vt: datetime
    message: Any
    headers: dict[str, Any] | None
    receipt: Receipt | None = None
    codec: str = "json"
    codec_error: CodecError | None = None

    @property
    def identity(self) -> str:
        """The message's identity for de-duplication downstream, ``<msg_id>@<enqueued_at>``
        (message_identity): the same on every delivery of this message, and different for
        another message that got the same msg_id after a failover lost the tail of the WAL."""
        return message_identity(str(self.msg_id), self.enqueued_at)


#: Message(...) from every field in order, made fast for the reads (pgbroker._frozen)
build_message = builder(Message)


@dataclass(frozen=True, slots=True)
class PeekedMessage(Message):
    """A message as a peek saw it (pgbroker.peek): no lease was taken, so ``receipt`` is None.

    ``state``: 'waiting' (a read would deliver it), 'delayed' (sent with a delay not yet
    passed), 'in_flight' (delivered, its visibility timeout still running) or 'dead' (a dead
    letter of the queue).
    """

    state: str = "waiting"


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A row of pgmq.list_queues()."""

    queue_name: str
    is_partitioned: bool
    is_unlogged: bool
    created_at: datetime


@dataclass(frozen=True, slots=True)
class BlockingSession:
    """A row of pgbroker.blocking_sessions(): a session whose long transaction holds the engine's
    tables or the xmin horizon (docs/operations.md, "Long transactions")."""

    pid: int
    role_name: str | None
    application_name: str | None
    client_addr: str | None
    state: str | None  # 'idle in transaction' for a client that left its transaction open
    transaction_age_sec: float
    state_age_sec: float | None
    tables: list[str]  # the engine's tables it holds a lock on
    holds_horizon: bool  # it keeps vacuum from removing dead tuples
    query: str | None  # its last statement (hidden from a role without pg_read_all_stats)


@dataclass(frozen=True, slots=True)
class Metrics:
    """A row of pgmq.metrics(); ages in whole seconds, None when the queue is empty."""

    queue_name: str
    queue_length: int
    newest_msg_age_sec: int | None
    oldest_msg_age_sec: int | None
    total_messages: int
    scrape_time: datetime
    queue_visible_length: int
    default_partition_length: int | None  # None for a queue that is not partitioned


@dataclass(frozen=True, slots=True)
class Policy:
    """A queue's delivery policy (pgbroker.policy()); None turns a limit off.

    ``dead_letter_queue`` None sends dead letters to the queue's archive; the
    archive settings apply to pgbroker.trim_archive (`pgbroker maintain`).
    """

    queue_name: str
    max_deliveries: int | None
    backoff: str  # 'fixed' or 'exponential'
    backoff_base_seconds: int
    backoff_max_seconds: int
    backoff_jitter: bool
    dead_letter_queue: str | None
    ack_mode: str  # 'archive' or 'delete'
    max_depth: int | None
    archive_retention_seconds: int | None
    archive_max_rows: int | None
    updated_at: datetime
    codec: str  # what the clients' sends encode with by default (pgbroker.codecs)
    priorities: bool  # the queue has its priority index (set by its first prioritized send)
    dedup_window_seconds: int
    dedup_mode: str  # 'window' or 'queued'
    max_in_flight: int | None
    max_in_flight_per_key: int | None
    rate_limit_per_second: float | None
    paused: bool


class PolicyChanges(TypedDict, total=False):
    """Settings to change with set_policy; a setting left out stays as it is.

    0 turns max_deliveries, max_depth, archive_retention_seconds,
    archive_max_rows, max_in_flight, max_in_flight_per_key and
    rate_limit_per_second off; dead_letter_queue='' sends dead letters to the
    queue's archive again. priorities=True builds the priority index before a
    backlog builds up (a first prioritized send would build it). codec: json,
    msgpack, protobuf:<message type> or avro:<schema full name> (docs/codecs.md).
    """

    max_deliveries: int
    backoff: Literal["fixed", "exponential"]
    backoff_base_seconds: int
    backoff_max_seconds: int
    backoff_jitter: bool
    dead_letter_queue: str
    ack_mode: Literal["archive", "delete"]
    max_depth: int
    archive_retention_seconds: int
    archive_max_rows: int
    codec: str
    priorities: bool
    dedup_window_seconds: int
    dedup_mode: Literal["window", "queued"]
    max_in_flight: int
    max_in_flight_per_key: int
    rate_limit_per_second: float


@dataclass(frozen=True, slots=True)
class Schedule:
    """A cron schedule (pgbroker.schedule_list()): sends ``message`` to ``queue_name`` at every tick.

    ``next_run`` is the next tick; ``last_run`` the last tick sent (or refused: then
    ``last_error`` says why and ``last_msg_id`` is None).
    """

    name: str
    queue_name: str
    cron: str
    timezone: str
    message: Any
    headers: dict[str, Any] | None
    paused: bool
    next_run: datetime
    last_run: datetime | None
    last_msg_id: int | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ScheduleTick:
    """A tick a scheduler handled: the msg_id it sent, or the error that refused the send."""

    schedule_name: str
    tick: datetime
    msg_id: int | None
    error: str | None
