"""The long-lived background tasks of the long-running commands (a refusal watch, a heartbeat, a
history sampler, a lease keeper): what they end with is said at once.

Such a task catches what it expects to meet; anything else ends it, and asyncio keeps the exception
until someone awaits the task, which for these is the stop: the process ran on without the task,
and without a word. ``said_if_failed`` is the done callback that says it at ERROR, with the
traceback, the moment the task ends; ``restarting`` runs a task that matters (it alone says or does
something) again after such an end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pgbroker._log_lines import log_event_on

__all__ = ["LONGEST_PAUSE", "restarting", "said_if_failed"]

# The longest pause before a task that keeps failing is run again (restarting).
LONGEST_PAUSE = 60.0


def said_if_failed(
    logger: logging.Logger, event: str, **fields: object
) -> Callable[[asyncio.Task[Any]], None]:
    """A task's done callback that logs the exception it ended with (not a cancellation) at ERROR
    on ``logger`` as ``event``, with the task's name, the fields and the traceback."""

    def said(task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and (failure := task.exception()) is not None:
            log_event_on(logger, logging.ERROR, event, {"task": task.get_name(), **fields}, failure)

    return said


async def restarting(
    run: Callable[[], Awaitable[None]], logger: logging.Logger, event: str, pause: float, **fields: object
) -> None:
    """``run()`` until it returns or is cancelled; each time it fails, said at ERROR on ``logger`` as
    ``event`` (the fields, ``restart_in``, the traceback), and run again after ``pause`` seconds,
    doubled after each failure up to LONGEST_PAUSE (a failure that stays is not said every few
    seconds)."""
    while True:
        try:
            await run()
            return
        except Exception as failure:
            log_event_on(logger, logging.ERROR, event, {**fields, "restart_in": pause}, failure)
        await asyncio.sleep(pause)
        pause = min(2 * pause, max(pause, LONGEST_PAUSE))
