"""CPU seconds spent by a local PostgreSQL server, all its processes together: a cost per job that,
unlike a rate, holds on a loaded machine (it counts the server's work, not the time it waited).

Read from /proc: the postmaster's own CPU and that of its children already gone (cutime, cstime),
plus every live child's. None where the server is not a local process this user may read (a remote
DSN, another OS)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psycopg

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    return text[text.rindex(")") + 2 :].split()


def _ticks(fields: list[str], *, reaped: bool) -> int:
    # Fields from the state on (3rd of stat(5)): utime 14, stime 15, cutime 16, cstime 17.
    own = int(fields[11]) + int(fields[12])
    return own + (int(fields[13]) + int(fields[14]) if reaped else 0)


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds a process has used so far (user and system; None: gone, or no /proc)."""
    fields = _stat(pid)
    return None if fields is None else _ticks(fields, reaped=False) / _TICKS


def postmaster_pid(dsn: str) -> int | None:
    """The server's postmaster, as the parent of a backend of ours (None: not on this machine)."""
    with contextlib.suppress(psycopg.Error), psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        fields = _stat(int(row[0])) if row else None
        return int(fields[1]) if fields else None
    return None


def server_cpu_seconds(postmaster: int | None) -> float | None:
    """CPU seconds the server has used so far, its processes gone and live together."""
    if postmaster is None:
        return None
    top = _stat(postmaster)
    if top is None:
        return None
    ticks = _ticks(top, reaped=True)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) and int(fields[1]) == postmaster:
            ticks += _ticks(fields, reaped=False)
    return ticks / _TICKS
