"""The sessions that hold the engine up: long transactions holding a queue's, a stream's or the
engine's tables, or the xmin horizon (pgbroker.blocking_sessions, sql/functions/96_monitoring.sql).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from pgbroker import _sql as sql
from pgbroker.errors import from_postgres

__all__ = ["BlockingSession", "blocking_sessions"]


@dataclass(frozen=True)
class BlockingSession:
    pid: int
    role_name: str | None
    application_name: str | None
    client_addr: str | None
    state: str | None  # 'idle in transaction' for a client that left its transaction open
    transaction_age_sec: float
    state_age_sec: float | None
    tables: list[str]  # the engine's tables it holds a lock on
    holds_horizon: bool  # it keeps vacuum from removing dead tuples
    query: str | None  # its last statement (hidden from a role without pg_read_all_stats)


def blocking_sessions(conn: psycopg.Connection[Any], older_than_sec: float) -> list[BlockingSession]:
    """The sessions whose transaction has been open longer than ``older_than_sec`` and that hold
    the engine's tables or the xmin horizon, the oldest first."""
    try:
        rows = conn.execute(sql.queries("sessions")["blocking_sessions"], (older_than_sec,)).fetchall()
    except psycopg.Error as exc:
        raise from_postgres(exc) from exc
    return [BlockingSession(*row) for row in rows]
