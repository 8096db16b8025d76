"""Fixtures for the HTTP API tests: the ASGI app on the test's database, driven in-process by
httpx (no socket, no mocks), API keys of each scope, and ``pgbroker serve`` on loopback for the
dashboard's browser tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import psycopg
import pytest

from pgbroker._db.api_keys import create_key
from pgbroker.queues._client_async import AsyncBroker
from tests.http.live import LiveServer, pgbroker_serve
from tests.support.http import client_for


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def keys(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """Tokens by role: admin, producer (send), consumer (read), both (send+read), other (queue other-*)."""
    made = {
        "admin": create_key(conn, "admin", scopes=["admin"]),
        "producer": create_key(conn, "producer", scopes=["send"]),
        "consumer": create_key(conn, "consumer", scopes=["read"]),
        "both": create_key(conn, "both", scopes=["send", "read"]),
        "other": create_key(conn, "other", scopes=["send", "read", "admin"], queues=["other-*"]),
    }
    return {role: token for role, (_, token) in made.items()}


@pytest.fixture
async def broker(dsn: str) -> AsyncIterator[AsyncBroker]:
    """An AsyncBroker on the test's database (the API's; it overrides the suite's sync one)."""
    async with AsyncBroker(dsn, max_connections=4, poll_interval=0.1) as b:
        yield b


@pytest.fixture
async def client(broker: AsyncBroker) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(broker) as c:
        yield c


@pytest.fixture
def server(dsn: str) -> Iterator[LiveServer]:
    """``pgbroker serve`` on the test's database, with limits the dashboard never meets."""
    with pgbroker_serve(dsn, "--rate", "1000", "--burst", "1000") as live:
        yield live
