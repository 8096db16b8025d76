"""The stream operations of the REST API end to end: create, send with keys, a group's consumer
reading and acking with a failure, lag in /v1/streams/stats and in /metrics, and the errors."""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest

from pgbroker._db.api_keys import create_key
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.streams._client_async import AsyncStream
from tests.support.http import auth, stream_acks

pytestmark = pytest.mark.anyio


async def test_stream_lifecycle(client: httpx.AsyncClient, keys: dict[str, str]) -> None:
    admin, producer, consumer = auth(keys["admin"]), auth(keys["producer"]), auth(keys["consumer"])
    r = await client.post("/v1/streams", json={"name": "clicks", "partitions": 2}, headers=admin)
    assert r.status_code == 201, r.text
    assert r.json()["partitions"] == 2
    r = await client.post(
        "/v1/streams/clicks/groups", json={"group": "billing", "start": "start"}, headers=admin
    )
    assert r.json() == {"group": "billing", "retry_queue": "clicks_billing_retry"}
    messages = [{"message": {"n": i}, "key": f"user-{i % 2}"} for i in range(6)]
    messages[0]["headers"] = {"trace": "t1"}
    r = await client.post("/v1/streams/clicks/messages", json={"messages": messages}, headers=producer)
    assert r.json() == {"ids": [1, 2, 3, 4, 5, 6]}

    r = await client.post(
        "/v1/streams/clicks/groups/billing/read", json={"consumer": "c1", "qty": 10}, headers=consumer
    )
    batch = r.json()["messages"]
    assert sorted(m["id"] for m in batch) == [1, 2, 3, 4, 5, 6]
    # A batch that takes longer to handle than the lease: the consumer keeps its partitions.
    r = await client.post(
        "/v1/streams/clicks/groups/billing/heartbeat",
        json={"consumer": "c1", "lease_seconds": 60},
        headers=consumer,
    )
    epochs = {m["partition"]: m["epoch"] for m in batch}
    assert r.json() == {"partitions": [{"partition": p, "epoch": epochs[p]} for p in (0, 1)]}, r.text
    assert next(m for m in batch if m["id"] == 1)["headers"] == {"trace": "t1"}
    body = {"consumer": "c1", "acks": stream_acks(batch), "failed": [{"id": 3, "error": "boom"}]}
    r = await client.post("/v1/streams/clicks/groups/billing/ack", json=body, headers=consumer)
    assert all(p["acked"] for p in r.json()["partitions"]), r.text
    r = await client.get("/v1/queues/clicks_billing_retry/metrics", headers=admin)
    assert r.json()["queue_length"] == 1

    r = await client.get("/v1/streams/clicks/groups", headers=consumer)
    assert [(g["name"], g["lag"]) for g in r.json()["groups"]] == [("billing", 0)]
    r = await client.get("/v1/streams/stats", headers=consumer)
    assert [(g["stream"], g["group"], g["lag"]) for g in r.json()["groups"]] == [("clicks", "billing", 0)]
    r = await client.get("/metrics", headers=admin)
    assert 'pgbroker_stream_lag{group="billing",stream="clicks"} 0.0' in r.text
    r = await client.get("/v1/streams", headers=consumer)
    assert [s["name"] for s in r.json()["streams"]] == ["clicks"]
    r = await client.delete("/v1/streams/clicks", headers=admin)
    assert r.json() == {"dropped": "clicks"}


async def test_stream_errors(client: httpx.AsyncClient, keys: dict[str, str]) -> None:
    admin = auth(keys["admin"])
    r = await client.post("/v1/streams/nope/messages", json={"messages": [{"message": 1}]}, headers=admin)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "stream_not_found")
    await client.post("/v1/streams", json={"name": "clicks"}, headers=admin)
    r = await client.post("/v1/streams/clicks/groups/nope/read", json={"consumer": "c"}, headers=admin)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "stream_group_not_found")
    r = await client.post("/v1/streams/clicks/groups/nope/heartbeat", json={"consumer": "c"}, headers=admin)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "stream_group_not_found")
    r = await client.post(
        "/v1/streams/clicks/groups/g/heartbeat", json={"consumer": "c", "lease_seconds": 0}, headers=admin
    )
    assert r.status_code == 422
    r = await client.post(
        "/v1/streams/clicks/messages", json={"messages": [{"message": 1}]}, headers=auth(keys["other"])
    )
    assert r.status_code == 403
    r = await client.post(
        "/v1/streams/clicks/messages", json={"messages": [{"message": 1}]}, headers=auth(keys["consumer"])
    )
    assert r.status_code == 403
    r = await client.post("/v1/streams", json={"name": "Bad Name"}, headers=admin)
    assert r.status_code == 422


async def test_reads_under_made_up_consumer_names_hold_no_lock_of_the_server(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str], conn: psycopg.Connection[Any]
) -> None:
    # A session a consumer read on kept the consumer's liveness lock, a shared advisory lock, until
    # it ended; the API's pooled sessions read for whatever consumer a request names, so they kept
    # one for every name: a key that may read one stream filled the server's lock table (shared by
    # every database of the cluster: every new lock anywhere then failed, out of shared memory).
    stream = AsyncStream(broker, "clicks")
    await stream.create(partitions=2)
    await stream.create_group("g")
    consumer = auth(keys["consumer"])
    for n in range(40):
        for route in ("read", "heartbeat"):
            body = {"consumer": f"{route}-{n}", "lease_seconds": 3600}
            r = await client.post(f"/v1/streams/clicks/groups/g/{route}", json=body, headers=consumer)
            assert r.status_code == 200, r.text
    held = conn.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
        " WHERE l.locktype = 'advisory' AND d.datname = current_database()"
    ).fetchone()
    assert held == (0,)
    # Live by their leases: each read of one leaves the others registered, and they share the partitions.
    [group] = await stream.groups()
    assert group.consumers == 80


async def test_a_group_whose_retry_queue_is_another_group_s_is_refused(
    client: httpx.AsyncClient, keys: dict[str, str], broker: AsyncBroker
) -> None:
    # Group names keep their case, queue names fold: Billing's default retry queue was billing's,
    # and each group's failures went to the other's handler. Over HTTP the group names its own.
    admin = auth(keys["admin"])
    stream = AsyncStream(broker, "clicks")
    await stream.create(partitions=1)
    await stream.create_group("billing")
    r = await client.post("/v1/streams/clicks/groups", json={"group": "Billing"}, headers=admin)
    assert (r.status_code, r.json()["error"]["code"]) == (409, "queue_name_conflict"), r.text
    assert "clicks_Billing_retry" in r.json()["error"]["message"]
    assert [g.name for g in await stream.groups()] == ["billing"]
    body = {"group": "Billing", "retry_queue": "clicks_billing_2_retry"}
    r = await client.post("/v1/streams/clicks/groups", json=body, headers=admin)
    assert (r.status_code, r.json()) == (201, body), r.text


async def test_dropping_a_group_drops_the_retry_queue_made_for_it(
    client: httpx.AsyncClient, keys: dict[str, str], broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    # The retry queue stayed when its group went, and a group made again under the name took the
    # old failures over. Over HTTP a group could not be dropped at all, only its stream.
    admin = auth(keys["admin"])
    stream = AsyncStream(broker, "clicks")
    await stream.create(partitions=1)
    await stream.create_group("billing")
    await broker.queue("clicks_billing_retry").send({"old": "failure"})
    r = await client.delete("/v1/streams/clicks/groups/billing", headers=admin)
    assert (r.status_code, r.json()) == (200, {"dropped": "billing"}), r.text
    r = await client.delete("/v1/streams/clicks/groups/billing", headers=admin)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "stream_group_not_found")
    assert (await client.get("/v1/queues/clicks_billing_retry/metrics", headers=admin)).status_code == 404
    # A key that does not see a retry queue the group made may not drop it with the group or the stream.
    await stream.create_group("billing")
    narrow = auth(create_key(conn, "clicks-only", scopes=["admin"], queues=["clicks"])[1])
    for url in ("/v1/streams/clicks/groups/billing", "/v1/streams/clicks"):
        r = await client.delete(url, headers=narrow)
        assert (r.status_code, r.json()["error"]["code"]) == (403, "forbidden"), r.text
    assert [g.name for g in await stream.groups()] == ["billing"]
    assert (await broker.queue("clicks_billing_retry").metrics()).queue_length == 0
