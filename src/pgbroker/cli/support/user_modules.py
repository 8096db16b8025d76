"""The user's modules the commands import (a worker's handlers, --codec-module): found in the
current directory first, as `python -m` would find them, since they usually live beside where the
command is started; an installed console script does not put that directory on the path."""

from __future__ import annotations

import os
import sys


def importable_from_cwd() -> None:
    """Put the current directory first on the import path (once)."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
