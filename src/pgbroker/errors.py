"""Typed exceptions, and the mapping from Postgres errors to them.

pgbroker's own functions (schema ``pgbroker``) raise SQLSTATEs of class PB. The functions of
schema ``pgmq`` raise what pgmq 1.13 raises (``P0001`` for its RAISEs, ``42P01`` for a missing
queue, ...), so that pgmq's clients see pgmq's errors; pgbroker's code rides in their DETAIL as
``pgbroker PB00n: <explanation>`` (sql/functions/10_queues.sql). The mapping reads that code first,
then the SQLSTATE: never the message text. Every exception keeps the server's message and hint,
which name what was wrong and how to fix it; ``sqlstate`` is the code the server sent, ``code``
pgbroker's (the same for errors of class PB).
"""

from __future__ import annotations

import re

import psycopg
from psycopg import errors as pg_errors


class PgbrokerError(Exception):
    """Base class of every error pgbroker raises."""

    sqlstate: str | None = None

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint or None
        # pgbroker's code for the error (class PB), whatever SQLSTATE the server sent.
        self.code = type(self).sqlstate

    def __str__(self) -> str:
        return f"{self.message}\nhint: {self.hint}" if self.hint else self.message


class InvalidQueueName(PgbrokerError):
    """A queue (or stream) name is empty, too long, or contains forbidden characters."""

    sqlstate = "PB001"


class QueueNotFound(PgbrokerError):
    """The queue was never created, or was dropped."""

    sqlstate = "PB002"


class QueueNameConflict(PgbrokerError):
    """A queue with the same name in another letter case exists, or the retry queue a stream group
    would take (named, or by default) is already another group's."""

    sqlstate = "PB004"


class StaleReceipt(PgbrokerError):
    """The receipt no longer holds: lease expired, or message redelivered, nacked or acked."""

    sqlstate = "PB003"


class QueueFull(PgbrokerError):
    """A send would take the queue past its policy's max_depth (backpressure)."""

    sqlstate = "PB006"


class MissingExtension(PgbrokerError):
    """The operation needs a Postgres extension that is not installed (pg_partman)."""

    sqlstate = "PB008"


class InvalidArgument(PgbrokerError, ValueError):
    """An argument is out of range, null where a value is needed, or malformed."""

    sqlstate = "PB007"


class InvalidMessage(InvalidArgument):
    """A payload or headers object is not valid JSON."""


class MessageTooLarge(InvalidMessage):
    """A message is larger than pgbroker.max_message_bytes."""

    sqlstate = "PB005"


class StreamNotFound(PgbrokerError):
    """The stream was never created, or was dropped."""

    sqlstate = "PB020"


class StreamGroupNotFound(PgbrokerError):
    """The stream has no consumer group of that name."""

    sqlstate = "PB021"


class StreamConsumerSuperseded(PgbrokerError):
    """The consumer has rewound (under a new generation) since the generation this read names:
    a read sent before the rewind and run after it, or another process reading under the same
    consumer name. The read changed nothing."""

    sqlstate = "PB022"


class NotInstalled(PgbrokerError):
    """The database has no pgbroker schema (run `pgbroker install`)."""


class InstallError(PgbrokerError):
    """The schema cannot be installed or upgraded in this database."""


class DatabaseError(PgbrokerError):
    """Any other database error, passed through with its SQLSTATE."""


class IdempotencyKeyReused(PgbrokerError):
    """An idempotency key came again with another request (other messages, headers or delay)
    within its window: the first request's answer would hide a different send."""

    sqlstate = "PB009"


class ConnectionLost(DatabaseError):
    """The connection to the server broke during a call (a restart, a failover, a terminated
    session). A call that only reads, or one inside a transaction the caller still had open
    (which the server rolled back), can simply be made again."""


class OutcomeUnknown(ConnectionLost):
    """The connection broke while a send was being committed: the messages may or may not be
    stored, and no one can tell from here. Retrying is safe only with the same de-duplication
    key (header x-pgbroker-dedup-key) or idempotency key as the first attempt."""


_CODED: tuple[type[PgbrokerError], ...] = (
    InvalidQueueName,
    QueueNotFound,
    StaleReceipt,
    QueueNameConflict,
    MessageTooLarge,
    QueueFull,
    MissingExtension,
    InvalidArgument,
    StreamNotFound,
    StreamGroupNotFound,
    StreamConsumerSuperseded,
    IdempotencyKeyReused,
)
_BY_SQLSTATE: dict[str, type[PgbrokerError]] = {
    **{cls.sqlstate: cls for cls in _CODED if cls.sqlstate},
    "22P02": InvalidMessage,  # invalid text representation, e.g. bad JSON
    "22P05": InvalidMessage,  # untranslatable character, e.g. \u0000 in a JSON string
}


# DETAIL of an error raised by a function of schema pgmq: pgbroker's code, then what it means.
_DETAIL_CODE = re.compile(r"^pgbroker (PB[0-9A-Z]{3})\b(?:: )?(.*)", re.DOTALL)


# A connection that broke: its SQLSTATE's class (connection exception), or the server ending the
# session (admin shutdown, crash shutdown, cannot connect now); an error without a SQLSTATE on a
# closed connection is one the client library raised when the socket went.
_LOST_CLASSES = ("08",)
_LOST_STATES = ("57P01", "57P02", "57P03")

_OUTCOME_HINT = (
    "The send may have been stored or not. Retry it with the same x-pgbroker-dedup-key header "
    "(or HTTP Idempotency-Key) as the first attempt: a stored one is then answered, not sent again."
)


def connection_lost(exc: psycopg.Error) -> bool:
    """Whether ``exc`` says the connection broke (as opposed to the server refusing the call)."""
    sqlstate = exc.diag.sqlstate or ""
    if sqlstate.startswith(_LOST_CLASSES) or sqlstate in _LOST_STATES:
        return True
    return not sqlstate and isinstance(exc, psycopg.OperationalError)


def outcome_unknown(exc: psycopg.Error) -> OutcomeUnknown:
    """The error for a send whose own transaction's commit the broken connection hid."""
    message = exc.diag.message_primary or str(exc).strip() or "the connection was lost"
    error = OutcomeUnknown(f"connection lost during a send: {message}", hint=_OUTCOME_HINT)
    error.sqlstate = exc.diag.sqlstate
    return error


def from_postgres(exc: psycopg.Error) -> PgbrokerError:
    """The pgbroker exception for a psycopg error."""
    if connection_lost(exc):
        lost = ConnectionLost(exc.diag.message_primary or str(exc).strip() or "the connection was lost")
        lost.sqlstate = exc.diag.sqlstate
        return lost
    diag = exc.diag
    sqlstate = diag.sqlstate or ""
    message = diag.message_primary or str(exc).strip()
    hint = diag.message_hint
    marked = _DETAIL_CODE.match(diag.message_detail or "")
    code = marked.group(1) if marked else sqlstate
    cls = _BY_SQLSTATE.get(code)
    missing_schema = isinstance(exc, (pg_errors.UndefinedFunction, pg_errors.InvalidSchemaName))
    if cls is None and missing_schema and ("pgmq" in message or "pgbroker" in message):
        cls, hint = NotInstalled, "Install the schema first: pgbroker install (or Broker.install())."
    if sqlstate == "22P05":
        hint = hint or "PostgreSQL's jsonb cannot store the NUL character (\\u0000); remove it."
    if marked and marked.group(2) and marked.group(2).lower() not in message.lower():
        # pgmq's message ("relation \"pgmq.q_x\" does not exist") and what pgbroker sees in it.
        message = f"{message} ({marked.group(2)})"
    error = (cls or DatabaseError)(message, hint=hint)
    error.sqlstate = sqlstate or error.sqlstate
    if marked:
        error.code = code
    return error
