"""How a process of pgbroker writes its lines on stderr: text (``pgbroker: event key=value ...``,
the default) or JSON lines (``--log-format json``, or ``$PGBROKER_LOG_FORMAT``), one object a line
for a log pipeline: time, level, logger, the event and its fields as values, the message, and a
traceback where there is one. Log records take the format set_up() gives the root logger; the
lines a command shows whatever the verbosity (its start, its error) go through say()."""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime

from pgbroker.errors import InvalidArgument

__all__ = [
    "EVENT",
    "FIELDS",
    "LOG_FORMATS",
    "LOG_FORMAT_ENV",
    "TEXT_FORMAT",
    "JsonLines",
    "chosen_format",
    "log_event_on",
    "say",
    "set_up",
    "writes_json",
]

LOG_FORMATS = ("text", "json")
# The format when the command line names none.
LOG_FORMAT_ENV = "PGBROKER_LOG_FORMAT"
# The text lines, in the command and in the worker processes it starts.
TEXT_FORMAT = "pgbroker: %(message)s"
# The attributes of a log record that hold its event's name and fields (logging's ``extra``;
# the runtime's log_event sets them).
EVENT = "pgbroker_event"
FIELDS = "pgbroker_fields"

# Whether this process writes JSON lines (set_up's choice; logging's own configuration is
# process-wide too).
_json_lines = False


class JsonLines(logging.Formatter):
    """A record as one JSON object on one line (non-ASCII and control characters escaped, so that
    a line stays one line and never reaches a terminal raw)."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = getattr(record, FIELDS, {})
        traceback = self.formatException(record.exc_info) if record.exc_info else None
        return _line(
            record.created,
            record.levelname.lower(),
            record.name,
            getattr(record, EVENT, None),
            fields,
            record.getMessage(),
            traceback,
        )


def _line(
    created: float,
    level: str,
    logger: str,
    event: str | None,
    fields: dict[str, object],
    message: str,
    traceback: str | None = None,
) -> str:
    entry: dict[str, object] = {
        "time": datetime.fromtimestamp(created, UTC).isoformat(timespec="microseconds"),
        "level": level,
        "logger": logger,
    }
    if event is not None:
        entry["event"] = event
    for key, value in fields.items():
        entry.setdefault(key, _value(value))
    entry["message"] = message
    if traceback is not None:
        entry["exception"] = traceback
    return json.dumps(entry)


def _value(value: object) -> object:
    """A field as JSON has it: numbers, booleans and null as they are, anything else as its text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def log_event_on(
    logger: logging.Logger,
    level: int,
    event: str,
    fields: dict[str, object],
    failure: BaseException | None = None,
) -> None:
    """One log line on ``logger``: the event, then key=value pairs (values with spaces are
    JSON-quoted), with ``failure``'s traceback below if given; the record carries the event and
    its fields as they are (EVENT, FIELDS), for the JSON lines."""
    if logger.isEnabledFor(level):
        extra = {EVENT: event, FIELDS: fields}
        logger.log(level, "%s %s", event, _pairs(fields), exc_info=failure, extra=extra)


def _pairs(fields: dict[str, object]) -> str:
    pairs = []
    for key, value in fields.items():
        text = str(value)
        plain = text and not any(c in text for c in ' "=\n')
        pairs.append(f"{key}={text if plain else json.dumps(text)}")
    return " ".join(pairs)


def chosen_format(given: str | None) -> str:
    """The log format asked for: ``given`` (--log-format), else $PGBROKER_LOG_FORMAT, else text."""
    name = given or os.environ.get(LOG_FORMAT_ENV) or "text"
    if name not in LOG_FORMATS:
        raise InvalidArgument(f"${LOG_FORMAT_ENV} must be one of {', '.join(LOG_FORMATS)}, got {name!r}")
    return name


def set_up(level: int, log_format: str) -> None:
    """Log at ``level`` and above on stderr, in ``log_format`` (one of LOG_FORMATS); say() follows."""
    global _json_lines
    _json_lines = log_format == "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines() if _json_lines else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler])


def writes_json() -> bool:
    """Whether this process writes JSON lines."""
    return _json_lines


def say(text: str, *, event: str, level: str = "info", **fields: object) -> None:
    """A line shown whatever the verbosity (a command's start, its error), on stderr: ``pgbroker:
    text``, or under JSON lines one object with the event and the fields."""
    if _json_lines:
        line = _line(datetime.now(UTC).timestamp(), level, "pgbroker", event, fields, text)
    else:
        line = f"pgbroker: {text}"
    print(line, file=sys.stderr, flush=True)
