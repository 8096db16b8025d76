"""Where pgbroker connects: an explicit DSN, else DATABASE_URL, else the embedded cluster; and how,
when a transaction pooler (pgbouncer's pool_mode = transaction, RDS Proxy, Supavisor) stands
between pgbroker and Postgres.

A transaction pooler gives each transaction whatever server connection is free, so nothing that
lives in a session survives between two calls: psycopg's server-side prepared statements (it
prepares a statement run five times, and the next transaction may land where it does not exist),
and LISTEN. ``PGBROKER_POOLER=transaction`` says pgbroker is behind one: every connection it opens
then runs its statements unprepared, and waiting reads poll instead of listening, unless
``PGBROKER_LISTEN_DSN`` names a direct connection for LISTEN. An environment variable, not a DSN
option, because it must reach every process of a deployment (workers, `pgbroker serve`, the CLI)
whatever DSN each was given, and libpq refuses options it does not know. Running unprepared costs
about 5-10% of a call's time on a direct connection (docs/operations.md), so it is not the default.
"""

from __future__ import annotations

import os
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from pgbroker.errors import InvalidArgument

__all__ = ["behind_transaction_pooler", "connection_kwargs", "database_place", "listen_dsn", "resolve_dsn"]

POOLER_ENV = "PGBROKER_POOLER"
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


def behind_transaction_pooler() -> bool:
    """Whether ``$PGBROKER_POOLER`` says a transaction pooler stands in front of Postgres."""
    mode = os.environ.get(POOLER_ENV, "").strip().lower()
    if mode in ("", "none"):
        return False
    if mode == "transaction":
        return True
    raise InvalidArgument(
        f"{POOLER_ENV} must be 'transaction' or 'none', not {mode!r}",
        hint=f"Set {POOLER_ENV}=transaction behind pgbouncer's pool_mode = transaction (or a proxy "
        "like it); leave it unset for a direct connection or a session pooler.",
    )


def connection_kwargs() -> dict[str, Any]:
    """psycopg connection arguments for every connection pgbroker opens to run statements."""
    return {"prepare_threshold": None} if behind_transaction_pooler() else {}


def listen_dsn() -> str | None:
    """A direct connection for LISTEN (``$PGBROKER_LISTEN_DSN``), when one is given."""
    return os.environ.get(LISTEN_DSN_ENV) or None
