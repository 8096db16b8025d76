"""Saying why a worker's calls fail when the server refuses its connections for a reason that stays:
a password rotated while it runs, its role or database dropped.

Its pool then finds no connection in time, and the worker's warning said only that
(worker.database_unavailable error="no answer from the server within 30 s"); psycopg_pool's own
lines say the server's words at WARNING, among those of every outage. The worker goes on trying (a
password rotated in a passfile, ~/.pgpass or $PGPASSFILE, which libpq reads at every connection,
is taken at the next try), but each time it warns (the first failure of an outage, then every
minute while it lasts) a new connection is tried once and a refusal that stays is said at ERROR.
"""

from __future__ import annotations

import asyncio
import logging

from pgbroker._db.refusals import passes
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.runtime._log_events import log_event

__all__ = ["RefusalWatch"]

_HINT = (
    "the server refuses this worker's connections (a password changed, a role or database gone): "
    "it tries again with back-off, reading ~/.pgpass or $PGPASSFILE anew each time; correct the "
    "login, or stop it"
)


class RefusalWatch:
    """``keep`` runs beside a worker; ``ask()`` when it warns that its calls fail."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self._asked = asyncio.Event()

    def ask(self) -> None:
        self._asked.set()

    async def keep(self, broker: AsyncBroker) -> None:
        while True:
            await self._asked.wait()
            self._asked.clear()
            refused = await broker.connect_error()
            # passes() may try the connection once more (its SQLSTATE), blocking: on a thread.
            if refused is not None and not await asyncio.to_thread(passes, refused):
                error = " ".join(str(refused).split())
                log_event(logging.ERROR, "worker.database_refused", queue=self.queue, error=error, hint=_HINT)
