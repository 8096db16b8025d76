"""API keys over HTTP: missing, malformed, wrong and revoked keys (401), scopes and queue patterns
(403), request-size limits (413) and the per-key rate limit (429)."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest

from pgbroker._db.api_keys import create_key, list_keys, revoke_key
from pgbroker.http import Settings
from pgbroker.queues._client_async import AsyncBroker
from tests.support.http import auth, client_for

pytestmark = pytest.mark.anyio


async def test_missing_malformed_and_wrong_keys(client: httpx.AsyncClient, keys: dict[str, str]) -> None:
    admin = keys["admin"]
    key_id, secret = admin.split("_")[1], admin.split("_")[2]
    wrong_secret = f"pgb_{key_id}_{secret[::-1]}"
    unknown_id = f"pgb_999999_{secret}"
    for headers in ({}, auth("nonsense"), auth(wrong_secret), auth(unknown_id), {"Authorization": "Basic x"}):
        r = await client.get("/v1/queues", headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["code"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"
    r = await client.get("/v1/queues", headers={"X-API-Key": admin})
    assert r.status_code == 200


async def test_an_authorization_header_of_another_scheme_is_named(client: httpx.AsyncClient) -> None:
    """A key sent as 'Token ...' or 'Basic ...' was told 'no API key given'."""
    for header, message in (
        ("Token pgb_1_x", "the Authorization header is of scheme 'Token', not Bearer"),
        ("Bearer ", "the Authorization header's bearer token is empty"),
    ):
        error = (await client.get("/v1/queues", headers={"Authorization": header})).json()["error"]
        assert error["message"] == message
        assert "Authorization: Bearer <token>" in error["hint"]
    error = (await client.get("/v1/queues")).json()["error"]
    assert error["message"] == "no API key given"


async def test_revoked_key(
    client: httpx.AsyncClient, keys: dict[str, str], conn: psycopg.Connection[Any]
) -> None:
    assert (await client.get("/v1/queues", headers=auth(keys["consumer"]))).status_code == 200
    [consumer] = [k for k in list_keys(conn) if k.name == "consumer"]
    assert revoke_key(conn, consumer.id)
    assert not revoke_key(conn, consumer.id)
    assert (await client.get("/v1/queues", headers=auth(keys["consumer"]))).status_code == 401
    assert "consumer" not in [k.name for k in list_keys(conn)]
    assert "consumer" in [k.name for k in list_keys(conn, include_revoked=True)]


@pytest.mark.parametrize(
    ("role", "method", "path", "body"),
    [
        ("producer", "POST", "/v1/queues/jobs/read", {}),
        ("producer", "POST", "/v1/queues/jobs/ack", {"receipt": "1:1:1"}),
        ("consumer", "POST", "/v1/queues/jobs/messages", {"message": 1}),
        ("consumer", "POST", "/v1/queues/jobs/purge", None),
        ("both", "DELETE", "/v1/queues/jobs", None),
        ("both", "POST", "/v1/queues", {"name": "new"}),
        ("other", "POST", "/v1/queues/jobs/messages", {"message": 1}),
        ("other", "GET", "/v1/queues/jobs/metrics", None),
        ("other", "POST", "/v1/queues", {"name": "jobs2"}),
    ],
)
async def test_scope_violations(
    client: httpx.AsyncClient, keys: dict[str, str], role: str, method: str, path: str, body: object
) -> None:
    await client.post("/v1/queues", json={"name": "jobs"}, headers=auth(keys["admin"]))
    r = await client.request(method, path, json=body, headers=auth(keys[role]))
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "forbidden"
    # Nothing happened: the queue is still there and empty.
    r = await client.get("/v1/queues/jobs/metrics", headers=auth(keys["admin"]))
    assert r.json()["queue_length"] == 0


async def test_queue_patterns(client: httpx.AsyncClient, keys: dict[str, str]) -> None:
    other = auth(keys["other"])
    await client.post("/v1/queues", json={"name": "jobs"}, headers=auth(keys["admin"]))
    r = await client.post("/v1/queues", json={"name": "other-a"}, headers=other)
    assert r.status_code == 201
    r = await client.post("/v1/queues/other-a/messages", json={"message": 1}, headers=other)
    assert r.status_code == 201
    r = await client.get("/v1/queues", headers=other)
    assert [q["queue_name"] for q in r.json()["queues"]] == ["other-a"]  # jobs is not listed


async def test_request_size_limit(broker: AsyncBroker, keys: dict[str, str]) -> None:
    settings = Settings(key_cache_seconds=0, max_body_bytes=1000)
    async with client_for(broker, settings, keys["admin"]) as client:
        await client.post("/v1/queues", json={"name": "jobs"})
        r = await client.post("/v1/queues/jobs/messages", json={"message": "x" * 2000})
        assert (r.status_code, r.json()["error"]["code"]) == (413, "request_too_large")

        async def chunks() -> Any:  # no Content-Length: the limit is counted as the body streams
            for _ in range(10):
                yield b" " * 200

        r = await client.post("/v1/queues/jobs/messages", content=chunks())
        assert (r.status_code, r.json()["error"]["code"]) == (413, "request_too_large")
        r = await client.post("/v1/queues/jobs/messages", json={"message": "x" * 500})
        assert r.status_code == 201


async def test_rate_limit(broker: AsyncBroker, keys: dict[str, str], conn: psycopg.Connection[Any]) -> None:
    settings = Settings(key_cache_seconds=0, rate_per_second=0.5, rate_burst=3)
    async with client_for(broker, settings) as client:
        codes = [(await client.get("/v1/queues", headers=auth(keys["admin"]))).status_code for _ in range(5)]
        assert codes == [200, 200, 200, 429, 429]
        r = await client.get("/v1/queues", headers=auth(keys["admin"]))
        assert r.json()["error"]["code"] == "rate_limited"
        assert int(r.headers["retry-after"]) >= 1
        # Per key: another key still has its whole burst.
        assert (await client.get("/v1/queues", headers=auth(keys["consumer"]))).status_code == 200
        # A key's own rate overrides the server's.
        _, fast = create_key(conn, "fast", scopes=["read"], rate_per_second=1000)
        codes = [(await client.get("/v1/queues", headers=auth(fast))).status_code for _ in range(20)]
        assert set(codes) == {200}


async def test_key_validation(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(ValueError, match="scopes"):
        create_key(conn, "x", scopes=["write"])
    with pytest.raises(ValueError, match="pattern"):
        create_key(conn, "x", scopes=["read"], queues=[])
    key, token = create_key(conn, "x", scopes=["read", "send"], queues=["a-*", "b"])
    assert token.startswith(f"pgb_{key.id}_")
    assert key.allows("read", "a-1")
    assert key.allows("send", "b")
    assert not key.allows("read", "c")
    assert not key.allows("admin", "a-1")
    stored = conn.execute("SELECT hash FROM pgbroker.api_keys WHERE id = %s", (key.id,)).fetchone()
    assert stored is not None
    assert token.encode() not in bytes(stored[0])
