"""The streaming standby ``pgbroker serve --replica-dsn`` reads its reports from, watched.

A replica that is down when the server starts, or goes down while it serves, is said once: a
warning naming it, with the reason, and saying that the reports are read from the primary
meanwhile (they were answered 503, each after waiting out the pool timeout). It is tried again
quietly, with a back-off doubling up to RECONNECT_CEILING; when it answers, one line says so and
the reports read from it again.

Its pool exists only while it answers: psycopg_pool retries each of its connections on its own
and logs every failure (ten connections: about forty warnings in the first seconds). While it
answers, a round trip every HEALTH_INTERVAL (at once after a report failed on it) finds it gone;
its pool's warnings about the connections it then loses are the watch's to report, and are
dropped (shown with -vv).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from pgbroker import _sql as sql
from pgbroker._background import said_if_failed
from pgbroker._credentials import hide_passwords
from pgbroker._db.backoff import Backoff
from pgbroker._db.dsn import PoolerMode, database_place
from pgbroker._db.liveness import answered_within
from pgbroker._db.pools import RECONNECT_CEILING, PoolTimeouts
from pgbroker.queues._client_async import AsyncBroker

__all__ = ["OpenedReplica", "WatchedReplica"]

log = logging.getLogger("pgbroker.http")

HEALTH_INTERVAL = 5.0  # seconds between two round trips to a replica that answers
POOL_NAME = "pgbroker-http-replica"  # the name of its pool, in psycopg_pool's log records

# What a replica that is down, or cut off, raises on a connect or a round trip.
_UNREACHABLE = (psycopg.Error, PoolTimeout, OSError, TimeoutError)


class OpenedReplica:
    """A replica the caller opened (create_app(replica=...)) and closes: used as it is."""

    def __init__(self, broker: AsyncBroker) -> None:
        self.broker: AsyncBroker | None = broker

    def suspect(self) -> None:
        """Nothing to do: the caller watches its own broker."""


class WatchedReplica:
    """The replica of ``dsn``, its pool (made by ``make_pool``, not opened) open while it answers;
    ``broker`` is None while it does not, and the reports then read from the primary."""

    def __init__(
        self,
        dsn: str,
        make_pool: Callable[[], AsyncConnectionPool[Any]],
        timeouts: PoolTimeouts,
        pooler: PoolerMode,
    ) -> None:
        self._dsn = dsn
        self._make_pool = make_pool
        self._timeouts = timeouts
        self._pooler = pooler
        self._place = database_place(dsn)
        self._pool: AsyncConnectionPool[Any] | None = None
        self.broker: AsyncBroker | None = None
        self._said_down = False
        self._suspected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def suspect(self) -> None:
        """A report failed on the replica as on a lost connection: look at it now."""
        self._suspected.set()

    async def start(self) -> None:
        """Try the replica once (a server that is up is read from as soon as this returns), then
        keep watching it in the background."""
        logging.getLogger("psycopg.pool").addFilter(self._pool_noise)
        await self._connect()
        self._task = asyncio.create_task(self._watch(), name="pgbroker-replica")
        self._task.add_done_callback(said_if_failed(log, "serve.replica_watch_ended"))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._disconnect()
        logging.getLogger("psycopg.pool").removeFilter(self._pool_noise)

    async def _watch(self) -> None:
        backoff = Backoff(1.0, RECONNECT_CEILING)
        while True:
            try:
                await self._look(backoff)
            except Exception as exc:  # a bug: said, and the watch goes on (it alone brings the replica back)
                log.warning("serve.replica_watch_failed error=%s", json.dumps(f"{type(exc).__name__}: {exc}"))
                await asyncio.sleep(backoff.next())

    async def _look(self, backoff: Backoff) -> None:
        """One step of the watch: a replica said down is tried again after the next pause of
        ``backoff``; one that answers is asked again after HEALTH_INTERVAL (sooner if suspected)."""
        if self.broker is None:
            await asyncio.sleep(backoff.next())
            if await self._connect():
                backoff.reset()
            return
        with contextlib.suppress(TimeoutError):
            # Not asyncio.wait_for: on Python 3.11 it returns when the event comes together with
            # close()'s cancellation (CPython gh-86296), and the watch went on for good.
            async with asyncio.timeout(HEALTH_INTERVAL):
                await self._suspected.wait()
        self._suspected.clear()
        if not await self._answers():
            await self._disconnect()
            await self._connect()

    async def _connect(self) -> bool:
        """Connect once, then open the pool; say so if it was said to be down."""
        try:
            await self._probe()
            pool = self._make_pool()
            try:
                await pool.open(wait=True, timeout=self._timeouts.connect)
            except BaseException:
                await pool.close()
                raise
        except _UNREACHABLE as exc:
            self._unreachable(exc)
            return False
        self._pool, self.broker = pool, AsyncBroker(pool=pool, pooler=self._pooler)
        if self._said_down:
            self._said_down = False
            log.warning(
                "serve.replica_back replica=%s: the reports are read from the replica again",
                json.dumps(self._place),
            )
        return True

    async def _answers(self) -> bool:
        """Whether the replica answers a round trip, on a pooled connection or, that one lost (a
        restart cuts them all), on a new one."""
        try:
            # The wait for a pooled connection inside answered_within too: psycopg_pool's wait
            # swallows a cancellation that comes with a connection; answered_within raises it.
            await answered_within(self._timeouts.connect, self._round_trip())
            return True
        except _UNREACHABLE:
            pass
        try:
            await self._probe()
        except _UNREACHABLE:
            return False
        return True

    async def _round_trip(self) -> None:
        assert self._pool is not None
        async with self._pool.connection() as conn:
            await conn.execute(sql.queries("http")["health_check"])

    async def _probe(self) -> None:
        """Connect to the replica and let go: what the failure of a pool does not say, it says."""
        probe = await psycopg.AsyncConnection.connect(
            self._dsn, **self._timeouts.connection_kwargs(self._dsn, self._pooler)
        )
        await probe.close()

    async def _disconnect(self) -> None:
        broker, pool = self.broker, self._pool
        self.broker, self._pool = None, None
        if broker is not None:
            await broker.close()
        if pool is not None:
            await pool.close()

    def _unreachable(self, exc: BaseException) -> None:
        said = hide_passwords(str(exc).strip(), self._dsn)
        reason = said.splitlines()[0] if said else type(exc).__name__
        if self._said_down:
            log.debug(
                "serve.replica_retry_failed replica=%s error=%s", json.dumps(self._place), json.dumps(reason)
            )
            return
        self._said_down = True
        log.warning(
            "serve.replica_unreachable replica=%s error=%s: the reports are read from the primary until the "
            "replica answers (tried again in the background, at most every %g s)",
            json.dumps(self._place),
            json.dumps(reason),
            RECONNECT_CEILING,
        )

    def _pool_noise(self, record: logging.LogRecord) -> bool:
        """False for psycopg_pool's warnings about this replica's pool (a failed connection, one
        found broken): this watch says the replica is down, once. Kept with -vv."""
        args = record.args if isinstance(record.args, tuple) else ()
        about_ours = any(
            arg == POOL_NAME or getattr(getattr(arg, "_pool", None), "name", None) == POOL_NAME
            for arg in args
        )
        return not about_ours or log.isEnabledFor(logging.DEBUG)
