"""JSON error responses with stable codes, and the mapping from pgbroker's exceptions to them.

Clients branch on ``error.code``, never on the message text, so a code once published never
changes meaning; the HTTP status only groups them.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Annotated, Any

import psycopg
from psycopg_pool import PoolTimeout
from pydantic import BaseModel, WithJsonSchema
from pydantic.json_schema import SkipJsonSchema
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from pgbroker._db.liveness import NoAnswer, StopCut
from pgbroker.codecs import CodecNotInstalled, UnknownCodec
from pgbroker.errors import (
    IdempotencyKeyReused,
    InvalidArgument,
    InvalidMessage,
    InvalidQueueName,
    MessageTooLarge,
    MissingExtension,
    NotInstalled,
    OutcomeUnknown,
    PgbrokerError,
    QueueFull,
    QueueNameConflict,
    QueueNotFound,
    StaleReceipt,
    StreamGroupNotFound,
    StreamNotFound,
)
from pgbroker.http.validation import SchemaWriter


class ApiError(Exception):
    """A failure answered with one JSON error: status, stable code, message and optional hint."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        hint: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.hint = hint
        self.headers = headers


# Most specific first: InvalidMessage and MessageTooLarge are InvalidArguments.
_BY_CLASS: tuple[tuple[type[PgbrokerError], int, str], ...] = (
    (QueueNotFound, 404, "queue_not_found"),
    (StreamNotFound, 404, "stream_not_found"),
    (StreamGroupNotFound, 404, "stream_group_not_found"),
    (InvalidQueueName, 400, "invalid_queue_name"),
    (QueueNameConflict, 409, "queue_name_conflict"),
    (StaleReceipt, 409, "stale_receipt"),
    (UnknownCodec, 400, "unknown_codec"),
    (CodecNotInstalled, 501, "codec_not_installed"),
    (MessageTooLarge, 413, "message_too_large"),
    (InvalidMessage, 400, "invalid_message"),
    (InvalidArgument, 400, "invalid_argument"),
    # Backpressure, not a client mistake: retry later, like an overloaded server.
    (QueueFull, 503, "queue_full"),
    (MissingExtension, 409, "missing_extension"),
    (NotInstalled, 503, "not_installed"),
    (IdempotencyKeyReused, 422, "idempotency_key_reused"),
)

#: Every code the API can answer with, and its status (the OpenAPI spec lists them).
ERROR_CODES: dict[str, int] = {
    **{code: status for _, status, code in _BY_CLASS},
    "invalid_json": 400,
    "stream_conflict": 409,
    "invalid_body": 422,
    "invalid_query": 422,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "schedule_not_found": 404,
    "dead_letter_not_found": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
    "request_too_large": 413,
    "rate_limited": 429,
    "outcome_unknown": 503,
    "database_error": 503,
    "database_unavailable": 503,
    "server_busy": 503,
    "internal_error": 500,
}

# A database failure the client cannot act on is told by its SQLSTATE's class only: the server's
# message may name files of the data directory, tables, roles or settings. It goes to the log,
# under the request id the client is given.
_DATABASE_CLASSES: dict[str, tuple[str, str]] = {
    "08": ("database_unavailable", "the connection to the database failed"),
    "40": ("database_unavailable", "the database rolled the request back in a conflict; retry it"),
    "53": ("database_unavailable", "the database is out of resources"),
    # A lock or object held by another session (lock_timeout during maintenance): it passes.
    "55": ("database_unavailable", "the database is busy with what the request needs; retry it"),
    "57": ("database_unavailable", "the database is shutting down or cancelled the request"),
}
_DATABASE_FAILED = ("database_error", "the database failed to run the request")


_OUTCOME_UNKNOWN_HINT = (
    "Send the same request again with the same Idempotency-Key header (or message dedup_key): "
    "if the first one was stored, its msg_ids are answered and nothing is sent twice."
)


class Unanswered(ApiError):
    """A request whose database calls the server gave up on, unanswered within their bound (a hung
    server, a stuck pooler: pgbroker._db.liveness.NoAnswer) or within STOP_PATIENCE of the server's
    stop (StopCut). A send's outcome is unknown: the server may yet run it."""

    def __init__(self, given_up: NoAnswer, *, sends: bool) -> None:
        seconds = given_up.seconds
        message = f"the database did not answer within {seconds:g} s"
        if isinstance(given_up, StopCut):
            message = f"the server is stopping, and {message} of the stop"
        if sends:
            message += ": the send may or may not be stored"
        super().__init__(
            503,
            "outcome_unknown" if sends else "database_unavailable",
            message,
            hint=_OUTCOME_UNKNOWN_HINT if sends else None,
            headers={"Retry-After": "1"},
        )
        self.seconds = seconds


def api_error_of(exc: BaseException) -> ApiError:
    """The ApiError to answer for an exception raised while handling a request."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, OutcomeUnknown):
        # A fixed text: the driver's words for the broken connection may name the server's host.
        return ApiError(
            503,
            "outcome_unknown",
            "the connection to the database broke while the send committed: it may or may not be stored",
            hint=_OUTCOME_UNKNOWN_HINT,
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, PgbrokerError):
        for cls, status, code in _BY_CLASS:
            if isinstance(exc, cls):
                headers = {"Retry-After": "1"} if cls is QueueFull else None
                return ApiError(status, code, exc.message, hint=_hint(exc), headers=headers)
        return database_failure(exc.sqlstate)
    if isinstance(exc, PoolTimeout | psycopg.OperationalError):
        return ApiError(
            503,
            "database_unavailable",
            "the database is unreachable or overloaded",
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, psycopg.Error):
        return database_failure(exc.sqlstate)
    if isinstance(exc, ClientDisconnect):
        # Nobody reads the answer; the status only names the case in the access log.
        return ApiError(400, "client_disconnected", "the client closed the connection mid-request")
    if isinstance(exc, HTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return ApiError(exc.status_code, code, str(exc.detail), headers=dict(exc.headers or {}) or None)
    return ApiError(500, "internal_error", "unexpected server error", hint="See the server's log.")


def database_failure(sqlstate: str | None) -> ApiError:
    """The stable answer to a database error, by the class of its SQLSTATE."""
    code, message = _DATABASE_CLASSES.get((sqlstate or "")[:2], _DATABASE_FAILED)
    headers = {"Retry-After": "1"} if code == "database_unavailable" else None
    return ApiError(503, code, f"{message} (SQLSTATE {sqlstate or 'unknown'})", headers=headers)


def _hint(exc: PgbrokerError) -> str | None:
    """The error's hint, told from the server's side where the fix is on the server."""
    if isinstance(exc, UnknownCodec):
        # The client cannot register a schema in the server: say where the server learns it.
        return (
            "The server encodes: it must know the codec. Start it with "
            "`pgbroker serve --codec-module MODULE`, MODULE registering the Avro schema "
            "(pgbroker.codecs.register(AvroCodec(schema))) or importing the Protobuf module protoc "
            "generated; or send with codec json, msgpack or a known type."
        )
    if isinstance(exc, CodecNotInstalled):
        return "Install the codecs extra where the server runs: pip install 'pgbroker[codecs]'."
    return exc.hint


class ErrorDetail(BaseModel):
    code: Annotated[str, WithJsonSchema({"type": "string", "enum": sorted(ERROR_CODES)})]
    message: str
    hint: str | SkipJsonSchema[None] = None  # left out of the answer when there is none


class Error(BaseModel):
    """The one shape of every error answer."""

    # Written out in place: the shape reads in one piece, as a client meets it.
    error: Annotated[
        ErrorDetail,
        WithJsonSchema(ErrorDetail.model_json_schema(mode="serialization", schema_generator=SchemaWriter)),
    ]


def error_response(error: ApiError) -> Response:
    body = Error(error=ErrorDetail(code=error.code, message=error.message, hint=error.hint or None))
    return Response(
        body.model_dump_json(exclude_none=True),
        status_code=error.status,
        headers=error.headers,
        media_type="application/json",
    )


log = logging.getLogger("pgbroker.http")


def _told_over_http(error: ApiError, path: dict[str, Any]) -> None:
    """A missing queue, stream or group of the request's path: said, with how to create it, in the
    API's terms. The engine's words are a SQL client's (pgmq's 'relation "pgmq.q_<name>" does not
    exist', a hint of SQL and of the command line)."""
    queue, stream, group = path.get("queue"), path.get("stream"), path.get("group")
    if error.code == "queue_not_found" and queue and f'queue "{queue}" does not exist' in error.message:
        error.message = f'queue "{queue}" does not exist'
        error.hint = (
            f'Create it first: POST /v1/queues {{"name": "{queue}"}} (an admin key), or: pgbroker create '
            f"{queue}"
        )
    elif error.code == "stream_not_found" and stream and f'stream "{stream}" does not exist' in error.message:
        error.hint = (
            f'Create it first: POST /v1/streams {{"name": "{stream}"}} (an admin key), or: pgbroker stream '
            f"create {stream}"
        )
    elif error.code == "stream_group_not_found" and stream and group and f'group "{group}"' in error.message:
        error.hint = (
            f'Create it first: POST /v1/streams/{stream}/groups {{"group": "{group}"}} (an admin key), '
            f"or: pgbroker stream create-group {stream} {group}"
        )


async def handle_exception(request: Request, exc: Exception) -> Response:
    error = api_error_of(exc)
    _told_over_http(error, request.path_params)
    if error.status >= 500 and error.code not in ("queue_full", "server_busy"):
        # The detail stays here; the client gets the id that finds it.
        request_id = secrets.token_hex(8)
        if isinstance(error, Unanswered):  # what a hung database does: said, without a traceback
            log.warning(
                "serve.request_unanswered method=%s path=%s code=%s within=%g request=%s",
                request.method,
                json.dumps(request.url.path),
                error.code,
                error.seconds,
                request_id,
            )
        else:
            log.error(
                "%s %s failed (request %s): %s",
                request.method,
                request.url.path,
                request_id,
                error.code,
                exc_info=exc,
            )
        told = f"The server's log tells more under request id {request_id}."
        # What to do next stays in the answer where there is something to do.
        error.hint = f"{_OUTCOME_UNKNOWN_HINT} {told}" if error.code == "outcome_unknown" else told
        error.headers = {**(error.headers or {}), "X-Request-Id": request_id}
    return error_response(error)
