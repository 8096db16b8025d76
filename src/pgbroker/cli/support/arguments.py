"""The argument types of the commands' options: whole numbers, durations, msg_ids."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import TypeVar

from pgbroker.queues._arguments import INTEGER_MAX

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


# Every option that takes a length of time (a delay, a lease, a wait, a timeout, a retention) takes
# it in one of these forms, parsed here alone. The value is exact (a Fraction) until it is
# rounded: the options whose value the engine keeps in whole seconds (an SQL integer: a send's
# delay, a lease, a retention, a window) round a fraction up, so that nothing becomes visible,
# expires or is dropped sooner than asked; pgbroker --help says so (parsers.EPILOG).
DURATION_UNITS = {
    "ms": Fraction(1, 1000),
    "": Fraction(1),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
    "d": Fraction(86400),
}
DURATION_FORMS = "seconds (30, 1.5) or a number with a unit (500ms, 30s, 5m, 2h, 7d)"
_DURATION = re.compile(r"\s*(?P<number>[-+]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?P<unit>ms|s|m|h|d|)\s*")


def _duration(text: str) -> Fraction:
    """Seconds >= 0 from one of DURATION_FORMS."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a duration: {DURATION_FORMS}, got {text!r}")
    value = Fraction(match["number"]) * DURATION_UNITS[match["unit"]]
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a duration >= 0, got {text}")
    return value


def _positive(value: Fraction, text: str) -> Fraction:
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a duration > 0, got {text}")
    return value


def _whole(value: Fraction, text: str) -> int:
    whole_value = math.ceil(value)
    if whole_value > INTEGER_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {INTEGER_MAX} seconds (68 years), got {text}")
    return whole_value


def seconds(text: str) -> float:
    """A duration >= 0, in seconds (a wait, a timeout kept by this process)."""
    return float(_duration(text))


def positive_seconds(text: str) -> float:
    """A duration > 0, in seconds."""
    return float(_positive(_duration(text), text))


def whole_seconds(text: str) -> int:
    """A duration >= 0 the engine keeps in whole seconds: a fraction rounded up."""
    return _whole(_duration(text), text)


def positive_whole_seconds(text: str) -> int:
    """A duration > 0 the engine keeps in whole seconds: a fraction rounded up (500ms: 1)."""
    return _whole(_positive(_duration(text), text), text)
