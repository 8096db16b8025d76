"""The ASGI application of ``pgbroker serve``, assembled: the settings, the pool and its lifespan,
the declared operations (pgbroker.http.routes) as one Starlette route per path, and the error
handlers that answer every failure in the API's one JSON shape (pgbroker.http.errors).

What an operation does, what it checks and what it answers is declared with its handler; the
OpenAPI spec is written from those declarations once, when the application is made.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from pgbroker._background import said_if_failed
from pgbroker._db.dsn import PoolerMode, pooler_mode
from pgbroker._db.liveness import stops_with
from pgbroker._db.pools import DEFAULT_POOL_TIMEOUT, RECONNECT_CEILING, PoolTimeouts
from pgbroker._db.session import configure_async
from pgbroker.errors import PgbrokerError
from pgbroker.http import monitoring
from pgbroker.http.auth import FailureLimiter, KeyStore, RateLimiter
from pgbroker.http.concurrency import ConcurrencyLimit
from pgbroker.http.errors import ApiError, handle_exception
from pgbroker.http.openapi import openapi_spec
from pgbroker.http.operations import Operation, State, run
from pgbroker.http.replica import POOL_NAME as REPLICA_POOL
from pgbroker.http.replica import OpenedReplica, WatchedReplica
from pgbroker.http.routes import all_operations
from pgbroker.http.settings import Settings
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.queues._refusal_watch import RefusalWatch


def create_app(
    dsn: str | None = None,
    *,
    broker: AsyncBroker | None = None,
    settings: Settings | None = None,
    max_connections: int = 10,
    replica_dsn: str | None = None,
    replica: AsyncBroker | None = None,
    pooler: PoolerMode | None = None,
    pool_timeout: float = DEFAULT_POOL_TIMEOUT,
) -> Starlette:
    """The application, on an opened ``broker`` (the caller closes it) or on a pool it opens
    on ``dsn`` for its lifetime (uvicorn runs the lifespan), behind ``pooler`` (as Broker's); a
    request waits up to ``pool_timeout`` seconds for a free connection, then answers 503.

    With a streaming standby of that database, as ``replica_dsn`` (a pool of ``max_connections``
    opened for the application's lifetime) or as an opened ``replica`` broker (the caller closes
    it), the reporting operations (the statistics, /metrics, exact metrics, peek, dead-letter and
    schedule listings, the dashboard's feed) read from it and report its replay lag; every write
    goes to the primary. A ``replica_dsn`` that does not answer is said once in the log, and the
    reports read from the primary until it answers again (pgbroker.http.replica)."""
    if (dsn is None) == (broker is None):
        raise ValueError("pass exactly one of dsn and broker")
    if replica_dsn is not None and replica is not None:
        raise ValueError("pass at most one of replica_dsn and replica")
    cfg = settings or Settings()
    mode = pooler_mode(pooler)
    timeouts = PoolTimeouts(pool=pool_timeout)
    pool = None if dsn is None else _server_pool(dsn, max_connections, mode, timeouts)
    the_broker = broker or AsyncBroker(pool=pool, pooler=mode)
    the_replica: OpenedReplica | WatchedReplica | None = None if replica is None else OpenedReplica(replica)
    watched = None
    if replica_dsn is not None:
        watched = the_replica = WatchedReplica(
            replica_dsn,
            lambda: _server_pool(replica_dsn, max_connections, mode, timeouts, REPLICA_POOL),
            timeouts,
            mode,
        )
    operations = all_operations()
    state = State(
        the_broker,
        KeyStore(the_broker, cfg.key_cache_seconds),
        RateLimiter(cfg.rate_per_second, cfg.rate_burst),
        FailureLimiter(cfg.auth_failures_per_second, cfg.auth_failure_burst),
        cfg,
        operations,
        openapi_spec(operations, cfg),
        the_replica,
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if pool is not None:
            # Its connections are made in the background, as the workers' are: waiting for all of
            # them failed the start (uvicorn's exit 3, after 30 s) where a role's CONNECTION LIMIT
            # is below the pool's size; the pool's warnings say why some are missing.
            await pool.open()
        if watched is not None:
            # A replica that is down is said once; the reports read from the primary meanwhile.
            await watched.start()
        state.stopping = stopping = asyncio.Event()  # this run's (begin_stop)
        sampling = _start_sampling(the_broker, cfg, stopping)
        try:
            async with _REFUSALS.watching(the_broker):
                yield
        finally:
            stopping.set()  # a call in flight on a hung server: STOP_PATIENCE at most
            if sampling is not None:
                await asyncio.gather(sampling, return_exceptions=True)
            if pool is not None:  # ours: the broker (its listener) and the pool under it
                await the_broker.close()
                await pool.close()
            if watched is not None:  # ours too
                await watched.close()

    app = Starlette(
        routes=_routes(operations, state),
        lifespan=lifespan,
        # Expected failures are answered by the exception middleware (a client gone mid-upload
        # among them, quietly); Exception by the server-error middleware, which answers 500 and
        # re-raises for the server's log.
        exception_handlers={
            cls: handle_exception
            for cls in (
                ApiError,
                PgbrokerError,
                psycopg.Error,
                PoolTimeout,
                HTTPException,
                ClientDisconnect,
                Exception,
            )
        },
        middleware=[Middleware(ConcurrencyLimit, limit=cfg.max_concurrency)],
    )
    app.state.pgbroker = state
    return app


def begin_stop(app: Starlette) -> None:
    """The server stops (SIGTERM), before it waits for the requests in flight: each long poll
    answers at once with what it has, and each database call still in flight gets STOP_PATIENCE
    (pgbroker._db.liveness), then its request answers 503 (outcome_unknown for a send). A request
    on a hung server held the stop until uvicorn's graceful timeout, then was cut and answered 500."""
    state: State = app.state.pgbroker
    state.stopping.set()


# Says why at ERROR when the server refuses the server's connections (a password changed).
_REFUSALS = RefusalWatch(logging.getLogger("pgbroker.http"), "serve.database_refused", "server")


def _routes(operations: Sequence[Operation], state: State) -> list[Route]:
    """One route per path, whatever its methods: a 405 then lists them all in Allow."""
    by_path: dict[str, dict[str, Operation]] = {}
    for operation in operations:
        by_path.setdefault(operation.path, {})[operation.method] = operation

    def route(path: str, by_method: dict[str, Operation]) -> Route:
        async def dispatch(request: Request) -> Response:
            method = "GET" if request.method == "HEAD" else request.method
            with stops_with(state.stopping):
                return await run(by_method[method], state, request)

        # A msg_id is digits: /dead-letters/replay is not a dead letter's path, and keeps its Allow.
        return Route(path.replace("{msg_id}", "{msg_id:int}"), dispatch, methods=list(by_method))

    return [route(path, by_method) for path, by_method in by_path.items()]


def _start_sampling(broker: AsyncBroker, cfg: Settings, stopping: asyncio.Event) -> asyncio.Task[None] | None:
    """The dashboard's history, sampled until ``stopping`` (pgbroker.http.monitoring)."""
    if cfg.history_retention_seconds <= 0:
        return None
    sampling = monitoring.keep_sampling(
        broker,
        timedelta(seconds=cfg.history_interval_seconds),
        timedelta(seconds=cfg.history_retention_seconds),
        cfg.stats_exact_below,
        stopping,
    )
    task = asyncio.create_task(sampling, name="pgbroker-history")
    task.add_done_callback(said_if_failed(logging.getLogger("pgbroker.http"), "serve.history_ended"))
    return task


def _server_pool(
    dsn: str, size: int, pooler: PoolerMode, timeouts: PoolTimeouts, name: str = "pgbroker-http-primary"
) -> AsyncConnectionPool[Any]:
    """A fixed-size pool that hands out connections without a round trip to check them:
    AsyncBroker passes over those the server has closed (pgbroker._db.liveness), so a restart of
    Postgres costs no request."""
    return AsyncConnectionPool(
        dsn,
        min_size=size,
        max_size=size,
        kwargs=timeouts.connection_kwargs(dsn, pooler),
        open=False,
        name=name,
        timeout=timeouts.pool,
        reconnect_timeout=RECONNECT_CEILING,
        configure=configure_async,
    )


__all__ = ["Settings", "begin_stop", "create_app"]
