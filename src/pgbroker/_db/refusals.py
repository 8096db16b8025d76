"""The SQLSTATE of a connection the server refused, whatever the language of its message.

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
import select
import time
from pathlib import Path

from psycopg import pq
from psycopg.pq.abc import PGconn

__all__ = ["CONNECTS_NOW", "refusal_sqlstates"]

# successful_completion: the server took the connection when asked again.
CONNECTS_NOW = frozenset({"00000"})

_PQERRORS_SQLSTATE = 3  # libpq's PGVerbosity (libpq 12 and later)
# The line libpq writes for each server that refused, at that verbosity: "FATAL:  53300".
_SQLSTATE_LINE = re.compile(r":  ([0-9A-Z]{5})$", re.MULTILINE)
_DEFAULT_TIMEOUT = 10.0


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
            reading = status == pq.PollingStatus.READING
            select.select([pgconn.socket] if reading else [], [] if reading else [pgconn.socket], [], left)
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
