"""How the connections pgbroker opens decode json and jsonb: with orjson, and with the standard
library's decoder where orjson would read something else, so that every value reads back as
``json.loads`` reads it. orjson turns an integer beyond 64 bits into a float, silently
(18446744073709551616 -> 1.8446744073709552e+19), and refuses a number beyond a double's range
(1e400, which json.loads reads as inf): a text with a run of 19 digits or more goes to
``json.loads``, and so does one orjson refuses.

Decoding is a large part of a consumer's client CPU: fetching 1,000 stream rows of ``{"n": 1}``
took 4.3-5.0 us a row with ``json.loads`` and 3.0 with :func:`loads`; a StreamWorker draining a
backlog with W = 64 handlers of 1 ms, 17.3-19.4 us of CPU a message against 18.3-21.3 (four
alternating runs; docs/performance.md). Connections and pools passed in by the application keep their
own adapters: pgbroker changes only what it opened.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from psycopg.abc import AdaptContext
from psycopg.types.json import set_json_loads

__all__ = ["decode_json_fast", "loads"]


# A run of 19 digits (the shortest integer beyond 64 bits is -9223372036854775809), found by
# mapping every digit to 9 and looking for nineteen 9s: both in C, 0.2 us for a text of 120
# bytes where the regular expression [0-9]{19} took 1.8. A run in a string or a fraction only
# costs that text the slower decoder.
_DIGITS_AS_NINES = bytes.maketrans(b"012345678", b"999999999")
_LONG_RUN = b"9" * 19


def loads(data: str | bytes) -> Any:
    """``json.loads``, faster: orjson, unless the text may hold what orjson reads otherwise."""
    raw = data.encode() if isinstance(data, str) else data
    if _LONG_RUN not in raw.translate(_DIGITS_AS_NINES):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def decode_json_fast(context: AdaptContext) -> None:
    """Decode json and jsonb with :func:`loads` on this connection (a pool's ``configure``)."""
    set_json_loads(loads, context)
