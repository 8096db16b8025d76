"""The argument types of the commands' options: whole numbers, seconds, durations, msg_ids."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _converted(text: str, convert: Callable[[str], T], expected: str) -> T:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _converted(text, int, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def whole_seconds(text: str) -> int:
    value = _converted(text, int, "whole seconds")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {value}")
    return value


def seconds(text: str) -> float:
    value = _converted(text, float, "seconds")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def positive_seconds(text: str) -> float:
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def positive_number(text: str) -> float:
    """A rate: a finite number > 0."""
    value = _converted(text, float, "a number")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def rate_limit(text: str) -> float:
    """Messages a second, 0 for no limit."""
    value = _converted(text, float, "a number")
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0 (0: no limit), got {text}")
    return value


def port(text: str) -> int:
    """A TCP port; 0 lets the system pick a free one."""
    value = _converted(text, int, "a port number")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {value}")
    return value


def msg_id(text: str) -> int:
    return _converted(text, int, "a msg_id (a whole number)")


def whole(text: str) -> int:
    if not re.fullmatch(r"\s*\d+\s*", text):
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> int:
    """Whole seconds from '90', '90s', '15m', '12h' or '7d'."""
    match = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a duration such as 30s, 15m, 12h or 7d, got {text!r}")
    return int(match[1]) * DURATION_UNITS[match[2]]


def positive_duration(text: str) -> int:
    value = duration(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a duration > 0, got {text!r}")
    return value

