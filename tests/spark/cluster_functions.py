"""A route function for the standalone cluster test: the message, with where it was routed (the
Python worker's working directory, which is its executor's, and where pgbroker was imported from)."""

from __future__ import annotations

import os
import sys
from typing import Any


def where_it_ran(message: Any) -> Any:
    import pgbroker

    return {**message, "cwd": os.getcwd(), "pgbroker": pgbroker.__file__, "sys_path": sys.path}
