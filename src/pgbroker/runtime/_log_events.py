"""The runtime's log lines: an event, then key=value pairs, on the ``pgbroker.worker`` logger that
queue and stream workers share (a log configuration names it)."""

from __future__ import annotations

import json
import logging

__all__ = ["log_event", "log_failure"]

log = logging.getLogger("pgbroker.worker")


def log_event(level: int, event: str, **fields: object) -> None:
    """One log line: the event, then key=value pairs (values with spaces are JSON-quoted)."""
    if log.isEnabledFor(level):
        log.log(level, "%s %s", event, _pairs(fields))


def log_failure(event: str, failure: BaseException, /, **fields: object) -> None:
    """A warning's log line, as log_event writes it, with the failure's traceback below."""
    if log.isEnabledFor(logging.WARNING):
        log.warning("%s %s", event, _pairs(fields), exc_info=failure)


def _pairs(fields: dict[str, object]) -> str:
    pairs = []
    for key, value in fields.items():
        text = str(value)
        plain = text and not any(c in text for c in ' "=\n')
        pairs.append(f"{key}={text if plain else json.dumps(text)}")
    return " ".join(pairs)
