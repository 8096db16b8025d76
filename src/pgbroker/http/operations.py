"""The API's operations as declarations, and the one pipeline every request goes through.

A route module (pgbroker.http.routes) declares each operation on a Router::

    @router.post("/v1/queues/{queue}/read", "lease up to qty visible messages", scope="read")
    async def read(call: Call, body: ReadBody) -> Messages: ...

The declaration (method, path, summary, scope, success status, documented errors) and the
handler's annotations (its ``body`` or ``query`` model, the model it answers with) are all there
is: the pipeline authenticates by the scope, validates by the models and answers through them,
and pgbroker.http.openapi writes the spec from the same declarations. The spec cannot drift from
the server, because nothing else describes the server.

Why Starlette, pydantic and this small layer rather than FastAPI, which derives a spec from
pydantic models too: the API's contract has habits FastAPI does not share, and each would be an
override of its defaults, which is the drift we are removing.

- Refusals come in a fixed order: the key (401, then 429, then 403 for the path's queue) before
  the body is read (413, 400, 422). FastAPI reads and parses the body before any dependency runs.
- The body is read within a size limit counted as it streams (chunked bodies have no
  Content-Length), NaN and Infinity are invalid JSON (400), and validation errors are the API's
  one error shape with codes by location (invalid_body, invalid_query) or by name (an invalid
  queue name or receipt answers 400), where FastAPI answers its own 422 and documents its own
  HTTPValidationError on every operation.
- Two bounds (batch size, long-poll wait) are server settings: the models check them against
  the settings given as pydantic's validation context, and the spec is written with the same
  values. FastAPI's models, and so its spec, are fixed at import.
- One route per path, so that a 405 names every method of the path in Allow.
What FastAPI would have given, the models and their JSON Schema, comes from pydantic all the
same; the rest is this module and openapi.py.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypedDict, TypeVar, Unpack

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from pgbroker._db.api_keys import ApiKey
from pgbroker._db.liveness import NoAnswer, answered_within, is_transient
from pgbroker._db.names import check_queue_name
from pgbroker.http.access import authenticate, require
from pgbroker.http.auth import FailureLimiter, KeyStore, RateLimiter
from pgbroker.http.errors import ApiError, Unanswered
from pgbroker.http.idempotency import IDEMPOTENCY_KEY
from pgbroker.http.settings import Settings
from pgbroker.http.validation import FORMS, REFUSALS, RequestContext
from pgbroker.queues._client_async import AsyncBroker

#: Who may call: ``key`` any valid key (and the scope, when one is named), ``public`` anybody,
#: ``metrics`` a key unless the server serves /metrics publicly.
Access = Literal["key", "public", "metrics"]
#: The scopes of pgbroker.http.auth.SCOPES (admin implies the others).
Scope = Literal["send", "read", "admin"]
Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])


@dataclass(frozen=True)
class Operation:
    """One method on one path, as declared: the pipeline runs it, openapi.py documents it."""

    method: str
    path: str
    summary: str
    handler: Callable[..., Awaitable[Any]]
    scope: Scope | None
    access: Access
    status: int
    body: TypeAdapter[Any] | None
    body_required: bool
    query: TypeAdapter[Any] | None
    answer: TypeAdapter[Any] | None  # None: the handler answers a Response of media_type
    media_type: str
    answer_schema: Mapping[str, Any]  # the schema of a Response answer
    errors: Mapping[int, str]  # failures beyond those every such operation has
    scope_field: str | None  # the body field naming the queue of the scope (a path without one)
    reporting: bool  # read-only: served from the replica when the server has one
    headers: Mapping[str, str]  # optional request headers it reads: name -> what it does

    @property
    def operation_id(self) -> str:
        return self.handler.__name__

    @property
    def on_queue(self) -> bool:
        return "{queue}" in self.path


class Options(TypedDict, total=False):
    """What an operation declares beyond its method, path and summary."""

    scope: Scope  # the scope the key needs (admin implies every scope); none: any valid key
    access: Access  # "key" unless said otherwise
    status: int  # of a success (200)
    body_required: bool  # False: an empty body is {} (True)
    media_type: str  # of an answer the handler makes itself (a Response)
    answer_schema: Mapping[str, Any]  # and its schema ({"type": "string"})
    errors: Mapping[int, str]  # failures beyond those every such operation has
    scope_field: str  # the body field naming the queue of the scope, for a path without one
    # Read-only (no statement of it writes): served from the replica when the server has one
    # (a replica refuses a write with SQLSTATE 25006).
    reporting: bool
    headers: Mapping[str, str]  # optional request headers it reads: name -> what it does


class Router:
    """The operations of one route module, in declaration order."""

    def __init__(self) -> None:
        self.operations: list[Operation] = []

    def get(self, path: str, summary: str, **options: Unpack[Options]) -> Callable[[Handler], Handler]:
        return self._declare("GET", path, summary, options)

    def post(self, path: str, summary: str, **options: Unpack[Options]) -> Callable[[Handler], Handler]:
        return self._declare("POST", path, summary, options)

    def delete(self, path: str, summary: str, **options: Unpack[Options]) -> Callable[[Handler], Handler]:
        return self._declare("DELETE", path, summary, options)

    def _declare(
        self, method: str, path: str, summary: str, options: Options
    ) -> Callable[[Handler], Handler]:
        def declare(handler: Handler) -> Handler:
            _, *inputs = inspect.signature(handler).parameters
            if not set(inputs) <= {"body", "query"}:
                raise TypeError(f"{handler.__name__}: a handler takes (call, [body], [query]), not {inputs}")
            hints = typing.get_type_hints(handler, include_extras=True)
            answer = hints["return"]
            body, query = hints.get("body"), hints.get("query")
            self.operations.append(
                Operation(
                    method=method,
                    path=path,
                    summary=summary,
                    handler=handler,
                    scope=options.get("scope"),
                    access=options.get("access", "key"),
                    status=options.get("status", 200),
                    body=None if body is None else TypeAdapter(body),
                    body_required=options.get("body_required", True),
                    query=None if query is None else TypeAdapter(query),
                    answer=None
                    if isinstance(answer, type) and issubclass(answer, Response)
                    else TypeAdapter(answer),
                    media_type=options.get("media_type", "application/json"),
                    answer_schema=options.get("answer_schema", {"type": "string"}),
                    errors=options.get("errors", {}),
                    scope_field=options.get("scope_field"),
                    reporting=options.get("reporting", False),
                    headers=options.get("headers", {}),
                )
            )
            return handler

        return declare


class Replica(Protocol):
    """The replica the reporting operations read from (pgbroker.http.replica): ``broker`` is None
    while it does not answer."""

    @property
    def broker(self) -> AsyncBroker | None: ...

    def suspect(self) -> None: ...


@dataclass
class State:
    """What every request of one application shares: ``broker`` on the primary, ``replica`` (if
    any) on the server the reporting operations read from."""

    broker: AsyncBroker
    keys: KeyStore
    limiter: RateLimiter
    failures: FailureLimiter
    settings: Settings
    operations: tuple[Operation, ...] = ()
    spec: dict[str, Any] = field(default_factory=dict)
    replica: Replica | None = None
    in_flight: dict[int, int] = field(default_factory=dict)  # requests in hand, by key id
    # Set once the server stops (pgbroker.http.app.begin_stop): long polls answer with what they
    # have, database calls in flight get STOP_PATIENCE (pgbroker._db.liveness.stops_with).
    stopping: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class Call:
    """A request as its handler sees it: the application's state and the caller's key."""

    request: Request
    state: State
    key: ApiKey | None
    reporting: bool = False  # the operation's: it reads from the replica, if there is one

    @property
    def broker(self) -> AsyncBroker:
        """The replica's broker for a reporting operation on a server that has one, else the
        primary's."""
        replica = None if self.state.replica is None else self.state.replica.broker
        return replica if self.reporting and replica is not None else self.state.broker

    @property
    def from_replica(self) -> bool:
        """Whether this call reads from a replica (and so may see the past)."""
        return self.broker is not self.state.broker

    @property
    def settings(self) -> Settings:
        return self.state.settings

    @property
    def queue(self) -> str:
        """The queue named by the path."""
        name: str = self.request.path_params["queue"]
        return name

    @property
    def caller(self) -> ApiKey:
        """The caller's key, for an operation that needs one."""
        if self.key is None:
            raise RuntimeError("this operation is declared without a key")
        return self.key


async def run(operation: Operation, state: State, request: Request) -> Response:
    """Authenticate, validate, call the handler and answer, in the API's order of refusals.

    Each step's database calls are given up when unanswered within the settings'
    answer_within_seconds (past the long-poll wait the request asks for): a hung server or a stuck
    pooler would otherwise hold the request and its pooled connection for as long as the hang
    lasts, and a few such requests starve the whole API. Given up, the request is answered 503
    (Unanswered) and its connection closed, never used again (pgbroker._db.liveness)."""
    within = state.settings.answer_within_seconds
    key = None
    if operation.access == "key" or (operation.access == "metrics" and not state.settings.metrics_public):
        checked = authenticate(request, state.keys, state.limiter, state.failures)
        try:
            key = await answered_within(within, checked)
        except NoAnswer as exc:  # nothing was sent yet
            raise Unanswered(exc, sends=False) from exc
    with _in_hand(state, key):
        try:
            return await _run(operation, state, request, key, within)
        except NoAnswer as exc:
            raise Unanswered(exc, sends=IDEMPOTENCY_KEY in operation.headers) from exc


@contextmanager
def _in_hand(state: State, key: ApiKey | None) -> Iterator[None]:
    """The request counted among its key's in hand; 429 at once past the key's share of the
    server's slots (--max-concurrency counts every key's together: one key's long polls took
    them all, and every other key was answered 503), or, for a key with requests in hand, when
    only the slots kept for keys with none are left (two keys at their share took them all)."""
    if key is None:
        yield
        return
    held = state.in_flight.get(key.id, 0)
    settings = state.settings
    limit = settings.key_concurrency
    if held >= limit:
        raise ApiError(
            429,
            "rate_limited",
            f"key {key.name!r} has {limit} requests in hand already",
            hint="Fewer requests at once (long polls count), or start the server with a higher"
            " --max-concurrency-per-key.",
            headers={"Retry-After": "1"},
        )
    reserved = settings.reserved_slots
    if held and reserved and sum(state.in_flight.values()) >= settings.max_concurrency - reserved:
        raise ApiError(
            429,
            "rate_limited",
            f"key {key.name!r} has {held} requests in hand, and the server's last {reserved} slots are"
            " kept for keys with none",
            hint="Fewer requests at once (long polls count), or start the server with a higher"
            " --max-concurrency.",
            headers={"Retry-After": "1"},
        )
    state.in_flight[key.id] = held + 1
    try:
        yield
    finally:
        left = state.in_flight[key.id] - 1
        if left:
            state.in_flight[key.id] = left
        else:
            del state.in_flight[key.id]


async def _run(
    operation: Operation, state: State, request: Request, key: ApiKey | None, within: float
) -> Response:
    """The request of an authenticated key (or of none): scope, body, query, handler (given up
    past ``within`` and the read's own wait), answer."""
    if key is not None and operation.scope is not None and operation.scope_field is None:
        require(key, operation.scope, path_queue(request))
    arguments: dict[str, Any] = {}
    if operation.body is not None:
        data, nul_escape = await read_json(request, state.settings, operation.body_required)
        context = RequestContext(state.settings, nul_escape)
        body = validated(operation.body, data, context, "invalid_body")
        if key is not None and operation.scope is not None and operation.scope_field is not None:
            require(key, operation.scope, getattr(body, operation.scope_field))
        arguments["body"] = body
        within += getattr(body, "wait", 0.0)  # a long-polling read's own wait (ReadBody, StreamRead)
    if operation.query is not None:
        query = dict(request.query_params)
        arguments["query"] = validated(
            operation.query, query, RequestContext(state.settings), "invalid_query"
        )
    call = Call(request, state, key, operation.reporting)
    try:
        result = await answered_within(within, operation.handler(call, **arguments))
    except Exception as exc:
        if state.replica is not None and call.from_replica and is_transient(exc):
            state.replica.suspect()  # gone, perhaps: the reports read from the primary once it is said
        raise
    if operation.answer is None:
        assert isinstance(result, Response)
        return result
    return Response(
        operation.answer.dump_json(result), status_code=operation.status, media_type="application/json"
    )


def path_queue(request: Request) -> str | None:
    """The queue the path names, judged by the engine's rule before a key is checked against it
    (the name the key sees is the name the database gets)."""
    name: str | None = request.path_params.get("queue")
    return None if name is None else check_queue_name(name)


async def read_json(request: Request, settings: Settings, required: bool) -> tuple[Any, bool]:
    """The body's JSON object (``{}`` for an empty optional body), read within the size and time
    limits of the settings, and whether it held an escaped NUL anywhere."""
    limit = settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "request_too_large", f"request body larger than {limit} bytes")
    try:
        # A body dribbled in holds its request (and its share of --max-concurrency): it has a deadline.
        async with asyncio.timeout(settings.body_timeout_seconds):
            raw = await _read_body(request, limit)
    except TimeoutError:
        raise ApiError(
            408,
            "request_timeout",
            f"the request body did not arrive within {settings.body_timeout_seconds:g} s",
            headers={"Connection": "close"},
        ) from None
    if not raw.strip():
        if not required:
            return {}, False
        raise ApiError(422, "invalid_body", "a JSON object body is required")
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except ValueError as exc:
        raise ApiError(400, "invalid_json", f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "invalid_json", "body is nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(422, "invalid_body", "the body must be a JSON object")
    # json.loads refuses raw control characters in strings: a NUL can only come escaped.
    return data, b"\\u0000" in raw


async def _read_body(request: Request, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    # Counted as it streams: a chunked body has no Content-Length to trust.
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "request_too_large", f"request body larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def validated(adapter: TypeAdapter[Any], data: Any, context: RequestContext, code: str) -> Any:
    """``data`` validated by the model, or the refusal its first failures make."""
    try:
        return adapter.validate_python(data, context=context)
    except ValidationError as exc:
        raise refusal(exc, code) from None


def refusal(exc: ValidationError, code: str) -> ApiError:
    """A named refusal (REFUSALS) if there is one, else ``code`` (422) with the failures."""
    failures = exc.errors(include_url=False)
    for failure in failures:
        if failure["type"] in REFUSALS:
            status, named, hint = REFUSALS[failure["type"]]
            return ApiError(status, named, failure["msg"], hint=hint)
    described = []
    for failure in failures[:3]:
        where = ".".join(str(part) for part in failure["loc"] if part not in FORMS)
        # A model's own rule (ValueError) says it all, without pydantic's "Value error, ".
        message = str(failure["ctx"]["error"]) if failure["type"] == "value_error" else failure["msg"]
        described.append(f"{where}: {message}" if where else message)
    return ApiError(422, code, "; ".join(described))
