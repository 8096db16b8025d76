"""Lengths of time as a command line writes them: the one parser of every pgbroker command line,
the CLI's (pgbroker.cli.support.arguments) and the Spark jobs' (pgbroker.spark.jobs.common).

A value is exact (a Fraction) until it is rounded: the options whose value the engine keeps in
whole seconds round a fraction up (pgbroker.cli.support.arguments), so that nothing becomes
visible, expires or is dropped sooner than asked. The units are one each and in any case (5m,
5M): there is no month, so no M to tell from m.
"""

from __future__ import annotations

import argparse
import re
from fractions import Fraction

__all__ = ["DURATION_FORMS", "DURATION_UNITS", "duration", "positive", "positive_seconds", "seconds"]

DURATION_UNITS = {
    "ms": Fraction(1, 1000),
    "": Fraction(1),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
    "d": Fraction(86400),
}
DURATION_FORMS = "seconds (30, 1.5) or a number with a unit (500ms, 30s, 5m, 2h, 7d)"
_DURATION = re.compile(
    r"\s*(?P<number>[-+]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?P<unit>ms|s|m|h|d|)\s*", flags=re.IGNORECASE
)


def duration(text: str) -> Fraction:
    """Seconds >= 0 from one of DURATION_FORMS; else argparse's error for the option."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a duration: {DURATION_FORMS}, got {text!r}")
    value = Fraction(match["number"]) * DURATION_UNITS[match["unit"].lower()]
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a duration >= 0, got {text}")
    return value


def positive(value: Fraction, text: str) -> Fraction:
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a duration > 0, got {text}")
    return value


def seconds(text: str) -> float:
    """A duration >= 0, in seconds (a wait, a timeout kept by this process)."""
    return float(duration(text))


def positive_seconds(text: str) -> float:
    """A duration > 0, in seconds."""
    return float(positive(duration(text), text))
