"""The runtime's log lines: an event, then key=value pairs, on the ``pgbroker.worker`` logger that
queue and stream workers share (a log configuration names it)."""

from __future__ import annotations

import json
import logging

__all__ = ["log_event"]

log = logging.getLogger("pgbroker.worker")


def log_event(level: int, event: str, **fields: object) -> None:
    """One log line: the event, then key=value pairs (values with spaces are JSON-quoted)."""
    if log.isEnabledFor(level):
        pairs = []
        for key, value in fields.items():
            text = str(value)
            plain = text and not any(c in text for c in ' "=\n')
            pairs.append(f"{key}={text if plain else json.dumps(text)}")
        log.log(level, "%s %s", event, " ".join(pairs))
