"""A statement's rows, fetched in turns with the event loop's other work (fetch_rows, what
pgbroker's asyncio calls fetch with), or at once (fetch_all, the sync client's twin of it).

psycopg turns a result's rows into Python values when they are fetched, not when the result
arrives, and a Query's ``row`` makes each into a record (a Message, a StreamMessage): a worker's
read of 1,000 stream messages held its event loop for about 4 ms of JSON, timestamps and records
in one piece, while every handler whose sleep or I/O ended in that time waited for the end of it.
Taken TURN rows at a time, with the loop let run between two slices, the same work leaves the
handlers' wake-ups on time: with 64 handlers of 1 ms (three alternating runs each), their sleeps
lasted 1.75 -> 1.51-1.55 ms in a StreamWorker (36,300-37,100 -> 41,000-42,300 messages a
second; the same sleeps with no database at all, 42,100-44,000) and 2.00 -> 1.64-1.80 ms in a
queue Worker (31,400-32,500 -> 35,700-39,300). Slices of 128 rows gave half of that, of 32 a
little less than 16, and yielding only once 0.1 ms had passed 1-6% less. The price is paid by a
coroutine that fetches a large result alone: 10,000 rows took 12-16% longer than one fetchall
(fetchmany's calls about half of it, the loop's turns the rest).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg

__all__ = ["fetch_all", "fetch_rows"]

#: rows decoded between two turns of the event loop
TURN = 16


def fetch_all(cursor: psycopg.Cursor[Any], make: Callable[[Any], Any] | None = None) -> list[Any]:
    """The rows of ``cursor``'s result (none for a statement without one), each made into
    ``make(row)`` if given."""
    return _made(cursor.fetchall() if cursor.description else [], make)


async def fetch_rows(cursor: psycopg.AsyncCursor[Any], make: Callable[[Any], Any] | None = None) -> list[Any]:
    """fetch_all's rows, fetched (and made) in slices of TURN, the event loop run between two."""
    if not cursor.description:
        return []
    if cursor.rowcount <= TURN:
        return _made(await cursor.fetchall(), make)
    made: list[Any] = []
    while chunk := await cursor.fetchmany(TURN):
        made += _made(chunk, make)
        await asyncio.sleep(0)
    return made


def _made(rows: list[Any], make: Callable[[Any], Any] | None) -> list[Any]:
    return rows if make is None else [make(row) for row in rows]
