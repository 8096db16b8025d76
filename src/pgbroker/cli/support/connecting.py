"""Connecting a command to its database: one autocommit connection, with a usage error for a
bad DSN and a hint for each reason a connection fails."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgbroker._db.dsn import connection_kwargs, resolve_dsn
from pgbroker._db.wakeups import conninfo_of
from pgbroker.cli.support.errors import CliError, Exit, first_line
from pgbroker.queues._client import Broker

# Connecting to a host that drops packets would otherwise hang for minutes.
CONNECT_TIMEOUT_SECONDS = 10

WHERE_THE_DSN_COMES_FROM = "the DSN (--dsn, else DATABASE_URL)"

# What libpq's message says went wrong, and what to do about it; the first match wins. The server
# answered for all but the last: asking whether it runs would send the user the wrong way.
CONNECT_HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r'role "(?P<name>[^"]*)" does not exist'),
        'The server has no role "{name}": check the user in ' + WHERE_THE_DSN_COMES_FROM
        + ", or create the role (CREATE ROLE ... LOGIN).",
    ),
    (
        re.compile(r'database "(?P<name>[^"]*)" does not exist'),
        'The server has no database "{name}": check its name in ' + WHERE_THE_DSN_COMES_FROM
        + ", or create the database (createdb).",
    ),
    (
        re.compile(r"authentication failed|no password supplied|pg_hba\.conf"),
        "The server refused the login: check the user and password (in the DSN, $PGPASSWORD or "
        "~/.pgpass) and the server's pg_hba.conf.",
    ),
)


@contextmanager
def connected(dsn: str | None) -> Iterator[Broker]:
    """A Broker on one autocommit connection: a CLI call runs a few statements, then exits."""
    resolved = resolve_dsn(dsn)
    try:
        options = conninfo_to_dict(resolved)
    except psycopg.ProgrammingError as exc:
        raise CliError(
            f"invalid DSN: {first_line(str(exc))}",
            code=Exit.USAGE,
            hint="Use a URL (postgresql://user@host:5432/db) or key=value pairs (host=... dbname=...).",
        ) from exc
    extra: dict[str, Any] = connection_kwargs()
    if "connect_timeout" not in options and "PGCONNECT_TIMEOUT" not in os.environ:
        extra["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    if "application_name" not in options and "PGAPPNAME" not in os.environ:
        extra["application_name"] = "pgbroker-cli"
    try:
        conn = psycopg.connect(resolved, autocommit=True, **extra)
    except psycopg.OperationalError as exc:
        message = first_line(str(exc))
        raise CliError(
            f"cannot connect to the database: {message}", code=Exit.DATABASE, hint=connect_hint(message)
        ) from exc
    with conn:
        yield Broker(connection=conn)


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


def dsn_of(broker: Broker) -> str:
    """The conninfo the broker's connection used, for a command that opens its own pool (a
    server, a worker, a bridge) on the same database."""
    with broker.connection() as conn:
        return conninfo_of(conn.info)

