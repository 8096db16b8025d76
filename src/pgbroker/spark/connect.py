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
from pgbroker._credentials import hide_passwords
from pgbroker._db.dsn import connection_kwargs
from pgbroker._db.liveness import cut_if_unanswered
from pgbroker._db.refusals import refusal_sqlstate
from pgbroker.errors import PgbrokerError
from pgbroker.spark.bounded import answering_cursors
from pgbroker.spark.sqlstate_marker import database_error, mark

Connection = psycopg.Connection[tuple[Any, ...]]

APPLICATION_NAME = "pgbroker-spark"
CONNECT_TIMEOUT_SECONDS = 10
# How a failed connect begins its message (a job tells it from its own failures by it).
CANNOT_CONNECT = "pgbroker data source cannot connect to the database"


def open_connection(dsn: str, *, role: str, answer_within: float | None = None) -> Connection:
    """An autocommit connection, set up for the connector; the caller closes it.

    ``role`` names the connection in pg_stat_activity (application_name), so that an
    operator can tell a Spark reader from a writer. With ``answer_within``, every statement on it
    fails as a lost connection when the server has not answered in that many seconds
    (pgbroker.spark.bounded); the connection is then cut.
    """
    extra: dict[str, Any] = connection_kwargs()
    try:
        params = conninfo_to_dict(dsn)
        if "connect_timeout" not in params:
            extra["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
        if "application_name" not in params:
            extra["application_name"] = f"{APPLICATION_NAME} {role}"
        conn = psycopg.connect(dsn, autocommit=True, **extra)
        if answer_within is not None:
            conn.cursor_factory = answering_cursors(answer_within)
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        # Not chained: libpq's own words may quote a password it misread (pgbroker._credentials).
        # The refusal's SQLSTATE tells the job one that passes (53300: no connection slot left).
        refused = mark(f"{CANNOT_CONNECT}: {hide_passwords(str(exc).strip(), dsn)}", refusal_sqlstate(exc))
        raise PgbrokerError(
            refused,
            hint="Check option dsn (or DATABASE_URL); every executor must reach that server.",
        ) from None
    try:
        conn.execute(_sql.queries("spark")["spark_session_utc"])
        conn.execute(_sql.queries("spark")["spark_session_iso_dates"])
    except psycopg.Error as exc:
        conn.close()
        raise database_error(exc) from exc
    return conn


@contextmanager
def connect(dsn: str, *, role: str, answer_within: float | None = None) -> Iterator[Connection]:
    """A connection for one task or call, closed after; errors from Postgres come out as
    PgbrokerError (with their SQLSTATE's class; a DatabaseError's marked, sqlstate_marker)."""
    conn = open_connection(dsn, role=role, answer_within=answer_within)
    try:
        with conn:
            yield conn
    except psycopg.Error as exc:
        raise database_error(exc) from exc


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


class KeptConnection:
    """The one connection a background thread makes its calls on, each answered within a bound
    (pgbroker.spark.bounded); made again on the call after one that failed."""

    def __init__(self, dsn: str, role: str) -> None:
        self.dsn = dsn
        self.role = role
        self._conn: Connection | None = None

    @property
    def backend_pid(self) -> int | None:
        conn = self._conn
        return conn.info.backend_pid if conn is not None and not conn.closed else None

    def open(self) -> None:
        if self._conn is None or self._conn.closed:
            self.close()
            self._conn = open_connection(self.dsn, role=self.role)

    def scalar(self, query: sql.Composable | str, params: tuple[Any, ...], *, within: float) -> Any:
        """The first column of the first row of ``query``; PgbrokerError (ConnectionLost when the
        server did not answer within ``within`` seconds) after closing the connection."""
        try:
            self.open()
            assert self._conn is not None
            with cut_if_unanswered(self._conn, within):
                return scalar(self._conn, query, params)
        except psycopg.Error as exc:
            self.close()
            raise database_error(exc) from exc
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
