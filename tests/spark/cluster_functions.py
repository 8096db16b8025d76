"""A route function for the standalone cluster test: the message, with where it was routed (the
Python worker's working directory, which is its executor's, and where pgbroker was imported from).

The first attempt to route message STALL_AT stops there, after writing the executor's directory to
<cluster>/stalled, until the test has killed that executor: so the kill lands in the middle of a
task that has sent part of its partition, in a transaction not committed yet. The attempt that
runs again finds the file and goes on.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

STALL_AT = 7_500  # in the second partition of the second batch (of 4,000), after its first 1,000
STALL_SECONDS = 60


def where_it_ran(message: Any) -> Any:
    import pgbroker

    if message.get("n") == STALL_AT:
        _stall_once()
    return {**message, "cwd": os.getcwd(), "pgbroker": pgbroker.__file__, "sys_path": sys.path}


def _stall_once() -> None:
    executor = Path.cwd()  # <cluster>/worker-N/<app>/<executor>
    marker = executor.parents[2] / "stalled"
    try:
        with marker.open("x") as out:
            out.write(str(executor))
    except FileExistsError:
        return
    deadline = time.monotonic() + STALL_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.1)
