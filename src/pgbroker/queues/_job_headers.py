"""The job headers: a message's priority, dedup key and concurrency key travel as message headers.

pgmq routes FIFO groups by the ``x-pgmq-group`` header; pgbroker's job features follow the same
convention (the engine reads them, 32_priorities.sql, 34_dedup.sql, 56_limits.sql), so a pgmq
client in any language uses them by sending these headers. The clients' ``send(..., priority=,
dedup_key=, concurrency_key=)`` write them here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgbroker.errors import InvalidArgument

PRIORITY = "x-pgbroker-priority"
DEDUP_KEY = "x-pgbroker-dedup-key"
CONCURRENCY_KEY = "x-pgbroker-concurrency-key"

# As the engine's check (pgbroker._check_job_headers): up to nine digits.
PRIORITY_LIMIT = 999_999_999


def with_job_headers(
    headers: Mapping[str, Any] | None,
    *,
    priority: int | None = None,
    dedup_key: str | None = None,
    concurrency_key: str | None = None,
) -> Mapping[str, Any] | None:
    """``headers`` with the job headers given added (None: left as they are)."""
    if priority is None and dedup_key is None and concurrency_key is None:
        return headers
    merged = dict(headers or {})
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > PRIORITY_LIMIT:
            raise InvalidArgument(
                f"priority must be a whole number between -{PRIORITY_LIMIT} and {PRIORITY_LIMIT}, "
                f"got {priority!r}",
                hint="Higher is delivered first; leave it out for the default priority 0.",
            )
        merged[PRIORITY] = priority
    keys = (("dedup_key", DEDUP_KEY, dedup_key), ("concurrency_key", CONCURRENCY_KEY, concurrency_key))
    for name, header, value in keys:
        if value is not None:
            if not isinstance(value, str) or not 1 <= len(value) <= 512:
                raise InvalidArgument(f"{name} must be a string of 1 to 512 characters, got {value!r}")
            merged[header] = value
    return merged
