"""The `pgbroker` command run as a real subprocess, as a shell script would: bound to one database
through --dsn, its output parsed, its errors checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

# Where the CLI would go without --dsn: nowhere. A test that forgot --dsn fails fast instead of
# starting the default embedded cluster.
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=2"


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": UNREACHABLE, **extra}


def run(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgbroker.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env or _env(),
        timeout=120,
        check=False,
    )


class Cli:
    """The CLI bound to one database through --dsn."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    def __call__(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return run("--dsn", self.dsn, *args, stdin=stdin)

    def ok(self, *args: str, stdin: str | None = None) -> str:
        res = self(*args, stdin=stdin)
        assert res.returncode == 0, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
        return res.stdout


def _ids(stdout: str) -> list[int]:
    return [int(line) for line in stdout.splitlines()]


def _messages(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def _assert_error(res: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert res.returncode == code, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    assert res.stderr.startswith("pgbroker: error: "), res.stderr
    assert "Traceback" not in res.stderr
    for fragment in fragments:
        assert fragment in res.stderr
