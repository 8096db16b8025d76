"""Stopping the child processes the tests and benchmarks start."""

from __future__ import annotations

import subprocess
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
