"""Real transient faults for the watchdog tests of the long-running loops: a table locked by a
maintenance transaction while the loop runs as a role with a short lock_timeout (its calls fail
with 55P03, as under a real ALTER, VACUUM FULL or partition maintenance), every session of
the loop's database terminated (as a restart or a failover cuts them), and the loop's sessions
frozen (as a hung server, a stuck pooler or a network dropping packets without a word leaves
them: connected, never answering); and which session is a client's LISTEN connection, to
terminate it alone."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

# A lock_timeout short enough that a held lock fails the loop's calls at once.
IMPATIENT_MS = 200


def impatient(dsn: str) -> str:
    """The DSN of a session that gives up on a lock after IMPATIENT_MS."""
    return make_conninfo(dsn, options=f"-c lock_timeout={IMPATIENT_MS}")


@contextmanager
def table_locked(dsn: str, table: str) -> Iterator[None]:
    """``table`` (schema-qualified) held in ACCESS EXCLUSIVE mode by another session while inside."""
    locked, release = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def maintain() -> None:
        try:
            with psycopg.connect(dsn) as maintenance:
                maintenance.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
                locked.set()
                release.wait(300)
        except BaseException as exc:
            failed.append(exc)
            locked.set()

    holder = threading.Thread(target=maintain, daemon=True)
    holder.start()
    assert locked.wait(60), f"could not lock {table}"
    assert not failed, failed
    try:
        yield
    finally:
        release.set()
        holder.join(60)


def terminate_sessions(dsn: str) -> int:
    """Terminate every other session of the DSN's database, and wait until they are gone (a
    terminated session ends a moment after the signal); returns how many."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pids = [
            pid
            for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            ).fetchall()
        ]
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        deadline = time.monotonic() + 60
        left = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)"
        while conn.execute(left, (pids,)).fetchone() != (0,):
            assert time.monotonic() < deadline, "terminated sessions did not end"
            time.sleep(0.02)
    return len(pids)


def listener_pid(conn: psycopg.Connection[Any], exclude: int | None = None, timeout: float = 10.0) -> int:
    """The backend pid of the (only) pgbroker listener of this database, waiting for it to appear."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND query LIKE 'LISTEN %%' AND pid <> pg_backend_pid() AND pid IS DISTINCT FROM %s",
            [exclude],
        ).fetchone()
        if row is not None:
            return int(row[0])
        time.sleep(0.05)
    raise AssertionError("no listener connection")


# The application_name of a loop's sessions that sessions_frozen freezes (the test's own go on).
FROZEN_APP = "pgbroker-frozen"


def freezable(dsn: str) -> str:
    """The DSN of a loop whose sessions sessions_frozen can find."""
    return make_conninfo(dsn, application_name=FROZEN_APP)


def sessions_open(dsn: str, count: int) -> None:
    """Wait until ``count`` sessions of a ``freezable`` DSN are open (60 s at most): a pool opens its
    connections beyond the first in the background."""
    deadline = time.monotonic() + 60
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (FROZEN_APP,)
            ).fetchone()
            if row is not None and row[0] >= count:
                return
            assert time.monotonic() < deadline, f"{count} sessions of the pool never opened"
            time.sleep(0.05)


@contextmanager
def sessions_frozen(dsn: str, *, between_statements: bool = False) -> Iterator[list[int]]:
    """Every session of a ``freezable`` DSN open now stopped with SIGSTOP while inside (their
    pids), and let go on the way out. The server runs on this machine (the tests' own clusters).

    between_statements: each session stopped while it waits for its next command outside a
    transaction, so that it holds no lock (a session stopped inside a statement keeps the locks of
    its tables for as long as the hang lasts, which a test of what else goes on must not meet):
    stopped, checked, and let go and stopped again until it is so."""
    frozen: list[int] = []
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (FROZEN_APP,)
            ).fetchall()
            # A stopped backend's state is the last it reported: 'idle' only while it waits for a
            # command with no transaction open.
            busy = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND state <> 'idle'"
            deadline = time.monotonic() + 60
            while True:
                for (pid,) in rows:
                    os.kill(pid, signal.SIGSTOP)
                    frozen.append(pid)
                if not between_statements or conn.execute(busy, (frozen,)).fetchone() == (0,):
                    break
                assert time.monotonic() < deadline, "the sessions were never all between statements"
                _thaw(frozen)
                frozen.clear()
                time.sleep(0.01)
        yield frozen
    finally:
        _thaw(frozen)


@contextmanager
def pids_frozen(pids: list[int]) -> Iterator[None]:
    """The sessions ``pids`` (of the tests' own clusters) stopped with SIGSTOP while inside."""
    frozen: list[int] = []
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)
        yield
    finally:
        _thaw(frozen)


def _thaw(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
