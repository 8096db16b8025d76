"""Connections from Spark's driver and executors to Postgres, and the queue tables they read.

Each reader or writer opens its own connection inside the method Spark calls (a connection
cannot be pickled and shipped to an executor), with the session settings that the CSV exchange
with Arrow relies on: timestamps in UTC, ISO format.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from pgbroker import _sql
from pgbroker._db.dsn import connection_kwargs
from pgbroker.errors import PgbrokerError, from_postgres

Connection = psycopg.Connection[tuple[Any, ...]]

APPLICATION_NAME = "pgbroker-spark"
CONNECT_TIMEOUT_SECONDS = 10
# How a failed connect begins its message (a job tells it from its own failures by it).
CANNOT_CONNECT = "pgbroker data source cannot connect to the database"


def open_connection(dsn: str, *, role: str) -> Connection:
    """An autocommit connection, set up for the connector; the caller closes it.

    ``role`` names the connection in pg_stat_activity (application_name), so that an
    operator can tell a Spark reader from a writer.
    """
    extra: dict[str, Any] = connection_kwargs()
    params = conninfo_to_dict(dsn)
    if "connect_timeout" not in params:
        extra["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    if "application_name" not in params:
        extra["application_name"] = f"{APPLICATION_NAME} {role}"
    try:
        conn = psycopg.connect(dsn, autocommit=True, **extra)
    except psycopg.OperationalError as exc:
        raise PgbrokerError(
            f"{CANNOT_CONNECT}: {str(exc).strip()}",
            hint="Check option dsn (or DATABASE_URL); every executor must reach that server.",
        ) from exc
    try:
        conn.execute(_sql.queries("spark")["spark_session_utc"])
        conn.execute(_sql.queries("spark")["spark_session_iso_dates"])
    except psycopg.Error as exc:
        conn.close()
        raise from_postgres(exc) from exc
    return conn


@contextmanager
def connect(dsn: str, *, role: str) -> Iterator[Connection]:
    """A connection for one task or call, closed after; errors from Postgres come out as
    PgbrokerError (with their SQLSTATE's class)."""
    conn = open_connection(dsn, role=role)
    try:
        with conn:
            yield conn
    except psycopg.Error as exc:
        raise from_postgres(exc) from exc


def queue_table(conn: Connection, queue: str, *, archive: bool = False) -> str:
    """The table name (in schema pgmq) of a queue or its archive; QueueNotFound names the fix."""
    row = conn.execute(
        _sql.queries("spark")["spark_queue_table"], (queue, "a" if archive else "q")
    ).fetchone()
    assert row is not None
    return str(row[0])


def table_ident(table: str) -> sql.Composable:
    return sql.Identifier("pgmq", table)


def scalar(conn: Connection, query: sql.Composable | str, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    return None if row is None else row[0]
