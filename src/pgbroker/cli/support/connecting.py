"""Connecting a command to its database: one autocommit connection, with a usage error for a
bad DSN and a hint when the server is not there."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgbroker._db.dsn import connection_kwargs, resolve_dsn
from pgbroker._db.pools import DEFAULT_CONNECT_TIMEOUT, connect_timeout_for
from pgbroker.cli.support.errors import CliError, Exit, first_line
from pgbroker.queues._client import Broker


@contextmanager
def connected(dsn: str | None, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> Iterator[Broker]:
    """A Broker on one autocommit connection: a CLI call runs a few statements, then exits."""
    conninfo = dsn_of(dsn, connect_timeout)
    extra: dict[str, Any] = connection_kwargs()
    if "application_name" not in conninfo_to_dict(conninfo) and "PGAPPNAME" not in os.environ:
        extra["application_name"] = "pgbroker-cli"
    try:
        conn = psycopg.connect(conninfo, autocommit=True, **extra)
    except psycopg.OperationalError as exc:
        raise CliError(
            f"cannot connect to the database: {first_line(str(exc))}",
            code=Exit.DATABASE,
            hint="Is the server running? Check --dsn or DATABASE_URL "
            "(with neither, pgbroker uses its embedded PostgreSQL).",
        ) from exc
    with conn:
        yield Broker(connection=conn)


def dsn_of(dsn: str | None, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> str:
    """The DSN of the command, and of the pools of one that opens its own (a server, a worker, a
    bridge): as the user gave it (every host of a multi-host list, hostnames unresolved,
    target_session_attrs), so that a reconnect after a failover finds the new primary; with a
    connect timeout (a host that drops packets would hang a connect for minutes)."""
    resolved = resolve_dsn(dsn)
    try:
        conninfo_to_dict(resolved)
    except psycopg.ProgrammingError as exc:
        raise CliError(
            f"invalid DSN: {first_line(str(exc))}",
            code=Exit.USAGE,
            hint="Use a URL (postgresql://user@host:5432/db) or key=value pairs (host=... dbname=...).",
        ) from exc
    return make_conninfo(resolved, **connect_timeout_for(resolved, connect_timeout))
