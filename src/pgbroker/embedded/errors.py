"""The embedded cluster's one exception, and how a failed command's output goes into its message."""

from __future__ import annotations

import subprocess

__all__ = ["EmbeddedError", "command_output"]


class EmbeddedError(Exception):
    """The embedded cluster cannot be found, started or reached; the message says how to fix it."""


def command_output(res: subprocess.CompletedProcess[str]) -> str:
    return ((res.stderr or "") + (res.stdout or "")).strip() or "(no output)"
