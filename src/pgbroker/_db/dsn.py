"""Where pgbroker connects: an explicit DSN, else DATABASE_URL, else the embedded cluster; and how,
when a transaction pooler (pgbouncer's pool_mode = transaction, RDS Proxy, Supavisor) stands
between pgbroker and Postgres.

A transaction pooler gives each transaction whatever server connection is free, so nothing that
lives in a session survives between two calls: psycopg's server-side prepared statements (it
prepares a statement run five times, and the next transaction may land where it does not exist),
and LISTEN. Behind one, every connection pgbroker opens runs its statements unprepared, and
waiting reads poll instead of listening, unless ``PGBROKER_LISTEN_DSN`` names a direct connection
for LISTEN. pgbroker is told so by the ``pooler`` argument of Broker, AsyncBroker, App.run, serve
and create_app (the CLI's ``--pooler``), else by ``PGBROKER_POOLER``: the variable reaches every
process of a deployment (workers, `pgbroker serve`, Spark executors) whatever DSN each was given;
it is not a DSN option because libpq refuses options it does not know. pooler_mode() alone
decides. Running unprepared costs about 5-10% of a call's time on a direct connection
(docs/operations.md), so it is not the default.
"""

from __future__ import annotations

import os
from typing import Any, Literal, get_args

from psycopg.conninfo import conninfo_to_dict

from pgbroker.errors import InvalidArgument

__all__ = [
    "PoolerMode",
    "behind_transaction_pooler",
    "connection_kwargs",
    "database_place",
    "listen_dsn",
    "pooler_mode",
    "resolve_dsn",
]

POOLER_ENV = "PGBROKER_POOLER"

#: What stands between pgbroker and Postgres: a transaction pooler (pgbouncer's pool_mode =
#: transaction, RDS Proxy, Supavisor), a session pooler, or nothing. Only "transaction" changes
#: what pgbroker does: a session pooler keeps a client's session, as a direct connection does.
PoolerMode = Literal["transaction", "session", "none"]
POOLER_MODES: tuple[PoolerMode, ...] = get_args(PoolerMode)
LISTEN_DSN_ENV = "PGBROKER_LISTEN_DSN"


def resolve_dsn(dsn: str | None = None) -> str:
    """Return ``dsn`` if given, else ``$DATABASE_URL``, else the default embedded cluster's DSN.

    An empty string counts as not given, as an empty DATABASE_URL does: neither names a server.
    The embedded cluster is started (and created on first use) only when it is needed.
    """
    if dsn:
        return dsn
    env = os.environ.get("DATABASE_URL")
    if env:
        return env
    # Imported here: most callers have a DSN and never need the subprocess machinery.
    from pgbroker.embedded import EmbeddedPostgres

    return EmbeddedPostgres().start()


def database_place(dsn: str) -> str:
    """Where a DSN points, for a person: ``DBNAME at HOST:PORT`` (a socket directory has no port)."""
    params = conninfo_to_dict(dsn)
    host = params.get("host") or "localhost"
    place = f"{host}" if str(host).startswith("/") else f"{host}:{params.get('port') or 5432}"
    return f"{params.get('dbname', 'postgres')} at {place}"


def pooler_mode(pooler: str | None = None) -> PoolerMode:
    """The pooler in front of Postgres: ``pooler`` when given, else ``$PGBROKER_POOLER`` (unset or
    empty: none)."""
    if pooler is not None:
        mode, source = pooler, "pooler"
    else:
        mode, source = os.environ.get(POOLER_ENV, "").strip() or "none", POOLER_ENV
    for known in POOLER_MODES:
        if mode.lower() == known:
            return known
    raise InvalidArgument(
        f"{source} must be one of {', '.join(POOLER_MODES)}, not {mode!r}",
        hint="'transaction' behind pgbouncer's pool_mode = transaction (or a proxy like it); "
        "'session' or 'none' for a session pooler or a direct connection.",
    )


def behind_transaction_pooler(pooler: str | None = None) -> bool:
    """Whether a transaction pooler stands in front of Postgres (see pooler_mode)."""
    return pooler_mode(pooler) == "transaction"


def connection_kwargs(pooler: str | None = None) -> dict[str, Any]:
    """psycopg connection arguments for every connection pgbroker opens to run statements."""
    return {"prepare_threshold": None} if behind_transaction_pooler(pooler) else {}


def listen_dsn() -> str | None:
    """A direct connection for LISTEN (``$PGBROKER_LISTEN_DSN``), when one is given."""
    return os.environ.get(LISTEN_DSN_ENV) or None
