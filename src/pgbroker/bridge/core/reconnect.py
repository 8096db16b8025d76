"""Keeping a bridge connected: which failures it rides out, and the reconnect loop both
directions share, whatever the broker.

A lost broker connection, a database restart, a dropped database connection, a lock or statement
timeout (a maintenance transaction holding the queue's table) is transient: the bridge
reconnects after a back-off (jittered, doubling up to 30 s, starting over after a connection that
served 30 s) and carries on; messages it held come back on their own (pgbroker leases run out,
the broker delivers unacked messages again).
A missing queue or stream, a missing schema or an invalid setting is not: retrying cannot fix
it, so the bridge stops and says what is wrong. The first connection is not retried either: a
wrong URL, bad credentials or a broker that is not there is reported at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Protocol, TypeVar

import psycopg
from psycopg_pool import PoolTimeout

from pgbroker._db.backoff import Backoff
from pgbroker._db.liveness import is_transient as database_transient
from pgbroker.bridge.connector import Endpoint
from pgbroker.bridge.errors import BrokerConnectionLost, BrokerNotFound
from pgbroker.errors import DatabaseError

# SQLSTATE classes and codes of failures that pass: connection exceptions, the server shutting
# down or starting, serialization failures and deadlocks.
_TRANSIENT_CLASSES = ("08", "57")
_TRANSIENT_CODES = ("40001", "40P01")
_RECONNECT = (0.2, 30.0)
# A connection that served this long before it failed was healthy: the next pauses start over.
_SERVED_A_WHILE = _RECONNECT[1]


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, BrokerConnectionLost | psycopg.OperationalError | PoolTimeout):
        return True
    # What the runtime's loops ride out too: a psycopg OperationalError under the client's error
    # (a lock or statement timeout, a cut session), or a server gone read-only (a standby after a
    # switchover: a new connection finds the primary).
    if database_transient(exc):
        return True
    if isinstance(exc, DatabaseError):
        code = exc.sqlstate or ""
        return not code or code.startswith(_TRANSIENT_CLASSES) or code in _TRANSIENT_CODES
    return False


async def run_connected(
    endpoint: Endpoint[C],
    serve: Callable[[C], Awaitable[None]],
    *,
    stopping: asyncio.Event,
    log: logging.Logger,
    on_reconnect: Callable[[], None],
) -> None:
    """Call ``serve`` with a connection opened by ``endpoint`` until it returns (the bridge was
    stopped), reconnecting after transient failures; any other failure is raised."""
    backoff = Backoff(*_RECONNECT)
    connection: C | None = await endpoint.open()
    while connection is not None:
        served_from = time.monotonic()
        try:
            await serve(connection)
            return
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning("bridge.connection_lost broker=%s error=%s", endpoint.where, exc)
        finally:
            await connection.close()
        # The pauses start over only after a connection that served a while: a fault that comes
        # back at once (the database refusing every call, while the broker takes every
        # reconnect) is met with pauses that keep doubling.
        if time.monotonic() - served_from >= _SERVED_A_WHILE:
            backoff.reset()
        connection = None
        while connection is None and not stopping.is_set():
            with suppress(TimeoutError):
                async with asyncio.timeout(backoff.next()):
                    await stopping.wait()
            if stopping.is_set():
                return
            try:
                connection = await endpoint.open()
            except BrokerNotFound:
                raise  # deleted while the bridge was away: reconnecting cannot bring it back
            except Exception as exc:  # unreachable or refused while it restarts: keep trying
                log.warning("bridge.reconnect_failed broker=%s error=%s", endpoint.where, exc)
        if connection is not None:
            on_reconnect()
            log.info("bridge.reconnected broker=%s", endpoint.where)
