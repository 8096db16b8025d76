"""Saying why a long-running command's calls fail when the server refuses its connections for a
reason that stays: a password rotated while it runs, its role or database dropped.

Its pool then finds no connection in time, and the command says only that (a worker's
worker.database_unavailable error="no answer from the server within 30 s", a bridge's
connection_lost, a scheduler's retry, a server's 503s); psycopg_pool's own lines say the server's
words at WARNING, among those of every outage. A RefusalWatch runs beside the command's loops:
every few seconds it looks whether the pool's connection attempts have failed since it last
looked (psycopg_pool counts them), and if so tries a new connection once; a refusal that stays
(pgbroker._db.refusals.passes is false) is said at ERROR, with the server's words, at once and
then every minute while the attempts keep failing. The command goes on trying (a password rotated
in a passfile, ~/.pgpass or $PGPASSFILE, which libpq reads at every connection, is taken at the
next try). One watch runs per pool: a second watching the same broker (each queue worker of a
process, beside serve()'s) joins the first, so that a refusal is said once, not once per queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from functools import partial

from pgbroker._background import restarting
from pgbroker._db.refusals import passes
from pgbroker._log_lines import log_event_on
from pgbroker.queues._client_async import AsyncBroker

__all__ = ["RefusalWatch"]

# How often the pool's failed connection attempts are looked at (a look costs nothing).
LOOK_EVERY = 5.0
# A refusal that lasts is said again this often.
REMINDER = 60.0


@dataclass
class _Running:
    """The watch running on a broker's pool, and how many watching() blocks share it."""

    task: asyncio.Task[None]
    sharing: int = 1


# By id() of the broker watched, while watched.
_running: dict[int, _Running] = {}


class RefusalWatch:
    """``async with watch.watching(broker):`` around a long-running command's loops: says at
    ERROR, on ``logger`` as ``event`` with ``fields``, that the server refuses the connections of
    ``who``."""

    def __init__(self, logger: logging.Logger, event: str, who: str, **fields: object) -> None:
        self._logger = logger
        self._event = event
        self._fields = fields
        self._hint = (
            f"the server refuses this {who}'s connections (a password changed, a role or database "
            "gone): it tries again with back-off, reading ~/.pgpass or $PGPASSFILE anew each time; "
            "correct the login, or stop it"
        )

    @asynccontextmanager
    async def watching(self, broker: AsyncBroker) -> AsyncIterator[None]:
        running = _running.get(id(broker))
        if running is None:
            # Anything _keep does not expect (a bug, the machine's limits) is said at ERROR at once,
            # and the watch starts again: it alone says why the calls fail. It ended in silence.
            watch = restarting(
                partial(self._keep, broker), self._logger, f"{self._event}_watch_failed", LOOK_EVERY
            )
            task = asyncio.create_task(watch, name=f"pgbroker-{self._event}")
            running = _running[id(broker)] = _Running(task)
        else:
            running.sharing += 1
        try:
            yield
        finally:
            running.sharing -= 1
            if not running.sharing:
                del _running[id(broker)]
                running.task.cancel()
                with suppress(asyncio.CancelledError):
                    await running.task

    async def _keep(self, broker: AsyncBroker) -> None:
        seen = broker.failed_connections()
        said_at: float | None = None
        while True:
            await asyncio.sleep(LOOK_EVERY)
            failed = broker.failed_connections()
            if failed == seen or (said_at is not None and time.monotonic() - said_at < REMINDER):
                seen = failed
                continue
            seen = failed
            refused = await broker.connect_error()
            # passes() may try the connection once more (its SQLSTATE), blocking: on a thread.
            if refused is None or await asyncio.to_thread(passes, refused):
                said_at = None
                continue
            said_at = time.monotonic()
            error = " ".join(str(refused).split())
            fields = {**self._fields, "error": error, "hint": self._hint}
            log_event_on(self._logger, logging.ERROR, self._event, fields)
