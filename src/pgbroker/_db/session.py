"""What pgbroker sets up on each connection it opens itself (its pools' ``configure``): json and
jsonb decoded by pgbroker._db.json_decode.loads, and a session time zone that is UTC under another
name (Etc/UTC, the default of many servers whose machine runs on UTC) named plain UTC.

psycopg gives a timestamptz the session's zone. It has a fast path for the name UTC alone
(datetime.timezone.utc); any other name, an alias of UTC included, goes through zoneinfo, which
cost 0.35 us more a value here. A worker's read brings three timestamps a message: on a server in
Etc/UTC a Worker draining a backlog spent 2.5-3.9 us less client CPU a message (of 21-26) with the
session in UTC (three alternating runs). The zone is the same, so nothing the session computes or
prints changes; a session in any other zone is left in it. Connections and pools passed in by the
application keep their own settings: pgbroker changes only what it opened.
"""

from __future__ import annotations

from typing import Any

import psycopg

from pgbroker import _sql
from pgbroker._db.json_decode import decode_json_fast

__all__ = ["configure", "configure_async"]

# The tz database's names of UTC itself (not of GMT, whose abbreviation differs), lower case.
_UTC_ALIASES = frozenset({"etc/utc", "etc/uct", "uct", "universal", "etc/universal", "zulu", "etc/zulu"})
_SET_UTC = _sql.queries("session")["session_zone_utc"]


def _utc_under_another_name(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    zone = conn.info.parameter_status("TimeZone")
    return zone is not None and zone.lower() in _UTC_ALIASES


def configure(conn: psycopg.Connection[Any]) -> None:
    """Set up a connection pgbroker opened (a pool's ``configure``)."""
    decode_json_fast(conn)
    if _utc_under_another_name(conn):
        conn.execute(_SET_UTC)


async def configure_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`configure` for an asyncio connection."""
    decode_json_fast(conn)
    if _utc_under_another_name(conn):
        await conn.execute(_SET_UTC)
