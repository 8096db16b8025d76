"""`pgbroker bridge ...` processes as the bridge tests start them, and waiting on what they do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.paths import ROOT


def pgbroker(*args: str, dsn: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgbroker.cli", *args, "--dsn", dsn],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class BridgeProcess:
    """A `pgbroker bridge ...` process; stderr to a file (a pipe could fill and block it)."""

    def __init__(self, *args: str, dsn: str, logs: Path, env: dict[str, str]) -> None:
        self.log = logs / f"bridge-{time.monotonic_ns()}.err"
        with self.log.open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pgbroker.cli", *args, "--dsn", dsn, "-v"],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, **env},
            )

    def started(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the bridge exited {self.process.returncode}:\n{self.log.read_text()}")
        return "started" in self.log.read_text()

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        return code, self.log.read_text()


def wait_for(condition: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done after {timeout} s")
        time.sleep(0.1)
