"""JSON the commands read from arguments and standard input, as strict as jsonb (no NaN)."""

from __future__ import annotations

import json
from typing import Any

from pgbroker.cli.support.errors import CliError, Exit


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads(text: str) -> Any:
    # json accepts NaN and Infinity, which PostgreSQL's jsonb rejects: refuse them here, where
    # the line number is known.
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        # The decoder recurses per level: a value nested a few thousand deep was 'a bug in
        # pgbroker' (exit 70), where it is the input's.
        raise ValueError("nested too deeply to read; flatten it") from None


def json_problem(exc: ValueError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at column {exc.colno}"
    return str(exc)


def json_argument(text: str, what: str) -> Any:
    try:
        return loads(text)
    except ValueError as exc:
        raise CliError(
            f"{what} is not valid JSON ({json_problem(exc)})",
            code=Exit.USAGE,
            hint="Quote it for the shell, for example '{\"order\": 1}' or '\"text\"'.",
        ) from None
