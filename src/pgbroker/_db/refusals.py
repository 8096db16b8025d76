"""Whether a failure to connect passes (the server down, starting up, out of connection slots, a
standby) or stays (a password refused, a database or role that does not exist), by the SQLSTATE of
the server's refusal, whatever the language of its message.

psycopg gives a failed connection no SQLSTATE (psycopg/psycopg#1188: libpq keeps the one the
server sent to itself), only libpq's message, whose server part is in the server's lc_messages:
`FATAL:  zu viele Verbindungen von Rolle »app«` from a German server. libpq writes the SQLSTATE
instead of the text when its error verbosity is PQERRORS_SQLSTATE, which psycopg does not wrap;
so the connection is tried once more with that verbosity, set through ctypes on psycopg's own
libpq (PGconn.pgconn_ptr is psycopg's door to the functions it does not wrap).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import time
from pathlib import Path

import psycopg
from psycopg import pq
from psycopg.pq.abc import PGconn

from pgbroker._db.liveness import is_read_only_server, ready_within

__all__ = ["CONNECTS_NOW", "passes", "refusal_sqlstate", "refusal_sqlstates"]

# successful_completion: the server took the connection when asked again.
CONNECTS_NOW = frozenset({"00000"})

_PQERRORS_SQLSTATE = 3  # libpq's PGVerbosity (libpq 12 and later)
# The line libpq writes for each server that refused, at that verbosity: "FATAL:  53300".
_SQLSTATE_LINE = re.compile(r":  ([0-9A-Z]{5})$", re.MULTILINE)
_DEFAULT_TIMEOUT = 10.0

# libpq's own words for a server it did not reach, or that it left (no SQLSTATE: no server answered
# with an error). libpq says them in English in a process that leaves LC_MESSAGES alone, as Python does.
_NOT_REACHED = re.compile(
    "|".join(
        (
            r"Connection refused",
            r'socket "[^"]*" failed: No such file or directory',  # the server is down
            r"Connection reset by peer",
            r"No route to host",
            r"Network is unreachable",
            r"timeout expired",
            r"server closed the connection unexpectedly",
            r"session is read-only",  # target_session_attrs=read-write and a standby not yet promoted
            r"server is in hot standby mode",
        )
    )
)
# The server's own words, in English, for a refusal that passes: only when its SQLSTATE cannot be had
# (refusal_sqlstates), since a server with another lc_messages says them otherwise.
_SERVER_PASSING = re.compile(
    "|".join(
        (
            r"the database system is (starting up|shutting down|in recovery mode"
            r"|not yet accepting connections|not accepting connections)",
            r"too many clients",
            r"too many connections for (role|database)",  # a CONNECTION LIMIT, reached for now
            r"remaining connection slots are reserved",
        )
    )
)
# SQLSTATEs of a refusal that passes: a connection exception (08), insufficient resources (53: out
# of connection slots, a role's or database's CONNECTION LIMIT, memory, disk), a shutdown (57P01,
# 57P02) or a server that cannot take connections now (57P03: starting up, shutting down, in
# recovery), a read-only server (25006); and 00000, connected when asked again.
_PASSING_CLASSES = ("00", "08", "53")
_PASSING_STATES = ("57P01", "57P02", "57P03", "25006")


def passes(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is a failure to reach the database that
    ends on its own, rather than a refusal that stays: by the SQLSTATE the server gave, whatever
    the language of its message; by libpq's words when no server answered."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, psycopg.OperationalError) and _passes(seen):
            return True
        if is_read_only_server(seen):
            return True
        seen = seen.__cause__
    return False


def _passes(error: psycopg.OperationalError) -> bool:
    if error.sqlstate:  # an error on a session that was made
        return _passing_state(error.sqlstate)
    message = str(error)
    if _NOT_REACHED.search(message):
        return True
    # A failed connection: psycopg has no SQLSTATE for it, the refusal is asked for its own.
    states = None if error.pgconn is None else refusal_sqlstates(error.pgconn)
    if states:
        return any(_passing_state(state) for state in states)
    return bool(_SERVER_PASSING.search(message))


def refusal_sqlstate(error: psycopg.Error) -> str | None:
    """The SQLSTATE of the server's refusal of the connection that failed with ``error``, asked
    for again (refusal_sqlstates) unless libpq's words say no server was reached; None when there
    is not exactly one (no server refused, several refused otherwise, it connects now)."""
    if error.pgconn is None or _NOT_REACHED.search(str(error)):
        return None
    states = refusal_sqlstates(error.pgconn)
    if states is None or len(states) != 1 or states == CONNECTS_NOW:
        return None
    return next(iter(states))


def _passing_state(sqlstate: str) -> bool:
    return sqlstate[:2] in _PASSING_CLASSES or sqlstate in _PASSING_STATES


def refusal_sqlstates(failed: PGconn) -> frozenset[str] | None:
    """The SQLSTATEs the servers give when the connection that failed (``Error.pgconn``) is tried
    again: one per server that refused it with an error, none if none did (it was never reached:
    libpq's own words then say why); CONNECTS_NOW if it succeeds now; None if it cannot tell (no
    libpq it can reach, or no answer in time)."""
    libpq = _psycopg_libpq()
    if libpq is None:
        return None
    options = {o.keyword.decode(): o.val for o in failed.info if o.val is not None}
    conninfo = b" ".join(f"{key}=".encode() + _quoted(value) for key, value in options.items())
    timeout = float(options.get("connect_timeout", b"0") or 0) or _DEFAULT_TIMEOUT
    message = _refused(libpq, conninfo, timeout)
    if message is None:
        return CONNECTS_NOW
    if not message:
        return None
    return frozenset(_SQLSTATE_LINE.findall(message))


def _refused(libpq: ctypes.CDLL, conninfo: bytes, timeout: float) -> str | None:
    """libpq's message at SQLSTATE verbosity for the connection tried once more ("" if it did not
    end within ``timeout``), None if it was made."""
    pgconn = pq.PGconn.connect_start(conninfo)
    try:
        if pgconn.status == pq.ConnStatus.BAD:
            return pgconn.error_message.decode(errors="replace")
        pointer: int | None = getattr(pgconn, "pgconn_ptr", None)  # not in psycopg's abstract PGconn
        if pointer is None:
            return ""
        libpq.PQsetErrorVerbosity(ctypes.c_void_p(pointer), _PQERRORS_SQLSTATE)
        deadline = time.monotonic() + timeout
        status: int = pq.PollingStatus.WRITING
        while status not in (pq.PollingStatus.OK, pq.PollingStatus.FAILED):
            left = deadline - time.monotonic()
            if left <= 0:
                return ""
            ready_within(pgconn.socket, left, for_writing=status != pq.PollingStatus.READING)
            status = pgconn.connect_poll()
        return None if status == pq.PollingStatus.OK else pgconn.error_message.decode(errors="replace")
    finally:
        pgconn.finish()


def _quoted(value: bytes) -> bytes:
    return b"'" + value.replace(b"\\", b"\\\\").replace(b"'", b"\\'") + b"'"


@functools.cache
def _psycopg_libpq() -> ctypes.CDLL | None:
    """The libpq psycopg's connections come from (the one its wheel bundles, or the system's),
    as loaded in this process: a pointer from one libpq must not go to another's functions."""
    try:
        maps = Path(f"/proc/{os.getpid()}/maps").read_text()
    except OSError:
        return None  # not Linux: no SQLSTATE, libpq's words alone say why
    loaded = {line.split()[-1] for line in maps.splitlines() if "/libpq" in line}
    if len(loaded) > 1:  # psycopg's wheel and the system's, say: the wheel's is psycopg's
        loaded = {path for path in loaded if "psycopg" in path} if pq.__impl__ == "binary" else set()
    if len(loaded) != 1:
        return None
    libpq = ctypes.CDLL(loaded.pop())
    libpq.PQsetErrorVerbosity.argtypes = [ctypes.c_void_p, ctypes.c_int]
    libpq.PQsetErrorVerbosity.restype = ctypes.c_int
    return libpq
