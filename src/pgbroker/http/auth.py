"""API keys in the server: checking a request's key, its scopes and queue patterns, and the
per-key rate limit. Making, listing and revoking keys is pgbroker.keys (no HTTP needed).

A token is ``pgb_<id>_<secret>``: the id finds the row, and the SHA-256 of the whole token is
compared with the stored hash in constant time. The secret has 256 bits of entropy, so a plain
hash (no salt, no stretching) is enough: nobody can guess a preimage.
"""

from __future__ import annotations

import hmac
import re
import time
from dataclasses import dataclass, field

from pgbroker.aio import AsyncBroker
from pgbroker.keys import ApiKey, hash_token, key_from_row

_TOKEN = re.compile(r"^pgb_([0-9]{1,18})_([A-Za-z0-9_-]{20,100})$")


# -- checking (the server) ----------------------------------------------------------------------


class KeyStore:
    """Finds the key of a token, caching lookups for ``ttl`` seconds.

    The cache spares the database one query per request; the price is that a revocation takes
    effect within ``ttl`` seconds (0 turns caching off).
    """

    def __init__(self, broker: AsyncBroker, ttl: float = 5.0) -> None:
        self._broker = broker
        self._ttl = ttl
        self._cache: dict[int, tuple[float, bytes, ApiKey | None]] = {}

    async def authenticate(self, token: str) -> ApiKey | None:
        """The live key of a token, or None for a malformed, unknown, wrong or revoked token."""
        match = _TOKEN.match(token)
        if match is None:
            return None
        key_id = int(match[1])
        now = time.monotonic()
        cached = self._cache.get(key_id)
        if cached is None or now - cached[0] >= self._ttl:
            stored, key = await self._fetch(key_id)
            cached = (now, stored, key)
            if self._ttl > 0:
                if len(self._cache) > 10_000:  # bounded: random ids must not grow it forever
                    self._cache.clear()
                self._cache[key_id] = cached
        _, stored, key = cached
        # Compared even for an unknown id (against a dummy hash), so timing tells nothing.
        if not hmac.compare_digest(hash_token(token), stored) or key is None:
            return None
        return key

    async def _fetch(self, key_id: int) -> tuple[bytes, ApiKey | None]:
        async with self._broker.connection() as conn:
            cur = await conn.execute(
                "SELECT hash, id, name, queues, scopes, rate_per_second, created_at, revoked_at"
                " FROM pgbroker.api_keys WHERE id = %s",
                (key_id,),
            )
            row = await cur.fetchone()
        if row is None or row[7] is not None:
            return bytes(32), None
        return bytes(row[0]), key_from_row(row[1:])


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass
class RateLimiter:
    """A token bucket per key: ``rate`` requests per second sustained, bursts of ``burst``.

    In-process: with several server processes, each enforces the limit on its own share.
    """

    rate: float
    burst: float
    _buckets: dict[int, _Bucket] = field(default_factory=dict)

    def take(self, key: ApiKey) -> float:
        """0 when the request may go ahead, else the seconds until it could."""
        rate = key.rate_per_second or self.rate
        burst = max(self.burst, 1.0) if key.rate_per_second is None else max(rate, 1.0)
        now = time.monotonic()
        bucket = self._buckets.get(key.id)
        if bucket is None:
            bucket = self._buckets[key.id] = _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / rate
