"""The runtime's log lines: an event, then key=value pairs, on the ``pgbroker.worker`` logger that
queue and stream workers share (a log configuration names it). Each record also carries the event
and its fields as they are (``EVENT`` and ``FIELDS`` attributes), for a formatter that writes them
as data (the JSON lines of pgbroker._log_lines)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from pgbroker._background import said_if_failed
from pgbroker._log_lines import log_event_on

__all__ = ["log_event", "log_failure", "on_bug"]

log = logging.getLogger("pgbroker.worker")


def log_event(level: int, event: str, **fields: object) -> None:
    """One log line: the event, then key=value pairs (values with spaces are JSON-quoted)."""
    log_event_on(log, level, event, fields)


def log_failure(event: str, failure: BaseException, /, **fields: object) -> None:
    """A warning's log line, as log_event writes it, with the failure's traceback below."""
    log_event_on(log, logging.WARNING, event, fields, failure)


def on_bug(event: str, **fields: object) -> Callable[[asyncio.Task[Any]], None]:
    """A task's done callback that logs the exception it ended with at ERROR as ``event``
    (pgbroker._background.said_if_failed). The runtime's loops catch what they meet, so that is a
    bug; said at once, where it was swallowed at the stop while the process ran on without the loop."""
    return said_if_failed(log, event, **fields)
