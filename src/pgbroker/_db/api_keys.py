"""API keys of the HTTP API, as the database stores them: making (the token is returned once, only
its SHA-256 is kept), listing and revoking them on a sync connection.

These are database operations with no HTTP in them, so the CLI (``pgbroker keys``) manages keys
without the ``http`` extra installed; pgbroker.http.auth checks a request's key against them.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from pgbroker import _sql as sql

__all__ = [
    "SCOPES",
    "ApiKey",
    "create_key",
    "fold_case",
    "hash_token",
    "key_from_row",
    "list_keys",
    "revoke_key",
]

SCOPES = ("send", "read", "admin")


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: int
    name: str
    queues: tuple[str, ...]
    groups: tuple[str, ...]  # the consumer groups of its streams it may use
    scopes: frozenset[str]
    rate_per_second: float | None
    created_at: datetime
    revoked_at: datetime | None
    # What the key's database makes of A-Z with lower(): a-z under most collations, not all.
    lowered: str = field(default="abcdefghijklmnopqrstuvwxyz", repr=False, compare=False)

    def allows(self, scope: str, queue: str | None = None) -> bool:
        """Whether the key may do ``scope`` on ``queue`` (None: an operation on no one queue).

        admin implies every scope. Patterns are globs matched without regard to ASCII case, as the
        database compares queue names (``lower()``): ``EU-*`` is the key of queue ``eu-secret``,
        which ``EU-secret`` names too. Only the letters the database folds the same way
        (``lowered``) are folded.
        """
        if scope not in self.scopes and "admin" not in self.scopes:
            return False
        return queue is None or self.sees(queue)

    def sees(self, queue: str) -> bool:
        """Whether a pattern covers the queue (or stream), its name folded as the database folds it."""
        return _matches(queue, self.queues, self.lowered)

    def sees_group(self, group: str) -> bool:
        """Whether a group pattern covers the consumer group: globs as for queues, folded as the
        database folds group names, which is not at all (``billing`` and ``Billing`` are two groups
        of a stream, perhaps two teams')."""
        return _matches(group, self.groups, _KEEP_CASE)

    def sees_stream_group(self, stream: str, group: str) -> bool:
        """Whether the key sees both the stream and its group: what lists of groups show it."""
        return self.sees(stream) and self.sees_group(group)

    @property
    def sees_every_group(self) -> bool:
        """Whether a pattern covers any group name there can be (``*``)."""
        return any(set(pattern) == {"*"} for pattern in self.groups)


_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LOWER = "abcdefghijklmnopqrstuvwxyz"
_KEEP_CASE = _UPPER  # what a lower() that folds nothing makes of A-Z


def _matches(name: str, patterns: Sequence[str], lowered: str) -> bool:
    """Whether a glob of ``patterns`` covers ``name``, both folded by what the database's lower()
    makes of A-Z (``lowered``)."""
    folded = fold_case(name, lowered)
    return any(fnmatch.fnmatchcase(folded, fold_case(pattern, lowered)) for pattern in patterns)


@functools.cache
def _fold_table(lowered: str) -> dict[int, int]:
    """A-Z to a-z, for the letters the database's lower() (which gave ``lowered`` for A-Z) folds
    so too. What lower() does beyond ASCII depends on the database's collation, and within ASCII
    too: under a Turkish one, lower('I') is a dotless i, and the database takes INVOICES for the
    queue "\u0131nvo\u0131ces", not "invoices". A fold of more than lower() does, or another,
    would let a pattern reach a queue the database holds apart; a fold of less can only refuse."""
    if len(lowered) != len(_UPPER):
        return {}
    return {ord(u): ord(a) for u, a, d in zip(_UPPER, _LOWER, lowered, strict=True) if a == d}


_QUERIES = sql.queries("keys")


def fold_case(name: str, lowered: str = _LOWER) -> str:
    """``name`` with those of its ASCII letters lower-cased that the database's lower() folds to
    the same letter (``lowered``: its lower() of A-Z; a-z under most collations)."""
    return name.translate(_fold_table(lowered))


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def key_from_row(row: Sequence[Any], lowered: str = _LOWER) -> ApiKey:
    """The key of a row of ``pgbroker.api_keys``: id, name, queues, groups, scopes,
    rate_per_second, created_at, revoked_at; ``lowered``, what its database's lower() makes of A-Z."""
    return ApiKey(
        row[0], row[1], tuple(row[2]), tuple(row[3]), frozenset(row[4]), row[5], row[6], row[7], lowered
    )


def create_key(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    scopes: Sequence[str],
    queues: Sequence[str] = ("*",),
    groups: Sequence[str] = ("*",),
    rate_per_second: float | None = None,
) -> tuple[ApiKey, str]:
    """Store a new key; returns it and its token, which is never stored nor shown again.

    ``groups``: the consumer groups of its streams it may read, ack, heartbeat, make and see;
    every group by default, as for keys made before group patterns existed."""
    bad = sorted(set(scopes) - set(SCOPES))
    if bad or not scopes:
        raise ValueError(f"scopes must be some of {', '.join(SCOPES)}; got {', '.join(scopes) or 'none'}")
    for kind, patterns in (("queue", queues), ("group", groups)):
        if not patterns or any(not pattern for pattern in patterns):
            raise ValueError(f"give at least one non-empty {kind} pattern")
    secret = secrets.token_urlsafe(32)
    with conn.transaction():
        # The id is part of the token, so it is taken first and the hash set once it is known.
        key_id = conn.execute(_QUERIES["key_next_id"]).fetchone()
        assert key_id is not None
        token = f"pgb_{key_id[0]}_{secret}"
        row = conn.execute(
            _QUERIES["key_insert"],
            (
                key_id[0],
                name,
                hash_token(token),
                list(queues),
                list(groups),
                sorted(set(scopes)),
                rate_per_second,
            ),
        ).fetchone()
    assert row is not None
    return key_from_row(row), token


def list_keys(conn: psycopg.Connection[Any], *, include_revoked: bool = False) -> list[ApiKey]:
    rows = conn.execute(_QUERIES["key_list"], (include_revoked,)).fetchall()
    return [key_from_row(r) for r in rows]


def revoke_key(conn: psycopg.Connection[Any], key_id: int) -> bool:
    """Revoke a key; False when there is no such key or it was revoked already."""
    cur = conn.execute(_QUERIES["key_revoke"], (key_id,))
    return cur.rowcount == 1
