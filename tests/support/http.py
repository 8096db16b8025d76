"""Helpers of the HTTP API tests: an in-process client on the ASGI app (httpx, no socket, no
mocks), bearer headers, a queue made through the API, the acks of a stream batch."""

from __future__ import annotations

from typing import Any

import httpx

from pgbroker.http import Settings, create_app
from pgbroker.queues._client_async import AsyncBroker

# Generous limits, so that only the rate-limit tests ever meet them.
SETTINGS = Settings(key_cache_seconds=0, rate_per_second=1000, rate_burst=1000, max_body_bytes=64 * 1024)


def client_for(
    broker: AsyncBroker, settings: Settings = SETTINGS, token: str | None = None
) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.ASGITransport(app=create_app(broker=broker, settings=settings))
    return httpx.AsyncClient(transport=transport, base_url="http://pgbroker.test", headers=headers)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def make_queue(client: httpx.AsyncClient, admin: str, name: str = "jobs") -> None:
    r = await client.post("/v1/queues", json={"name": name}, headers=auth(admin))
    assert r.status_code == 201, r.text


def stream_acks(batch: list[dict[str, Any]]) -> list[dict[str, int]]:
    """What acknowledges a batch a stream read answered: each partition up to its last id, under
    the epoch it was read."""
    acks: dict[int, dict[str, int]] = {}
    for m in batch:
        top = acks.setdefault(
            m["partition"], {"partition": m["partition"], "epoch": m["epoch"], "last_id": 0}
        )
        top["last_id"] = max(top["last_id"], m["id"])
    return list(acks.values())
