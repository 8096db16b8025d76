"""``pgbroker serve`` as the user runs it: the real CLI in a child process, uvicorn on a free
loopback port, the test's database. For the tests that need a real socket (the browser, the
schemathesis run, the CLI's shutdown)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.processes import stop_gracefully


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class LiveServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        """What the server wrote to stdout and stderr so far."""
        return self.log_path.read_text(errors="replace")


@contextmanager
def pgbroker_serve(dsn: str, *options: str) -> Iterator[LiveServer]:
    """Start ``pgbroker --dsn DSN serve --port P OPTIONS``, wait until /healthz answers, and stop
    it with SIGTERM afterwards (killing it only if it does not exit)."""
    port = free_port()
    argv = [sys.executable, "-m", "pgbroker.cli", "--dsn", dsn, "serve", "--port", str(port), *options]
    log_dir = Path(tempfile.mkdtemp(prefix="pgbroker-serve-"))
    log_path = log_dir / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None:
                raise RuntimeError(
                    f"pgbroker serve exited with {process.returncode} before answering:\n"
                    + log_path.read_text(errors="replace")
                )
            if time.monotonic() > deadline:
                raise RuntimeError("pgbroker serve did not answer /healthz within 30 s")
            time.sleep(0.1)
        yield LiveServer(url, process, log_path)
    finally:
        stop_gracefully(process, 15)
        shutil.rmtree(log_dir, ignore_errors=True)
