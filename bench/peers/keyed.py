"""The keyed stream shape of scenario (h) (bench.stream_pgq): messages with a key, W handlers, and
the messages of one key handled one after another, in the order sent.

A system with that shape implements ``KeyedPeer``: pgbroker's stream group
(bench.peers.pgbroker_streams.PgbrokerStreamGroup) and PgQ (bench.peers.pgq_peer.PgQPeer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

#: Awaited with each message's payload (a dict; its key is also in it, as "k").
KeyedHandle = Callable[[dict[str, Any]], Awaitable[None]]
#: Sends (key, payload) pairs in one call.
KeyedSend = Callable[[list[tuple[str, dict[str, Any]]]], Awaitable[None]]


class KeyedPeer(Protocol):
    #: the column name in the table
    key: str
    #: the database the scenario creates for it (dropped at the end)
    database: str

    def describe(self) -> str:
        """The consumer's configuration with W handlers, in words."""
        ...

    async def install(self, dsn: str) -> None: ...

    async def create(self, dsn: str, queue: str) -> None:
        """An empty stream (queue) with one consumer (group) that sees everything sent from now."""
        ...

    async def drop(self, dsn: str, queue: str) -> None: ...

    def sender(self, dsn: str, queue: str) -> AbstractAsyncContextManager[KeyedSend]: ...

    async def work(
        self, dsn: str, queue: str, handle: KeyedHandle, stop: asyncio.Event, workers: int
    ) -> None:
        """Consume with ``workers`` handlers at once until ``stop`` is set, then stop gracefully."""
        ...

    async def remaining(self, dsn: str, queue: str) -> int:
        """Messages the consumer has not yet finished (as far as the system can tell)."""
        ...


def keyed_peers() -> dict[str, KeyedPeer]:
    """The systems of scenario (h), in column order; imported lazily."""
    from bench.peers.pgbroker_streams import PgbrokerStreamGroup
    from bench.peers.pgq_peer import PgQPeer

    found: list[KeyedPeer] = [PgQPeer(), PgbrokerStreamGroup()]
    return {peer.key: peer for peer in found}
