"""A bound on the wait for the server's answer on the data source's blocking connections.

A hung server, a stuck pooler or a network that drops packets without a word leaves a call
waiting forever: statement_timeout cannot end it (the server may not be running the statement at
all), nor can TCP keepalives (a stopped backend's kernel still answers them). The threads of the
driver's source process that run for the whole query (lease renewals, releases) bound their
calls: past the bound the connection's socket is shut down, which wakes the call at once, and
the call fails as a lost connection (NoAnswer, as the asyncio clients' answered_within in
pgbroker._db.liveness), to be made again on a new connection (KeptConnection).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from pgbroker._db.liveness import NoAnswer
from pgbroker.errors import from_postgres
from pgbroker.spark.connect import Connection, open_connection, scalar


@contextmanager
def answered_within(conn: Connection, seconds: float) -> Iterator[None]:
    """Calls on ``conn`` inside fail with NoAnswer once ``seconds`` have passed without the
    block ending; the connection is then cut for good (close it)."""
    cut = _Cut(conn)
    timer = threading.Timer(seconds, cut.fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except psycopg.OperationalError as exc:
        if cut.fired:
            raise NoAnswer(seconds) from exc
        raise
    finally:
        timer.cancel()
        cut.disarm()


class _Cut:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._armed = True
        self.fired = False

    def fire(self) -> None:
        with self._lock:
            if not self._armed:
                return  # the call ended meanwhile
            self.fired = True
        try:
            sock = socket.socket(fileno=os.dup(self._conn.fileno()))
        except (OSError, psycopg.Error):
            return  # closed already: nothing waits on it
        with sock:
            # On a copy of the descriptor: the shutdown reaches the socket itself, and the call
            # waiting on it reads the end of the stream.
            sock.shutdown(socket.SHUT_RDWR)

    def disarm(self) -> None:
        with self._lock:
            self._armed = False


class KeptConnection:
    """The one connection a background thread makes its calls on, each bounded; made again on
    the call after one that failed."""

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
            with answered_within(self._conn, within):
                return scalar(self._conn, query, params)
        except psycopg.Error as exc:
            self.close()
            raise from_postgres(exc) from exc
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
