"""The runtime's log lines: an event, then key=value pairs, on the ``pgbroker.worker`` logger that
queue and stream workers share (a log configuration names it). Each record also carries the event
and its fields as they are (``EVENT`` and ``FIELDS`` attributes), for a formatter that writes them
as data (the JSON lines of pgbroker._log_lines)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from pgbroker._log_lines import EVENT, FIELDS

__all__ = ["log_event", "log_failure", "on_bug"]

log = logging.getLogger("pgbroker.worker")


def log_event(level: int, event: str, **fields: object) -> None:
    """One log line: the event, then key=value pairs (values with spaces are JSON-quoted)."""
    if log.isEnabledFor(level):
        log.log(level, "%s %s", event, _pairs(fields), extra=_extra(event, fields))


def log_failure(event: str, failure: BaseException, /, **fields: object) -> None:
    """A warning's log line, as log_event writes it, with the failure's traceback below."""
    if log.isEnabledFor(logging.WARNING):
        log.warning("%s %s", event, _pairs(fields), exc_info=failure, extra=_extra(event, fields))


def on_bug(event: str, **fields: object) -> Callable[[asyncio.Task[Any]], None]:
    """A task's done callback that logs the exception it ended with at ERROR as ``event`` (the
    task's name, the fields, the traceback). The runtime's loops catch what they meet, so that is
    a bug; said at once, where it was swallowed at the stop while the process ran on without the
    loop."""

    def said(task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and (failure := task.exception()) is not None:
            named = {"task": task.get_name(), **fields}
            log.error("%s %s", event, _pairs(named), exc_info=failure, extra=_extra(event, named))

    return said


def _extra(event: str, fields: dict[str, object]) -> dict[str, object]:
    return {EVENT: event, FIELDS: fields}


def _pairs(fields: dict[str, object]) -> str:
    pairs = []
    for key, value in fields.items():
        text = str(value)
        plain = text and not any(c in text for c in ' "=\n')
        pairs.append(f"{key}={text if plain else json.dumps(text)}")
    return " ".join(pairs)
