"""Transformations for the route job's tests, named on its command line as module:function."""

from __future__ import annotations

from typing import Any


def triple_or_drop(message: dict[str, Any]) -> dict[str, Any] | None:
    """Drop multiples of 3; triple the others' n and tag them."""
    n = int(message["n"])
    return None if n % 3 == 0 else {"n": n * 3, "routed": True}


def refuse_seven(message: dict[str, Any]) -> dict[str, Any]:
    if message["n"] == 7:
        raise ValueError("seven is not routable")
    return message


NOT_CALLABLE = 42
