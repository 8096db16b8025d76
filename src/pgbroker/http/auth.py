"""API keys in the server: checking a request's key, its scopes and queue patterns, and the
per-key rate limit. Making, listing and revoking keys is pgbroker._db.api_keys (no HTTP needed).

A token is ``pgb_<id>_<secret>``: the id finds the row, and the SHA-256 of the whole token is
compared with the stored hash in constant time. The secret has 256 bits of entropy, so a plain
hash (no salt, no stretching) is enough: nobody can guess a preimage.
"""

from __future__ import annotations

import hmac
import re
import time
from dataclasses import dataclass, field

from pgbroker import _sql as sql
from pgbroker._db.api_keys import ApiKey, hash_token, key_from_row
from pgbroker.queues._client_async import AsyncBroker

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

    def knows(self, token: str) -> bool:
        """Whether authenticate can judge the token without the database: a malformed token, or
        one whose id was looked up within ``ttl`` seconds (found or not)."""
        match = _TOKEN.match(token)
        if match is None:
            return True
        cached = self._cache.get(int(match[1]))
        return cached is not None and time.monotonic() - cached[0] < self._ttl

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
            cur = await conn.execute(sql.queries("keys")["key_for_authentication"], (key_id,))
            row = await cur.fetchone()
        if row is None or row[8] is not None:
            return bytes(32), None
        return bytes(row[0]), key_from_row(row[1:9], row[9])


@dataclass
class _Bucket:
    tokens: float
    updated: float


class TokenBuckets:
    """Token buckets by name (a key's id, a client's address), each refilled at its rate."""

    def __init__(self) -> None:
        self._buckets: dict[object, _Bucket] = {}

    def wait(self, name: object, rate: float, burst: float) -> float:
        """0 when the bucket holds a token, else the seconds until it will (nothing is taken)."""
        bucket = self._refilled(name, rate, burst)
        return 0.0 if bucket.tokens >= 1.0 else (1.0 - bucket.tokens) / rate

    def take(self, name: object, rate: float, burst: float) -> float:
        """Take a token: 0 when there was one, else the seconds until there will be."""
        wait = self.wait(name, rate, burst)
        if wait == 0.0:
            self._buckets[name].tokens -= 1.0
        return wait

    def _refilled(self, name: object, rate: float, burst: float) -> _Bucket:
        now = time.monotonic()
        bucket = self._buckets.get(name)
        if bucket is None:
            if len(self._buckets) > 100_000:  # bounded: a flood of names must not grow it forever
                self._buckets.clear()
            bucket = self._buckets[name] = _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        return bucket


@dataclass
class RateLimiter:
    """A token bucket per key: ``rate`` requests per second sustained, bursts of ``burst``.

    In-process: with several server processes, each enforces the limit on its own share.
    """

    rate: float
    burst: float
    _buckets: TokenBuckets = field(default_factory=TokenBuckets)

    def take(self, key: ApiKey) -> float:
        """0 when the request may go ahead, else the seconds until it could."""
        rate = key.rate_per_second or self.rate
        burst = max(self.burst, 1.0) if key.rate_per_second is None else max(rate, 1.0)
        return self._buckets.take(key.id, rate, burst)


@dataclass
class FailureLimiter:
    """A token bucket per client address, spent by failed authentications: an address past it
    has its unknown tokens refused before they are looked up, so guessing key ids costs the
    database nothing. Keys already known (cached) still pass."""

    rate: float
    burst: float
    _buckets: TokenBuckets = field(default_factory=TokenBuckets)

    def wait(self, address: str) -> float:
        return self._buckets.wait(address, self.rate, max(self.burst, 1.0))

    def charge(self, address: str) -> None:
        self._buckets.take(address, self.rate, max(self.burst, 1.0))
