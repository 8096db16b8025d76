"""The ASGI application of ``pgbroker serve``: the REST API over the asyncio client, API-key
authentication and rate limiting, /metrics, the OpenAPI spec and the dashboard.

Every route names the scope it needs and, for a queue's routes, the queue: ``_authorize`` checks
both before the handler touches the database. Errors of every kind leave as one JSON shape
(pgbroker.http.errors).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from pgbroker.aio import AsyncBroker
from pgbroker.errors import PgbrokerError
from pgbroker.http import metrics as prom
from pgbroker.http.auth import ApiKey, KeyStore, RateLimiter
from pgbroker.http.dashboard import asset
from pgbroker.http.errors import ApiError, handle_exception
from pgbroker.http.openapi import QUEUE_NAME_MAX, QUEUE_NAME_PATTERN, openapi_spec
from pgbroker.models import Message
from pgbroker.queries import receipt_of


@dataclass(frozen=True)
class Settings:
    """Limits and knobs of the server; the defaults suit a small deployment."""

    max_body_bytes: int = 1024 * 1024
    max_batch: int = 1000  # messages per send, read or ack
    max_wait_seconds: float = 20.0  # long-poll cap: a proxy's idle timeout is often 30 s or more
    rate_per_second: float = 100.0  # per key, unless the key sets its own
    rate_burst: float = 200.0
    key_cache_seconds: float = 5.0  # how long a revoked key may still be honoured
    metrics_public: bool = False  # /metrics without a key (for a scraper on a private network)
    stats_exact_below: int = 10_000  # counts past this are estimated (pgbroker.queue_stats)


Endpoint = Callable[[Request, "_State"], Awaitable[Response]]


@dataclass
class _State:
    broker: AsyncBroker
    keys: KeyStore
    limiter: RateLimiter
    settings: Settings


def create_app(
    dsn: str | None = None,
    *,
    broker: AsyncBroker | None = None,
    settings: Settings | None = None,
    max_connections: int = 10,
) -> Starlette:
    """The application, on an opened ``broker`` (the caller closes it) or on a pool it opens
    on ``dsn`` for its lifetime (uvicorn runs the lifespan)."""
    if (dsn is None) == (broker is None):
        raise ValueError("pass exactly one of dsn and broker")
    cfg = settings or Settings()
    pool = None if dsn is None else _server_pool(dsn, max_connections)
    the_broker = broker or AsyncBroker(pool=pool)
    state = _State(
        the_broker,
        KeyStore(the_broker, cfg.key_cache_seconds),
        RateLimiter(cfg.rate_per_second, cfg.rate_burst),
        cfg,
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if pool is not None:
            await pool.open(wait=True)
        try:
            yield
        finally:
            if pool is not None:  # ours: the broker (its listener) and the pool under it
                await the_broker.close()
                await pool.close()

    endpoints: dict[str, dict[str, Endpoint]] = {
        "/healthz": {"GET": _healthz},
        "/openapi.json": {"GET": _openapi},
        "/metrics": {"GET": _metrics},
        "/dashboard": {"GET": _dashboard},
        "/dashboard/app.js": {"GET": _dashboard_js},
        "/dashboard/app.css": {"GET": _dashboard_css},
        "/v1/key": {"GET": _whoami},
        "/v1/stats": {"GET": _stats},
        "/v1/queues": {"GET": _list_queues, "POST": _create_queue},
        "/v1/queues/{queue}": {"DELETE": _drop_queue},
        "/v1/queues/{queue}/metrics": {"GET": _queue_metrics},
        "/v1/queues/{queue}/messages": {"POST": _send},
        "/v1/queues/{queue}/read": {"POST": _read},
        "/v1/queues/{queue}/ack": {"POST": _ack},
        "/v1/queues/{queue}/nack": {"POST": _nack},
        "/v1/queues/{queue}/extend": {"POST": _extend},
        "/v1/queues/{queue}/archive": {"POST": _archive},
        "/v1/queues/{queue}/delete": {"POST": _delete},
        "/v1/queues/{queue}/purge": {"POST": _purge},
        "/v1/queues/{queue}/dead-letters": {"GET": _dead_letters},
        "/v1/queues/{queue}/dead-letters/replay": {"POST": _replay_dead_letters},
    }

    def route(path: str, by_method: dict[str, Endpoint]) -> Route:
        # One route per path, whatever its methods: a 405 then lists them all in Allow.
        async def dispatch(request: Request) -> Response:
            method = "GET" if request.method == "HEAD" else request.method
            return await by_method[method](request, state)

        return Route(path, dispatch, methods=list(by_method))

    routes = [route(path, by_method) for path, by_method in endpoints.items()]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        # Expected failures are answered by the exception middleware; Exception by the server-error
        # middleware, which answers 500 and re-raises for the server's log.
        exception_handlers={
            cls: handle_exception
            for cls in (ApiError, PgbrokerError, psycopg.Error, PoolTimeout, HTTPException, Exception)
        },
    )


def _server_pool(dsn: str, size: int) -> AsyncConnectionPool[Any]:
    """A fixed-size pool that hands out connections unchecked.

    AsyncBroker's own pool checks each connection with a round trip before handing it out: for
    a server answering one query per request that doubled the database round trips of a send.
    A connection that broke meanwhile fails its request with 503 database_unavailable, and the
    pool discards it when it comes back.
    """
    return AsyncConnectionPool(
        dsn,
        min_size=size,
        max_size=size,
        kwargs={"autocommit": True},
        open=False,
        name="pgbroker-http",
    )


# -- authentication -----------------------------------------------------------------------------


def _token_of(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return request.headers.get("x-api-key") or None


async def _authorize(request: Request, state: _State, scope: str | None, queue: str | None = None) -> ApiKey:
    """The request's key, checked for ``scope`` (None: any valid key) on ``queue``, and charged
    one request against its rate limit."""
    token = _token_of(request)
    if token is None:
        raise ApiError(
            401,
            "unauthorized",
            "no API key given",
            hint="Send 'Authorization: Bearer <token>' (create one with `pgbroker keys create`).",
            headers={"WWW-Authenticate": "Bearer"},
        )
    key = await state.keys.authenticate(token)
    if key is None:
        raise ApiError(
            401, "unauthorized", "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"}
        )
    # Charged before the scope check: a key probing what it may do is still rate limited.
    wait = state.limiter.take(key)
    if wait > 0:
        raise ApiError(
            429,
            "rate_limited",
            f"rate limit of key {key.name!r} exceeded",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )
    if scope is not None and not key.allows(scope, queue):
        target = f" on queue {queue!r}" if queue is not None else ""
        raise ApiError(403, "forbidden", f"key {key.name!r} may not {scope}{target}")
    return key


# -- request bodies -----------------------------------------------------------------------------


_Absent = object()
_PORTABLE_NAME = re.compile(QUEUE_NAME_PATTERN)


class _Body:
    """A JSON object body, read within the size limit, with typed getters that answer 422."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    @classmethod
    async def read(cls, request: Request, state: _State, *, optional: bool = False) -> _Body:
        limit = state.settings.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, "request_too_large", f"request body larger than {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        # Counted as it streams: a chunked body has no Content-Length to trust.
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "request_too_large", f"request body larger than {limit} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            if optional:
                return cls({})
            raise ApiError(422, "invalid_body", "a JSON object body is required")
        try:
            data = json.loads(raw, parse_constant=_reject_constant)
        except ValueError as exc:
            raise ApiError(400, "invalid_json", f"body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ApiError(422, "invalid_body", "the body must be a JSON object")
        return cls(data)

    def has(self, name: str) -> bool:
        return name in self.data

    def get_int(self, name: str, default: Any = _Absent, *, lo: int = 0, hi: int = 2**31 - 1) -> int:
        value = _integer(self.data.get(name, default))
        if value is _Absent:
            raise _invalid(f"{name} is required")
        if not isinstance(value, int) or not lo <= value <= hi:
            raise _invalid(f"{name} must be an integer from {lo} to {hi}")
        return value

    def get_number(self, name: str, default: float, *, lo: float, hi: float) -> float:
        value = self.data.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
            raise _invalid(f"{name} must be a number from {lo:g} to {hi:g}")
        return float(value)

    def get_bool(self, name: str, default: bool) -> bool:
        value = self.data.get(name, default)
        if not isinstance(value, bool):
            raise _invalid(f"{name} must be true or false")
        return value

    def get_str(self, name: str) -> str:
        value = self.data.get(name)
        if not isinstance(value, str):
            raise _invalid(f"{name} must be a string")
        return value

    def get_list(self, name: str, max_items: int) -> list[Any]:
        value = self.data.get(name)
        if not isinstance(value, list) or not 1 <= len(value) <= max_items:
            raise _invalid(f"{name} must be an array of 1 to {max_items} items")
        return value

    def get_ids(self, name: str, max_items: int) -> list[int]:
        values = [_integer(v) for v in self.get_list(name, max_items)]
        if any(not isinstance(v, int) or not 1 <= v <= 2**63 - 1 for v in values):
            raise _invalid(f"{name} must hold positive integer msg_ids")
        return values

    def receipts(self, max_items: int) -> tuple[list[str], bool]:
        """The receipts given, and whether one was given alone (``receipt``)."""
        if self.has("receipt") == self.has("receipts"):
            raise _invalid("give either receipt or receipts")
        if self.has("receipt"):
            return [self.get_str("receipt")], True
        values = self.get_list("receipts", max_items)
        if not all(isinstance(v, str) for v in values):
            raise _invalid("receipts must be an array of strings")
        return values, False


def _integer(value: Any) -> Any:
    """An integral float as the int it is (JSON Schema counts 30.0 as an integer, and so do we);
    anything else as it came (bool is not an integer here, although Python says it is)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool):
        return None
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _invalid(message: str) -> ApiError:
    return ApiError(422, "invalid_body", message)


def _query_int(request: Request, name: str, default: int, *, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    # Digits checked first, and counted: int() refuses (ValueError) past 4,300 digits.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19 and lo <= int(raw) <= hi):
        raise ApiError(422, "invalid_query", f"{name} must be an integer from {lo} to {hi}")
    return int(raw)


def _queue_of(request: Request) -> str:
    name: str = request.path_params["queue"]
    return name


def _message_json(m: Message) -> dict[str, Any]:
    return {
        "msg_id": m.msg_id,
        "read_ct": m.read_ct,
        "enqueued_at": m.enqueued_at.isoformat(),
        "last_read_at": m.last_read_at.isoformat() if m.last_read_at else None,
        "vt": m.vt.isoformat(),
        "message": m.message,
        "headers": m.headers,
        "receipt": str(m.receipt) if m.receipt else None,
    }


def _jsonable(record: Any) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in asdict(record).items()}


# -- routes -------------------------------------------------------------------------------------


async def _healthz(request: Request, state: _State) -> Response:
    async with state.broker.connection() as conn:
        await conn.execute("SELECT 1")
    return JSONResponse({"status": "ok"})


async def _openapi(request: Request, state: _State) -> Response:
    return JSONResponse(openapi_spec(state.settings.max_batch, state.settings.max_wait_seconds))


async def _dashboard(request: Request, state: _State) -> Response:
    return asset("dashboard.html")


async def _dashboard_js(request: Request, state: _State) -> Response:
    return asset("dashboard.js")


async def _dashboard_css(request: Request, state: _State) -> Response:
    return asset("dashboard.css")


async def _whoami(request: Request, state: _State) -> Response:
    key = await _authorize(request, state, None)
    return JSONResponse({"name": key.name, "scopes": sorted(key.scopes), "queues": list(key.queues)})


async def _metrics(request: Request, state: _State) -> Response:
    key = None if state.settings.metrics_public else await _authorize(request, state, None)
    stats = await prom.queue_stats(state.broker, state.settings.stats_exact_below)
    if key is not None:
        stats = [s for s in stats if key.sees(s.queue_name)]
    return Response(prom.render(stats), media_type="text/plain; version=0.0.4; charset=utf-8")


async def _stats(request: Request, state: _State) -> Response:
    key = await _authorize(request, state, None)
    stats = await prom.queue_stats(state.broker, state.settings.stats_exact_below)
    return JSONResponse({"queues": [_jsonable(s) for s in stats if key.sees(s.queue_name)]})


async def _list_queues(request: Request, state: _State) -> Response:
    key = await _authorize(request, state, None)
    queues = await state.broker.list_queues()
    return JSONResponse({"queues": [_jsonable(q) for q in queues if key.sees(q.queue_name)]})


async def _create_queue(request: Request, state: _State) -> Response:
    token_key = await _authorize(request, state, None)
    body = await _Body.read(request, state)
    name = body.get_str("name")
    # Stricter than the SQL API: what the HTTP API creates is portable (the spec's pattern).
    if not (len(name) <= QUEUE_NAME_MAX and _PORTABLE_NAME.fullmatch(name)):
        raise ApiError(
            400,
            "invalid_queue_name",
            f"queue name {name!r} is not allowed over HTTP",
            hint="Use 1 to 47 letters, digits, _ and - (never two - in a row).",
        )
    if not token_key.allows("admin", name):
        raise ApiError(403, "forbidden", f"key {token_key.name!r} may not admin on queue {name!r}")
    await state.broker.create_queue(
        name, unlogged=body.get_bool("unlogged", False), notify=body.get_bool("notify", True)
    )
    return JSONResponse({"queue_name": name}, status_code=201)


async def _drop_queue(request: Request, state: _State) -> Response:
    queue = _queue_of(request)
    await _authorize(request, state, "admin", queue)
    if not await state.broker.drop_queue(queue):
        raise ApiError(404, "queue_not_found", f'queue "{queue}" does not exist')
    return JSONResponse({"dropped": queue})


async def _queue_metrics(request: Request, state: _State) -> Response:
    queue = _queue_of(request)
    await _authorize(request, state, "read", queue)
    return JSONResponse(_jsonable(await state.broker.metrics(queue)))


async def _send(request: Request, state: _State) -> Response:
    queue = _queue_of(request)
    await _authorize(request, state, "send", queue)
    body = await _Body.read(request, state)
    delay = body.get_int("delay", 0)
    if body.has("message") == body.has("messages"):
        raise _invalid("give either message or messages")
    if body.has("message"):
        headers = body.data.get("headers")
        if headers is not None and not isinstance(headers, dict):
            raise _invalid("headers must be an object")
        messages, all_headers = [body.data["message"]], [headers]
    else:
        messages = body.get_list("messages", state.settings.max_batch)
        given = body.data.get("headers")
        if given is None:
            all_headers = [None] * len(messages)
        elif (
            not isinstance(given, list)
            or len(given) != len(messages)
            or not all(h is None or isinstance(h, dict) for h in given)
        ):
            raise _invalid("headers must be an array of objects (or nulls), one per message")
        else:
            all_headers = given
    ids = await state.broker.queue(queue).send_many(
        messages, headers=None if all(h is None for h in all_headers) else all_headers, delay=delay
    )
    return JSONResponse({"msg_ids": ids}, status_code=201)


async def _read(request: Request, state: _State) -> Response:
    queue = _queue_of(request)
    await _authorize(request, state, "read", queue)
    body = await _Body.read(request, state, optional=True)
    vt = body.get_int("vt", 30)
    qty = body.get_int("qty", 1, lo=1, hi=state.settings.max_batch)
    wait = body.get_number("wait", 0.0, lo=0.0, hi=state.settings.max_wait_seconds)
    found = await state.broker.queue(queue).read_many(qty, vt=vt, wait=wait)
    return JSONResponse({"messages": [_message_json(m) for m in found]})


def _stale(receipts: list[str], done: set[int]) -> list[str]:
    return [r for r in receipts if receipt_of(r).msg_id not in done]


async def _ack(request: Request, state: _State) -> Response:
    queue = _queue_of(request)
    await _authorize(request, state, "read", queue)
    body = await _Body.read(request, state)
    receipts, single = body.receipts(state.settings.max_batch)
    archive = body.get_bool("archive", True)
    q = state.broker.queue(queue)
    if single:
        await q.ack(receipts[0], archive=archive)
        acked = [receipt_of(receipts[0]).msg_id]
    else:
        acked = await q.ack_many(receipts, archive=archive)
    return JSONResponse({"acked": acked, "stale": _stale(receipts, set(acked))})


async def _nack(request: Request, state: _State) -> Response:
    queue = _queue_of(request)
    await _authorize(request, state, "read", queue)
    body = await _Body.read(request, state)
    receipts, single = body.receipts(state.settings.max_batch)
    delay = body.get_int("delay", 0)
    q = state.broker.queue(queue)
    if single:
        await q.nack(receipts[0], delay=delay)
        nacked = [receipt_of(receipts[0]).msg_id]
    else:
        nacked = await q.nack_many(receipts, delay=delay)
    return JSONResponse({"nacked": nacked, "stale": _stale(receipts, set(nacked))})


async def _extend(request: Request, state: _State) -> Response:
    queue = _queue_of(request)
    await _authorize(request, state, "read", queue)
    body = await _Body.read(request, state)
    receipts, single = body.receipts(state.settings.max_batch)
    vt = body.get_int("vt")
    q = state.broker.queue(queue)
    if single:
        renewed = {receipt_of(receipts[0]).msg_id: await q.extend(receipts[0], vt=vt)}
    else:
        renewed = await q.extend_many(receipts, vt=vt)
    return JSONResponse(
        {
            "receipts": {str(msg_id): str(r) for msg_id, r in renewed.items()},
            "stale": _stale(receipts, set(renewed)),
        }
    )


async def _archive(request: Request, state: _State) -> Response:
    queue = _queue_of(request)
    await _authorize(request, state, "read", queue)
    body = await _Body.read(request, state)
    done = await state.broker.queue(queue).archive_many(body.get_ids("msg_ids", state.settings.max_batch))
    return JSONResponse({"archived": done})


async def _delete(request: Request, state: _State) -> Response:
    queue = _queue_of(request)
    await _authorize(request, state, "read", queue)
    body = await _Body.read(request, state)
    done = await state.broker.queue(queue).delete_many(body.get_ids("msg_ids", state.settings.max_batch))
    return JSONResponse({"deleted": done})


async def _purge(request: Request, state: _State) -> Response:
    queue = _queue_of(request)
    await _authorize(request, state, "admin", queue)
    return JSONResponse({"purged": await state.broker.queue(queue).purge()})


async def _dead_letters(request: Request, state: _State) -> Response:
    queue = _queue_of(request)
    await _authorize(request, state, "read", queue)
    limit = _query_int(request, "limit", 100, lo=1, hi=state.settings.max_batch)
    after = _query_int(request, "after", 0, lo=0, hi=2**63 - 1)
    found = await state.broker.queue(queue).dead_letters(limit, after=after)
    return JSONResponse({"messages": [_message_json(m) for m in found]})


async def _replay_dead_letters(request: Request, state: _State) -> Response:
    queue = _queue_of(request)
    await _authorize(request, state, "admin", queue)
    body = await _Body.read(request, state, optional=True)
    msg_ids = body.get_ids("msg_ids", state.settings.max_batch) if body.has("msg_ids") else None
    replayed = await state.broker.queue(queue).replay_dead_letters(msg_ids)
    return JSONResponse(
        {"replayed": [{"dead_letter_id": old, "msg_id": new} for old, new in sorted(replayed.items())]}
    )


__all__ = ["Settings", "create_app"]
