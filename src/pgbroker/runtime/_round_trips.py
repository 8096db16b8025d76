"""Several queries in one round trip and one commit: psycopg's pipeline mode around a transaction.

The worker's hot path sends the outcomes of the messages it handled (acks, failures) and its
next read together: every statement is queued, then one Sync sends them all and waits for every
result. One transaction means one WAL flush for the lot, where autocommit calls would each pay
for their own; and each statement keeps its own result, so the worker still learns which acks
held (pgbroker.consume, its one-statement cousin, cannot tell).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from pgbroker._db.fetch import fetch_rows
from pgbroker.errors import from_postgres
from pgbroker.queues._query import Query

__all__ = ["run_together"]


async def run_together(
    conn: psycopg.AsyncConnection[Any], queries: Sequence[Query[Any]], *, shared: bool = False
) -> list[Any]:
    """Run ``queries`` in order in one transaction with one round trip; their decoded results.

    A failing statement rolls the whole transaction back and raises as the clients do (the
    pgbroker error type, with the psycopg error as the cause). ``conn`` must be idle in
    autocommit, as the pools' connections are. One query is simply run on its own, and so is
    each of them on a ``shared`` connection, where another task's statement could otherwise
    slip into the transaction between two of them.
    """
    if not queries:
        return []
    try:
        if len(queries) == 1 or shared:
            cursors = [await conn.execute(query.sql, query.params) for query in queries]
        else:
            async with conn.pipeline(), conn.transaction():
                # Queued, not sent: leaving the pipeline sends BEGIN ... COMMIT with one Sync.
                cursors = [await conn.execute(query.sql, query.params) for query in queries]
        rows = [await fetch_rows(cursor, query.row) for query, cursor in zip(queries, cursors, strict=True)]
    except psycopg.Error as exc:
        raise from_postgres(exc) from exc
    return [query.decode(found) for query, found in zip(queries, rows, strict=True)]
