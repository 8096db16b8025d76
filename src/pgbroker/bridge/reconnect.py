"""Keeping a bridge connected: which failures it rides out, and the reconnect loop both share.

A lost AMQP connection, a database restart or a dropped database connection is transient: the
bridge reconnects after a back-off (jittered, doubling up to 30 s) and carries on; messages it
held come back on their own (pgbroker leases run out, RabbitMQ requeues unacked deliveries). A
missing queue or exchange, a missing schema or an invalid setting is not: retrying cannot fix
it, so the bridge stops and says what is wrong. The first connection is not retried either: a
wrong URL, bad credentials or a broker that is not there is reported at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress

import psycopg
from psycopg_pool import PoolTimeout

from pgbroker.backoff import Backoff
from pgbroker.bridge import amqp
from pgbroker.bridge.errors import AmqpConnectionLost
from pgbroker.errors import DatabaseError

# SQLSTATE classes and codes of failures that pass: connection exceptions, the server shutting
# down or starting, serialization failures and deadlocks.
_TRANSIENT_CLASSES = ("08", "57")
_TRANSIENT_CODES = ("40001", "40P01")
_RECONNECT = (0.2, 30.0)


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, AmqpConnectionLost | psycopg.OperationalError | PoolTimeout):
        return True
    if isinstance(exc, DatabaseError):
        code = exc.sqlstate or ""
        return not code or code.startswith(_TRANSIENT_CLASSES) or code in _TRANSIENT_CODES
    return False


async def run_connected(
    url: str,
    serve: Callable[[amqp.Connection], Awaitable[None]],
    *,
    stopping: asyncio.Event,
    connect_timeout: float,
    log: logging.Logger,
    on_reconnect: Callable[[], None],
) -> None:
    """Call ``serve`` with a connection to ``url`` until it returns (the bridge was stopped),
    reconnecting after transient failures; any other failure is raised."""
    backoff = Backoff(*_RECONNECT)
    connection: amqp.Connection | None = await amqp.Connection.open(url, timeout=connect_timeout)
    while connection is not None:
        try:
            await serve(connection)
            return
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning("bridge.connection_lost error=%s", exc)
        finally:
            await connection.close()
        connection = None
        while connection is None and not stopping.is_set():
            with suppress(TimeoutError):
                async with asyncio.timeout(backoff.next()):
                    await stopping.wait()
            if stopping.is_set():
                return
            try:
                connection = await amqp.Connection.open(url, timeout=connect_timeout)
            except Exception as exc:  # unreachable or refused while it restarts: keep trying
                log.warning("bridge.reconnect_failed error=%s", exc)
        if connection is not None:
            on_reconnect()
            log.info("bridge.reconnected broker=%s", amqp.where(url))
            backoff.reset()
