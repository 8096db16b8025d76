"""Connecting a command to its database: one autocommit connection, with a usage error for a
bad DSN and a hint for each reason a connection fails."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgbroker._credentials import hide_passwords, safe_cause
from pgbroker._db.dsn import PoolerMode, connection_kwargs, database_place, resolve_dsn
from pgbroker._db.install import is_installed
from pgbroker._db.pools import DEFAULT_CONNECT_TIMEOUT, connect_timeout_for
from pgbroker.cli.support.errors import CliError, Exit, first_line
from pgbroker.errors import NotInstalled
from pgbroker.queues._client import Broker

WHERE_THE_DSN_COMES_FROM = "the DSN (--dsn, else DATABASE_URL)"

# What libpq's message says went wrong, and what to do about it; the first match wins. The server
# answered for all but the last: asking whether it runs would send the user the wrong way.
CONNECT_HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r'role "(?P<name>[^"]*)" does not exist'),
        'The server has no role "{name}": check the user in '
        + WHERE_THE_DSN_COMES_FROM
        + ", or create the role (CREATE ROLE ... LOGIN).",
    ),
    (
        re.compile(r'database "(?P<name>[^"]*)" does not exist'),
        'The server has no database "{name}": check its name in '
        + WHERE_THE_DSN_COMES_FROM
        + ", or create the database (createdb).",
    ),
    (
        # libpq's words for a value it cannot take ("invalid integer value ... for connection
        # option", "invalid port number", "invalid sslmode value"): no server was asked.
        re.compile(r"invalid [\w ]*(value|number)\b"),
        "The DSN's value cannot be used as it is written: correct it in " + WHERE_THE_DSN_COMES_FROM + ".",
    ),
    (
        re.compile(r"authentication failed|no password supplied|pg_hba\.conf"),
        "The server refused the login: check the user and password (in the DSN, $PGPASSWORD or "
        "~/.pgpass) and the server's pg_hba.conf.",
    ),
)


@contextmanager
def connected(
    dsn: str | None, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, pooler: PoolerMode | None = None
) -> Iterator[Broker]:
    """A Broker on one autocommit connection: a CLI call runs a few statements, then exits."""
    conninfo = dsn_of(dsn, connect_timeout)
    extra: dict[str, Any] = connection_kwargs(pooler)
    if "application_name" not in conninfo_to_dict(conninfo) and "PGAPPNAME" not in os.environ:
        extra["application_name"] = "pgbroker-cli"
    try:
        conn = psycopg.connect(conninfo, autocommit=True, **extra)
    except psycopg.OperationalError as exc:
        message = first_line(hide_passwords(str(exc), conninfo))
        raise CliError(
            f"cannot connect to the database: {message}", code=Exit.DATABASE, hint=connect_hint(message)
        ) from safe_cause(exc, conninfo)
    with conn:
        yield Broker(connection=conn, pooler=pooler)


def database_of(dsn: str | None, broker: Broker) -> str:
    """The database of ``broker``, for a person (``app at db:5432``): with neither --dsn (``dsn``)
    nor DATABASE_URL, the embedded cluster, which a newcomer may not know was started for them."""
    with broker.connection() as conn:
        where = database_place(conn.info.dsn)
    if dsn or os.environ.get("DATABASE_URL"):
        return where
    return f"{where} (the embedded PostgreSQL: --dsn or DATABASE_URL for another server)"


def not_installed(exc: NotInstalled, where: str = "this database") -> CliError:
    """The error of a command run on a database without pgbroker, saying which database."""
    return CliError(
        f"pgbroker is not installed in {where} ({exc.message})",
        code=Exit.DATABASE,
        hint="Install the schema first: pgbroker install",
    )


def require_installed(broker: Broker) -> None:
    """NotInstalled, as the queue commands' first call raises it, for a command whose first
    statement would say only that a table is missing (keys), or that would start and fail later,
    request by request (serve)."""
    with broker.connection() as conn:
        if not is_installed(conn):
            raise NotInstalled('schema "pgbroker" does not exist')


def connect_hint(message: str) -> str:
    """What to check, for the message of a failed connection."""
    for pattern, hint in CONNECT_HINTS:
        found = pattern.search(message)
        if found:
            return hint.format(**found.groupdict())
    return (
        f"Is the server running, at that host and port? Check {WHERE_THE_DSN_COMES_FROM}; "
        "with neither, pgbroker uses its embedded PostgreSQL."
    )


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
            f"invalid DSN: {first_line(hide_passwords(str(exc), resolved))}",
            code=Exit.USAGE,
            hint="Use a URL (postgresql://user@host:5432/db) or key=value pairs (host=... dbname=...).",
        ) from None  # (not chained: as above)
    return make_conninfo(resolved, **connect_timeout_for(resolved, connect_timeout))
