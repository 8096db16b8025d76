"""Telling an upgrade from a bug when a running loop's call finds pgbroker's schema wanting.

`pgbroker install` drops or re-signatures functions and moves columns, and a call running when it
commits goes on with the functions it started with, on the new tables: it may fail once with
"function ... does not exist" (NotInstalled) or "column ... does not exist" (42703), and the
next call finds the new definitions (tests/system/test_upgrade_under_load.py met both). The
runtime's loops (Worker, StreamWorker, the scheduler) wait that out as a lost connection, but
only when the schema did change: the same error from a bug (a function missing on a path rarely
taken, a damaged install) was waited out too, for good, a warning at a time, where it must stop
the loop and say so.

So a loop's SchemaWatch reads a marker of the installed schema before its first call and, after
such an error once a call has answered, reads it again: changed, it is an upgrade (SchemaChanged,
worth another try), and so are such errors for UPGRADE_SETTLES seconds from then; unchanged, or
later, the error is raised as it came. The marker is which transactions wrote pgmq's functions
(queries/schema_watch.sql): every install that changes the schema runs all the function files
again, in its one transaction, and nothing else writes them. pgbroker.schema_functions, the
installer's own record, would say as much, but only its owner may read it, and the loops may run
as pgbroker's least-privilege roles, which read the catalog like every role.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

import psycopg

from pgbroker import _sql as sql
from pgbroker.errors import DatabaseError, NotInstalled, PgbrokerError

T = TypeVar("T")

# After an upgrade is seen, its errors are waited out this long: the calls that met its commit
# fail at once after it, and their next tries find the new definitions; a minute covers every
# loop's retries on a loaded machine. One that still fails past it is a bug of the new release.
UPGRADE_SETTLES = 60.0

# What the runtime logs beside a SchemaChanged.
SCHEMA_CHANGED_HINT = "the schema changed under a running call (an upgrade): trying again"

# The hint of such an error when the schema did not change ("Install the schema first" is wrong).
_NOT_AN_UPGRADE = (
    "pgbroker's schema has not changed since this process first used it, so this is no upgrade: "
    "the install is damaged or incomplete (run `pgbroker install` again), or this is a bug of "
    "pgbroker's (please report it)."
)

_MARKER = sql.queries("schema_watch")["schema_marker"]
_UNDEFINED_COLUMN = "42703"


class SchemaChanged(PgbrokerError):
    """A call failed on a function or column of pgbroker's that an upgrade had just dropped or
    moved (the error it met is the cause): the same call made again finds the new ones."""


class _Connections(Protocol):
    """What the watch reads its marker through: an AsyncBroker."""

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...


def is_schema_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says a function or schema of pgbroker's is not there (NotInstalled), or a
    column (42703: the runtime's calls name no column of the caller's)."""
    return isinstance(exc, NotInstalled) or (
        isinstance(exc, DatabaseError) and exc.sqlstate == _UNDEFINED_COLUMN
    )


class SchemaWatch:
    """One loop's view of the installed schema: ``await watch.call(broker, coroutine)``."""

    def __init__(self) -> None:
        self._marked = False  # the marker was read, before the first call
        self._seen: str | None = None
        self._worked = False  # a call has answered: the schema was there
        self._changed_at: float | None = None  # when a change was last seen (monotonic)

    async def call(self, broker: _Connections, call: Coroutine[Any, Any, T]) -> T:
        """``call`` awaited; a function or column found missing after an upgrade (once a call has
        answered) raised as SchemaChanged; without one, raised as it came, with a hint that says
        so. Before any call has answered, a database without pgbroker stops the loop with what to
        do, as any other error."""
        try:
            if not self._marked:
                self._seen, self._marked = await _marker(broker), True
        except BaseException:
            call.close()
            raise
        try:
            result = await call
        except PgbrokerError as exc:
            if self._worked and is_schema_gone(exc):
                if await self._upgraded(broker):
                    raise SchemaChanged(exc.message) from exc
                exc.hint = _NOT_AN_UPGRADE
            raise
        self._worked = True
        return result

    async def _upgraded(self, broker: _Connections) -> bool:
        now = time.monotonic()
        marker = await _marker(broker)
        if marker != self._seen:
            self._seen, self._changed_at = marker, now
        return self._changed_at is not None and now - self._changed_at < UPGRADE_SETTLES


async def _marker(broker: _Connections) -> str | None:
    async with broker.connection() as conn:
        row = await (await conn.execute(_MARKER)).fetchone()
    return None if row is None else row[0]
