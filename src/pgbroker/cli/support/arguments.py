"""The argument types of the commands' options: whole numbers, durations, msg_ids."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import TypeVar

from pgbroker._durations import DURATION_FORMS, DURATION_UNITS, duration, positive, positive_seconds, seconds
from pgbroker.queues._arguments import INTEGER_MAX

__all__ = [
    "DURATION_FORMS",
    "DURATION_UNITS",
    "RoundedUp",
    "connect_seconds",
    "msg_id",
    "port",
    "positive_int",
    "positive_number",
    "positive_seconds",
    "positive_whole_seconds",
    "rate_limit",
    "seconds",
    "whole",
    "whole_seconds",
]

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
# it in one of DURATION_FORMS, parsed by pgbroker._durations alone (the Spark jobs' options too).
# The options whose value the engine keeps in whole seconds (an SQL integer: a send's delay, a
# lease, a retention, a window) round a fraction up, so that nothing becomes visible, expires or is
# dropped sooner than asked; pgbroker --help says so (parsers.EPILOG).


class RoundedUp(int):
    """Whole seconds rounded up from the fraction given (``given``, as typed): the command says
    what it kept (cli.support.running), so that 500ms taken as 1 s is seen, not only in --help."""

    given: str

    def __new__(cls, value: int, given: str) -> RoundedUp:
        made = super().__new__(cls, value)
        made.given = given
        return made


def _whole(value: Fraction, text: str) -> int:
    whole_value = math.ceil(value)
    if whole_value > INTEGER_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {INTEGER_MAX} seconds (68 years), got {text}")
    return whole_value if whole_value == value else RoundedUp(whole_value, text.strip())


def whole_seconds(text: str) -> int:
    """A duration >= 0 the engine keeps in whole seconds: a fraction rounded up."""
    return _whole(duration(text), text)


def positive_whole_seconds(text: str) -> int:
    """A duration > 0 the engine keeps in whole seconds: a fraction rounded up (500ms: 1)."""
    return _whole(positive(duration(text), text), text)


LIBPQ_MIN_CONNECT_TIMEOUT = 2


def connect_seconds(text: str) -> int:
    """libpq's connect_timeout: whole seconds, a fraction rounded up (2.5: 3), at least 2, as libpq
    takes nothing shorter (it would wait 2 s for a 1)."""
    value = duration(text)
    if value < LIBPQ_MIN_CONNECT_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"must be at least {LIBPQ_MIN_CONNECT_TIMEOUT} seconds (libpq's minimum), got {text}"
        )
    return _whole(value, text)
