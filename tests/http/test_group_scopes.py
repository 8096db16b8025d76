"""A key limited to its own consumer group (``--group billing``) tries, on every route of the spec
that names a group and on every list that shows one, what it may do to the other groups of the
same stream: another team's ``analytics``, and ``Billing`` and ``BILLING``, which the database holds
apart from ``billing`` (group names keep their letter case). Every attempt is answered as for a
group that does not exist, word for word, and changes nothing; every list leaves them out."""

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

OTHERS = ("analytics", "Billing", "BILLING")  # groups of other teams, two of them spelt like ours


async def other_teams(broker: AsyncBroker) -> tuple[AsyncStream, dict[str, dict[str, Any]]]:
    """Stream clicks (2 partitions) with our group billing and the OTHERS, each of which has a
    consumer holding a batch: what an attacker would name (its consumer, partition and epoch)."""
    stream = AsyncStream(broker, "clicks")
    await stream.create(partitions=2)
    await stream.create_group("billing", start="start")
    await stream.create_group("analytics", start="start")
    for n, group in enumerate(OTHERS[1:]):
        # Named by hand (Billing's default is billing's own queue, which no other group may have),
        # within our key's queue patterns: only the group check can keep their failures from it.
        await stream.create_group(group, start="start", retry_queue=f"clicks_billing_theirs{n}_retry")
    await stream.send_many([{"n": n} for n in range(10)], keys=[f"k{n}" for n in range(10)])
    held = {}
    for group in OTHERS:
        batch = await stream.consumer(group, name=f"victim-{group}", lease=3600).read(100)
        first = batch.messages[0]
        held[group] = {"consumer": f"victim-{group}", "partition": first.partition, "epoch": first.epoch}
    return stream, held


def attempts(path: str, victim: dict[str, Any]) -> list[Any]:
    """Bodies that would pass validation for an operation on a group: as its consumer (its name
    and epoch, as /v1/workers and a heartbeat told them), and as a newcomer filling its places;
    none for its drop."""
    as_victim = {"consumer": victim["consumer"], "lease_seconds": 3600}
    ack = {"partition": victim["partition"], "epoch": victim["epoch"], "last_id": 1_000_000}
    bodies: dict[str, list[Any]] = {
        "read": [{**as_victim, "qty": 100}, {"consumer": "intruder", "qty": 100, "lease_seconds": 3600}],
        "heartbeat": [as_victim, {"consumer": "intruder", "lease_seconds": 3600}],
        "ack": [
            {"consumer": victim["consumer"], "acks": [ack]},
            {"consumer": victim["consumer"], "acks": [ack], "failed": [{"id": 1, "error": "forged"}]},
        ],
        "{group}": [None],  # the drop: no body
    }
    return bodies[path.rsplit("/", 1)[1]]


async def state(broker: AsyncBroker) -> Any:
    """What a refused request must leave as it was: members, owners and epochs, positions, and
    what the retry queues hold."""
    async with broker.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT array_agg(row(group_name, consumer, expires_at)::text ORDER BY 1)"
            "        FROM pgbroker.stream_consumer),"
            "       (SELECT array_agg(row(group_name, partition, owner, epoch)::text ORDER BY 1)"
            "        FROM pgbroker.stream_cursor),"
            "       (SELECT array_agg(row(g.group_name, l.acked_id, l.delivered_id)::text ORDER BY 1)"
            "        FROM pgbroker.stream_group g,"
            "             pgbroker._stream_positions(g.stream_name, g.group_name, ARRAY[0, 1]) l),"
            "       (SELECT array_agg(row(queue_name, queue_length)::text ORDER BY 1)"
            "        FROM pgmq.metrics_all())"
        )
        return await cur.fetchone()


def code_of(answer: Any) -> Any:
    """The error code of an answer; None for a success."""
    return answer.get("error", {}).get("code")


def billing_keys(conn: psycopg.Connection[Any]) -> dict[str, dict[str, str]]:
    """Our team's keys: they see stream clicks and our retry queue, and group billing alone."""
    return {
        scope: auth(
            create_key(
                conn,
                f"billing-{scope}",
                scopes=[scope],
                queues=["clicks", "clicks_billing_*"],
                groups=["billing"],
            )[1]
        )
        for scope in ("read", "admin")
    }


async def test_a_key_of_one_group_reaches_no_other_group_of_the_stream(
    client: httpx.AsyncClient, broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    stream, held = await other_teams(broker)
    keys = billing_keys(conn)
    spec = (await client.get("/openapi.json")).json()
    on_a_group = [(p, m) for p, operations in spec["paths"].items() if "{group}" in p for m in operations]
    assert len(on_a_group) == 4, on_a_group  # drop, read, ack, heartbeat: a new one is tried here too

    async def answers() -> list[tuple[str, int, Any]]:
        said = []
        for scope, key in keys.items():
            for group in OTHERS:
                for path, method in on_a_group:
                    if method == "delete" and scope != "admin":
                        continue  # the drop is an admin's: a read key is refused its scope, on any group
                    url = path.replace("{stream}", "clicks").replace("{group}", group)
                    for body in attempts(path, held[group]):
                        r = await client.request(method.upper(), url, json=body, headers=key)
                        said.append((url, r.status_code, r.json()))
        return said

    before = await state(broker)
    refused = await answers()
    for url, status, answer in refused:
        assert (status, code_of(answer)) == (404, "stream_group_not_found"), (url, answer)
    assert await state(broker) == before
    # Word for word what the same requests are told once those groups are gone.
    for group in OTHERS:
        assert await stream.drop_group(group)
    assert await answers() == refused


async def test_lists_show_a_key_only_its_groups(
    client: httpx.AsyncClient, broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    await other_teams(broker)
    keys = billing_keys(conn)
    mine = await client.post(
        "/v1/streams/clicks/groups/billing/read", json={"consumer": "ours", "qty": 1}, headers=keys["read"]
    )
    assert mine.status_code == 200, mine.text
    for key in keys.values():
        groups = (await client.get("/v1/streams/clicks/groups", headers=key)).json()["groups"]
        assert [g["name"] for g in groups] == ["billing"]
        stats = (await client.get("/v1/streams/stats", headers=key)).json()["groups"]
        assert [(s["stream"], s["group"]) for s in stats] == [("clicks", "billing")]
        consumers = (await client.get("/v1/workers", headers=key)).json()["stream_consumers"]
        assert [(c["group"], c["consumer"]) for c in consumers] == [("billing", "ours")]
        metrics = (await client.get("/metrics", headers=key)).text
        assert 'group="billing"' in metrics
        for text in (str(groups), str(stats), str(consumers), metrics):
            for other in ("victim", *OTHERS):
                assert other not in text, (other, text)


async def test_a_key_of_one_group_makes_no_other_group_and_drops_no_stream(
    client: httpx.AsyncClient, broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    stream, _ = await other_teams(broker)
    admin = billing_keys(conn)["admin"]
    before = await stream.groups()
    # Made or not, any group outside its patterns is refused alike: its answer tells nothing.
    for group in (*OTHERS, "newteam", "Billing2"):
        r = await client.post("/v1/streams/clicks/groups", json={"group": group}, headers=admin)
        assert (r.status_code, code_of(r.json())) == (403, "forbidden"), (group, r.text)
    # A dropped stream takes every group with it: the others' too.
    r = await client.delete("/v1/streams/clicks", headers=admin)
    assert (r.status_code, code_of(r.json())) == (403, "forbidden"), r.text
    assert await stream.groups() == before


async def test_a_key_of_one_group_uses_its_own_and_a_key_of_every_group_all(
    client: httpx.AsyncClient, broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    _, held = await other_teams(broker)
    keys = billing_keys(conn)
    r = await client.post("/v1/streams/clicks/groups", json={"group": "billing"}, headers=keys["admin"])
    assert (r.status_code, r.json()) == (201, {"group": "billing", "retry_queue": "clicks_billing_retry"})
    r = await client.post(
        "/v1/streams/clicks/groups/billing/read", json={"consumer": "ours", "qty": 100}, headers=keys["read"]
    )
    batch = r.json()["messages"]
    assert len(batch) == 10, r.text
    r = await client.post(
        "/v1/streams/clicks/groups/billing/heartbeat", json={"consumer": "ours"}, headers=keys["read"]
    )
    assert len(r.json()["partitions"]) == 2, r.text
    body = {"consumer": "ours", "acks": stream_acks(batch), "failed": [{"id": 1, "error": "boom"}]}
    r = await client.post("/v1/streams/clicks/groups/billing/ack", json=body, headers=keys["read"])
    assert all(p["acked"] for p in r.json()["partitions"]), r.text
    assert (await broker.metrics("clicks_billing_retry")).queue_length == 1
    # A key made without group patterns has every group, as every key made before them has.
    every = auth(create_key(conn, "clicks-admin", scopes=["admin"], queues=["clicks*"])[1])
    victim = {"consumer": held["analytics"]["consumer"]}
    r = await client.post("/v1/streams/clicks/groups/analytics/heartbeat", json=victim, headers=every)
    assert r.status_code == 200, r.text
    groups = (await client.get("/v1/streams/clicks/groups", headers=every)).json()["groups"]
    assert sorted(g["name"] for g in groups) == sorted(["billing", *OTHERS])
    r = await client.delete("/v1/streams/clicks", headers=every)
    assert (r.status_code, r.json()) == (200, {"dropped": "clicks"})
