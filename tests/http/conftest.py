"""Fixtures for the HTTP API tests: the ASGI app on the test's database, driven in-process by
httpx (no socket, no mocks), and API keys of each scope."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
import pytest

from pgbroker.aio import AsyncBroker
from pgbroker.http import Settings, create_app
from pgbroker.keys import create_key

# Generous limits, so that only the rate-limit tests ever meet them.
SETTINGS = Settings(key_cache_seconds=0, rate_per_second=1000, rate_burst=1000, max_body_bytes=64 * 1024)


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
    async with AsyncBroker(dsn, max_connections=4, poll_interval=0.1) as b:
        yield b


def client_for(
    broker: AsyncBroker, settings: Settings = SETTINGS, token: str | None = None
) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.ASGITransport(app=create_app(broker=broker, settings=settings))
    return httpx.AsyncClient(transport=transport, base_url="http://pgbroker.test", headers=headers)


@pytest.fixture
async def client(broker: AsyncBroker) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(broker) as c:
        yield c
