"""What runs in a data directory: its postmaster.pid, whether that process is alive and ours, and
server processes a killed postmaster left behind (Linux: /proc).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PidFile", "is_our_postmaster", "orphans", "parse_pid_file"]


@dataclass(frozen=True)
class PidFile:
    pid: int
    port: int | None
    socket_dir: str | None
    state: str


def parse_pid_file(text: str) -> PidFile | None:
    # Line 1: pid; 4: port; 5: first socket directory; 8: state (PostgreSQL 10+). The file
    # grows line by line while the server starts, so later fields may be missing.
    lines = text.splitlines()
    if not lines or not lines[0].strip().isdigit():
        return None

    def field(i: int) -> str | None:
        return lines[i].strip() if len(lines) > i and lines[i].strip() else None

    port = field(3)
    return PidFile(
        pid=int(lines[0].strip()),
        port=int(port) if port and port.isdigit() else None,
        socket_dir=field(4),
        state=field(7) or "starting",
    )


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The command name in parentheses may itself contain spaces and parentheses.
    return raw.rsplit(")", 1)[-1].split()[0] not in ("Z", "X", "x")


def _works_in(pid: int, ref: os.stat_result) -> bool:
    """Whether the working directory of ``pid`` is the directory ``ref`` describes."""
    cwd = os.stat(f"/proc/{pid}/cwd")
    return (cwd.st_dev, cwd.st_ino) == (ref.st_dev, ref.st_ino)


def is_our_postmaster(pid: int, data_dir: Path) -> bool:
    """Whether ``pid`` is a live process working in ``data_dir`` (not a zombie, not a reused PID)."""
    if pid <= 0:
        return False
    if not Path("/proc/self").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if not _running(pid):
        return False
    try:
        return _works_in(pid, data_dir.stat())
    except OSError:
        # Gone, or another user's process: a postmaster we started would be readable.
        return False


def orphans(data_dir: Path) -> set[int]:
    """Live server processes working in ``data_dir`` (Linux only: /proc)."""
    proc = Path("/proc")
    if not (proc / "self").exists():
        return set()
    try:
        ref = data_dir.stat()
    except OSError:
        return set()
    me = os.getpid()
    found: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        try:
            if not _works_in(pid, ref):
                continue
            if (entry / "comm").read_text().strip() not in ("postgres", "postmaster"):
                continue
        except OSError:
            continue
        if _running(pid):
            found.add(pid)
    return found
