"""The codec each queue's sends use when not told one, as its policy said a few seconds ago.

A client asks the database (pgbroker.queue_codec) once per queue and period, not once per send;
a change of a queue's codec therefore reaches other processes within ``ttl`` seconds, and the
process that made it (set_policy through the same broker) at once. No I/O here.
"""

from __future__ import annotations

import threading
import time

DEFAULT_TTL = 10.0


class DefaultCodecs:
    def __init__(self, ttl: float = DEFAULT_TTL) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._known: dict[str, tuple[float, str]] = {}

    def cached(self, queue: str) -> str | None:
        """The codec name remembered for ``queue``, unless older than ttl."""
        with self._lock:
            found = self._known.get(queue.lower())
        if found is None or time.monotonic() - found[0] > self.ttl:
            return None
        return found[1]

    def remember(self, queue: str, codec: str) -> None:
        with self._lock:
            self._known[queue.lower()] = (time.monotonic(), codec)

    def forget(self, queue: str) -> None:
        with self._lock:
            self._known.pop(queue.lower(), None)
