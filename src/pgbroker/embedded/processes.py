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


def _state(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name in parentheses may itself contain spaces and parentheses.
    return raw.rsplit(")", 1)[-1].split()[0]


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
    state = _state(pid)
    if state is None or state in ("Z", "X", "x"):
        return False
    try:
        cwd = os.stat(f"/proc/{pid}/cwd")
        ref = data_dir.stat()
    except OSError:
        # Gone, or another user's process: a postmaster we started would be readable.
        return False
    return (cwd.st_dev, cwd.st_ino) == (ref.st_dev, ref.st_ino)


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
        try:
            cwd = os.stat(entry / "cwd")
            if (cwd.st_dev, cwd.st_ino) != (ref.st_dev, ref.st_ino):
                continue
            if (entry / "comm").read_text().strip() not in ("postgres", "postmaster"):
                continue
            if _state(int(entry.name)) in ("Z", "X", "x"):
                continue
        except OSError:
            continue
        found.add(int(entry.name))
    return found
