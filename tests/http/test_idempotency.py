"""Retry-safe sends over HTTP: the Idempotency-Key request header (pgbroker.send_idempotent) and
the answer 503 outcome_unknown for a send whose commit the database connection cut off, which a
retry with the same key then settles (tests/support/commits.py cuts a commit off for real)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import psycopg
import pytest

from pgbroker._db.api_keys import create_key
from pgbroker.embedded import EmbeddedPostgres
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.streams._client_async import AsyncStream
from tests.support.commits import commits_cut_off
from tests.support.http import auth, client_for, make_queue

pytestmark = pytest.mark.anyio

BATCH = {"messages": [{"n": 1}, {"n": 2}], "headers": [{"tenant": "a"}, None]}


async def count(broker: AsyncBroker, queue: str = "jobs") -> int:
    return (await broker.metrics(queue)).queue_length


async def test_a_send_retried_with_its_idempotency_key_answers_the_first_msg_ids_and_sends_nothing(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str]
) -> None:
    await make_queue(client, keys["admin"])
    headers = {**auth(keys["producer"]), "Idempotency-Key": "order-7"}
    first = await client.post("/v1/queues/jobs/messages", json=BATCH, headers=headers)
    again = await client.post("/v1/queues/jobs/messages", json=BATCH, headers=headers)
    assert (first.status_code, again.status_code) == (201, 201), again.text
    assert again.json() == first.json()
    assert len(first.json()["msg_ids"]) == 2
    assert await count(broker) == 2
    other = await client.post(
        "/v1/queues/jobs/messages", json=BATCH, headers={**headers, "Idempotency-Key": "order-8"}
    )
    assert other.status_code == 201
    assert set(other.json()["msg_ids"]).isdisjoint(first.json()["msg_ids"])
    plain = await client.post("/v1/queues/jobs/messages", json=BATCH, headers=auth(keys["producer"]))
    assert plain.status_code == 201
    assert await count(broker) == 6


async def test_an_idempotency_key_with_another_request_is_refused_and_sends_nothing(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str]
) -> None:
    await make_queue(client, keys["admin"])
    headers = {**auth(keys["producer"]), "Idempotency-Key": "order-7"}
    assert (await client.post("/v1/queues/jobs/messages", json=BATCH, headers=headers)).status_code == 201
    changed = {**BATCH, "messages": [{"n": 1}, {"n": 3}]}
    for body in (changed, {**BATCH, "delay": 5}, {"message": {"n": 1}}):
        refused = await client.post("/v1/queues/jobs/messages", json=body, headers=headers)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "idempotency_key_reused"
        assert "'order-7'" in error["message"]
    assert await count(broker) == 2


async def test_an_idempotency_key_is_its_api_keys_own(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str]
) -> None:
    """Two API keys that send to one queue may name their requests alike (after the same order
    ids, say). Another key's Idempotency-Key answered its msg_ids to a send it had not made, which
    stored nothing (a message lost), or refused the send 422 for the key's 24 hours."""
    await make_queue(client, keys["admin"])
    first = {**auth(keys["both"]), "Idempotency-Key": "order-7"}
    second = {**auth(keys["producer"]), "Idempotency-Key": "order-7"}
    theirs = await client.post("/v1/queues/jobs/messages", json=BATCH, headers=first)
    same_body = await client.post("/v1/queues/jobs/messages", json=BATCH, headers=second)
    assert (theirs.status_code, same_body.status_code) == (201, 201), same_body.text
    assert set(same_body.json()["msg_ids"]).isdisjoint(theirs.json()["msg_ids"])
    assert await count(broker) == 4
    other_body = {**BATCH, "messages": [{"n": 1}, {"n": 3}]}
    again = await client.post("/v1/queues/jobs/messages", json=other_body, headers=first)
    assert again.status_code == 422, again.text  # within one API key the key still holds
    clicks = AsyncStream(broker, "clicks")
    await clicks.create(partitions=1)
    body = {"messages": [{"message": {"n": 1}}]}
    ids = [
        (await client.post("/v1/streams/clicks/messages", json=body, headers=headers)).json()["ids"]
        for headers in (first, second)
    ]
    assert ids[0] != ids[1]


async def test_an_idempotency_key_too_long_is_a_clear_400(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str]
) -> None:
    await make_queue(client, keys["admin"])
    headers = {**auth(keys["producer"]), "Idempotency-Key": "k" * 256}
    refused = await client.post("/v1/queues/jobs/messages", json=BATCH, headers=headers)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "invalid_argument"
    assert await count(broker) == 0


async def test_a_send_cut_off_in_its_commit_answers_outcome_unknown_and_its_retry_the_first_msg_ids(
    cluster: EmbeddedPostgres,
) -> None:
    dsn = cluster.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        _, token = create_key(conn, "producer", scopes=["send", "admin"])
    headers = {**auth(token), "Idempotency-Key": "order-9"}
    async with AsyncBroker(dsn, max_connections=4) as broker, client_for(broker) as client:
        await make_queue(client, token)

        def cut_off() -> httpx.Response:
            with commits_cut_off(dsn):
                return asyncio.run(send_once(dsn, headers))

        answer = await asyncio.to_thread(cut_off)
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["code"] == "outcome_unknown"
        assert "Idempotency-Key" in error["hint"]
        assert answer.headers["Retry-After"] == "1"

        retry = await client.post("/v1/queues/jobs/messages", json=BATCH, headers=headers)
        assert retry.status_code == 201, retry.text
        async with broker.connection() as aconn:
            cursor = await aconn.execute("SELECT msg_id FROM pgmq.q_jobs ORDER BY msg_id")
            stored: list[Any] = await cursor.fetchall()
        assert [m for (m,) in stored] == retry.json()["msg_ids"], "it had committed: the retry answers it"


async def send_once(dsn: str, headers: dict[str, str]) -> httpx.Response:
    """The send on a server of its own (its pool's connection is the one cut off)."""
    async with AsyncBroker(dsn, max_connections=1) as broker, client_for(broker) as client:
        return await client.post("/v1/queues/jobs/messages", json=BATCH, headers=headers)


async def test_a_stream_send_retried_with_its_idempotency_key_appends_once(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str]
) -> None:
    clicks = AsyncStream(broker, "clicks")
    await clicks.create(partitions=2)
    headers = {**auth(keys["producer"]), "Idempotency-Key": "batch-1"}
    body = {"messages": [{"message": {"n": 1}, "key": "u1"}, {"message": {"n": 2}}]}
    first = await client.post("/v1/streams/clicks/messages", json=body, headers=headers)
    again = await client.post("/v1/streams/clicks/messages", json=body, headers=headers)
    assert (first.status_code, again.status_code) == (200, 200), again.text
    assert again.json() == first.json()
    other = {"messages": [{"message": {"n": 1}, "key": "u2"}, {"message": {"n": 2}}]}  # another key
    refused = await client.post("/v1/streams/clicks/messages", json=other, headers=headers)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "idempotency_key_reused"
    async with broker.connection() as aconn:
        cursor = await aconn.execute("SELECT count(*) FROM pgbroker.s_clicks")
        assert await cursor.fetchone() == (2,)
