"""API keys: making and storing them (hashed), checking a request's key, its scopes and queue
patterns, and the per-key rate limit.

A token is ``pgb_<id>_<secret>``: the id finds the row, and the SHA-256 of the whole token is
compared with the stored hash in constant time. The secret has 256 bits of entropy, so a plain
hash (no salt, no stretching) is enough: nobody can guess a preimage.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from pgbroker.aio import AsyncBroker

SCOPES = ("send", "read", "admin")
_TOKEN = re.compile(r"^pgb_([0-9]{1,18})_([A-Za-z0-9_-]{20,100})$")


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: int
    name: str
    queues: tuple[str, ...]
    scopes: frozenset[str]
    rate_per_second: float | None
    created_at: datetime
    revoked_at: datetime | None

    def allows(self, scope: str, queue: str | None = None) -> bool:
        """Whether the key may do ``scope`` on ``queue`` (None: an operation on no one queue).

        admin implies every scope. Patterns are globs matched case-sensitively, so that
        ``orders-*`` never matches ``ORDERS-x`` by accident.
        """
        if scope not in self.scopes and "admin" not in self.scopes:
            return False
        return queue is None or self.sees(queue)

    def sees(self, queue: str) -> bool:
        return any(fnmatch.fnmatchcase(queue, pattern) for pattern in self.queues)


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _row_key(row: Sequence[Any]) -> ApiKey:
    return ApiKey(row[0], row[1], tuple(row[2]), frozenset(row[3]), row[4], row[5], row[6])


_COLUMNS = "id, name, queues, scopes, rate_per_second, created_at, revoked_at"


# -- management (the CLI, tests): a sync connection ---------------------------------------------


def create_key(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    scopes: Sequence[str],
    queues: Sequence[str] = ("*",),
    rate_per_second: float | None = None,
) -> tuple[ApiKey, str]:
    """Store a new key; returns it and its token, which is never stored nor shown again."""
    bad = sorted(set(scopes) - set(SCOPES))
    if bad or not scopes:
        raise ValueError(f"scopes must be some of {', '.join(SCOPES)}; got {', '.join(scopes) or 'none'}")
    if not queues or any(not pattern for pattern in queues):
        raise ValueError("give at least one non-empty queue pattern")
    secret = secrets.token_urlsafe(32)
    with conn.transaction():
        # The id is part of the token, so it is taken first and the hash set once it is known.
        key_id = conn.execute("SELECT nextval(pg_get_serial_sequence('pgbroker.api_keys', 'id'))").fetchone()
        assert key_id is not None
        token = f"pgb_{key_id[0]}_{secret}"
        row = conn.execute(
            "INSERT INTO pgbroker.api_keys (id, name, hash, queues, scopes, rate_per_second)"
            " OVERRIDING SYSTEM VALUE VALUES (%s, %s, %s, %s, %s, %s)"
            " RETURNING id, name, queues, scopes, rate_per_second, created_at, revoked_at",
            (key_id[0], name, hash_token(token), list(queues), sorted(set(scopes)), rate_per_second),
        ).fetchone()
    assert row is not None
    return _row_key(row), token


def list_keys(conn: psycopg.Connection[Any], *, include_revoked: bool = False) -> list[ApiKey]:
    rows = conn.execute(
        "SELECT id, name, queues, scopes, rate_per_second, created_at, revoked_at FROM pgbroker.api_keys"
        " WHERE %s OR revoked_at IS NULL ORDER BY id",
        (include_revoked,),
    ).fetchall()
    return [_row_key(r) for r in rows]


def revoke_key(conn: psycopg.Connection[Any], key_id: int) -> bool:
    """Revoke a key; False when there is no such key or it was revoked already."""
    cur = conn.execute(
        "UPDATE pgbroker.api_keys SET revoked_at = now() WHERE id = %s AND revoked_at IS NULL", (key_id,)
    )
    return cur.rowcount == 1


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
        return bytes(row[0]), _row_key(row[1:])


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
