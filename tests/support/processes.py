"""Stopping the child processes the tests and benchmarks start, and finding a worker supervisor's."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def stop_gracefully(process: subprocess.Popen[Any], grace: float) -> None:
    """SIGTERM, so that the process shuts down as in production; SIGKILL if it has not exited
    within ``grace`` seconds (a hang then shows as a kill, not as a run that never ends)."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def worker_processes(supervisor: int) -> set[int]:
    """The pids of the worker processes ``supervisor`` (`pgbroker worker --processes N`) spawned
    (Linux: from /proc; multiprocessing's resource tracker aside)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if parent == supervisor and b"spawn_main" in command:
            found.add(int(stat.parent.name))
    return found
