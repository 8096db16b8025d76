"""What every pool pgbroker opens from a DSN shares (the clients', the workers', `pgbroker serve`'s):
autocommit, the transaction pooler's settings, a connect timeout, a wait for a free connection, and
a ceiling on the reconnect back-off.

psycopg_pool retries a failed connection after 1 s, 2 s, 4 s, ... for up to ``reconnect_timeout``
(5 minutes by default), so after a 40 s outage the next attempt could come 30 s after the server
is back. With ``reconnect_timeout`` at RECONNECT_CEILING an attempt gives up sooner, and the next
caller that finds no connection starts another from a 1 s delay: no wait after a promotion is
longer than the ceiling. A host that drops packets would hang a connect for minutes: libpq's
``connect_timeout`` bounds it, unless the DSN or $PGCONNECT_TIMEOUT sets one.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgbroker._credentials import hide_passwords
from pgbroker._db.dsn import connection_kwargs
from pgbroker.errors import InvalidArgument

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_POOL_TIMEOUT",
    "RECONNECT_CEILING",
    "PoolTimeouts",
    "connect_timeout_for",
]

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_POOL_TIMEOUT = 30.0
RECONNECT_CEILING = 10.0


@dataclass(frozen=True)
class PoolTimeouts:
    """``connect``: seconds a connection attempt may take (libpq's connect_timeout, at least 2);
    ``pool``: seconds a call waits for a free pooled connection before PoolTimeout."""

    connect: float = DEFAULT_CONNECT_TIMEOUT
    pool: float = DEFAULT_POOL_TIMEOUT

    def __post_init__(self) -> None:
        for name, value in (("connect_timeout", self.connect), ("pool_timeout", self.pool)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidArgument(f"{name} must be a number of seconds > 0, got {value!r}")

    def connection_kwargs(self, dsn: str, pooler: str | None = None) -> dict[str, Any]:
        """psycopg arguments of each pooled connection of ``dsn``, behind ``pooler``
        (pgbroker._db.dsn.pooler_mode); the DSN's own connect_timeout (or $PGCONNECT_TIMEOUT) wins."""
        return {"autocommit": True, **connection_kwargs(pooler), **connect_timeout_for(dsn, self.connect)}


def connect_timeout_for(dsn: str, seconds: float) -> dict[str, int]:
    """libpq's connect_timeout of ``seconds`` (whole, at least 2), unless the DSN or
    $PGCONNECT_TIMEOUT sets one. InvalidArgument for a DSN libpq cannot parse."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        # Not psycopg's error: its text may quote a password it misread (pgbroker._credentials).
        raise InvalidArgument(
            f"invalid DSN: {hide_passwords(str(exc), dsn)}",
            hint="Use a URL (postgresql://user@host:5432/db) or key=value pairs (host=... dbname=...).",
        ) from None
    if "connect_timeout" in params or "PGCONNECT_TIMEOUT" in os.environ:
        return {}
    return {"connect_timeout": max(2, math.ceil(seconds))}
