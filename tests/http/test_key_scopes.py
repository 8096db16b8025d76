"""Each key scope tries, on every route of the spec, what it must not do: a send key, a read key,
and an admin key limited to the pattern ``EU-*`` (which names queues in any letter case, as the
database compares them). Every attempt is refused and changes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from pgbroker._db.api_keys import create_key
from pgbroker._db.install import install
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.streams._client_async import AsyncStream
from tests.support.http import client_for
from tests.support.postgres import drop_db, dsn_for_db

pytestmark = pytest.mark.anyio

SCOPES = ("send", "read", "admin")


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def attempt(path: str, method: str, queue: str, stream: str) -> tuple[str, Any]:
    """The URL and a body that would pass, so that only the key decides."""
    url = path.replace("{queue}", queue).replace("{stream}", stream).replace("{group}", "g")
    url = url.replace("{name}", "tick").replace("{msg_id}", "1")
    bodies: dict[tuple[str, str], Any] = {
        ("/v1/queues", "POST"): {"name": queue},
        ("/v1/streams", "POST"): {"name": stream},
        ("/v1/schedules", "POST"): {"name": "s2", "queue": queue, "cron": "* * * * *", "message": {}},
        ("/v1/queues/{queue}/messages", "POST"): {"message": 1},
        ("/v1/queues/{queue}/ack", "POST"): {"receipt": "1:1:1"},
        ("/v1/queues/{queue}/nack", "POST"): {"receipt": "1:1:1"},
        ("/v1/queues/{queue}/fail", "POST"): {"receipt": "1:1:1"},
        ("/v1/queues/{queue}/retry", "POST"): {"msg_ids": [1]},
        ("/v1/queues/{queue}/extend", "POST"): {"receipt": "1:1:1", "vt": 1},
        ("/v1/queues/{queue}/archive", "POST"): {"msg_ids": [1]},
        ("/v1/queues/{queue}/delete", "POST"): {"msg_ids": [1]},
        ("/v1/queues/{queue}/dead-letters/purge", "POST"): {"msg_ids": [1]},
        ("/v1/streams/{stream}/messages", "POST"): {"messages": [{"message": 1}]},
        ("/v1/streams/{stream}/groups", "POST"): {"group": "g2"},
        ("/v1/streams/{stream}/groups/{group}/read", "POST"): {"consumer": "c"},
        ("/v1/streams/{stream}/groups/{group}/heartbeat", "POST"): {"consumer": "c"},
        ("/v1/streams/{stream}/groups/{group}/ack", "POST"): {
            "consumer": "c",
            "acks": [{"partition": 0, "epoch": 1, "last_id": 1}],
        },
    }
    return url, bodies.get((path, method.upper()), {})


async def state(broker: AsyncBroker) -> Any:
    """What a refused request must leave as it was."""
    async with broker.connection() as conn:
        cur = await conn.execute(
            "SELECT (SELECT array_agg(queue_name ORDER BY queue_name) FROM pgmq.meta),"
            ' (SELECT array_agg(row(msg_id, read_ct, vt, message)::text) FROM pgmq."q_us-secret"),'
            ' (SELECT count(*) FROM pgmq."a_us-secret"),'
            " (SELECT array_agg(row(consumer, expires_at)::text) FROM pgbroker.stream_consumer)"
        )
        row = await cur.fetchone()
    return row, await broker.schedules()


async def test_every_route_refuses_what_each_scope_may_not_do(
    client: httpx.AsyncClient, broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    made = {
        "send": create_key(conn, "sender", scopes=["send"])[1],
        "read": create_key(conn, "reader", scopes=["read"])[1],
        "eu": create_key(conn, "eu-admin", scopes=["admin"], queues=["EU-*"])[1],
    }
    await broker.create_queue("us-secret")
    await broker.create_queue("eu-orders")
    await broker.queue("us-secret").send({"secret": 1})
    await broker.add_schedule("tick", "us-secret", "0 0 1 1 *", {"tick": 1})
    await AsyncStream(broker, "us-clicks").create(partitions=1)
    await AsyncStream(broker, "us-clicks").create_group("g")
    before = await state(broker)
    spec = (await client.get("/openapi.json")).json()
    tried = 0
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            scope = operation["x-pgbroker-scope"]
            if scope not in SCOPES:
                continue
            for role in ("send", "read"):
                if role != scope:  # a key without the scope, on a queue it may see
                    url, body = attempt(path, method, "us-secret", "us-clicks")
                    r = await client.request(method.upper(), url, json=body, headers=auth(made[role]))
                    assert r.status_code == 403, (role, method, url, r.text)
                    tried += 1
            # The pattern key has every scope, on EU-* only: another queue, in any letter case.
            for queue in ("us-secret", "US-SECRET", "Us-Secret"):
                url, body = attempt(path, method, queue, "us-clicks")
                r = await client.request(method.upper(), url, json=body, headers=auth(made["eu"]))
                if "{name}" in path:  # a schedule of a queue the key does not see does not exist
                    assert r.status_code == 404, (method, url, r.text)
                elif "{" not in path and method == "get":  # a list: what the key may not see is left out
                    assert r.status_code == 200, (method, url, r.text)
                    for unseen in ("us-secret", "us-clicks", '"tick"'):
                        assert unseen not in r.text.lower(), (method, url, r.text)
                else:
                    assert r.status_code == 403, (method, url, r.text)
                tried += 1
    assert tried > 100
    assert await state(broker) == before
    # What it may see, it sees in every letter case, and the lists agree with the paths.
    eu = auth(made["eu"])
    listed = (await client.get("/v1/queues", headers=eu)).json()["queues"]
    assert [q["queue_name"] for q in listed] == ["eu-orders"]
    for queue in ("eu-orders", "EU-orders", "Eu-OrDeRs"):
        assert (await client.get(f"/v1/queues/{queue}/metrics", headers=eu)).status_code == 200


@pytest.mark.parametrize(
    "name", ["a%20b", "%20a", "a%20", "a%09b", "a%0Ab", "a%01", "a%C2%A0b", "a%E2%80%A8b"]
)
async def test_names_in_a_path_are_judged_by_the_engines_rule(
    client: httpx.AsyncClient, keys: dict[str, str], name: str
) -> None:
    admin = auth(keys["admin"])
    for method, url in [
        ("GET", f"/v1/queues/{name}/metrics"),
        ("POST", f"/v1/queues/{name}/messages"),
        ("DELETE", f"/v1/streams/{name}"),
    ]:
        r = await client.request(method, url, json={"message": 1}, headers=admin)
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_queue_name"), (url, r.text)


async def test_a_key_cannot_replace_a_schedule_of_a_queue_it_does_not_see(
    client: httpx.AsyncClient, broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    # The add's scope is checked on the queue of the body; with replace, the engine redefines the
    # schedule of that name whichever queue it sends to. An admin key for EU-* took over (moved to
    # its own queue, or silenced) a schedule of us-secret, which it may not even see.
    eu = auth(create_key(conn, "eu-admin", scopes=["admin"], queues=["EU-*"])[1])
    await broker.create_queue("us-secret")
    await broker.create_queue("eu-orders")
    await broker.add_schedule("tick", "us-secret", "0 0 1 1 *", {"tick": 1})
    before = await broker.schedules()
    body = {"name": "tick", "queue": "eu-orders", "cron": "* * * * *", "message": {}, "replace": True}
    r = await client.post("/v1/schedules", json=body, headers=eu)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), r.text
    assert "us-secret" not in r.text
    assert await broker.schedules() == before
    # Its own schedules it replaces as before.
    assert (await client.post("/v1/schedules", json={**body, "name": "mine"}, headers=eu)).status_code == 201
    r = await client.post("/v1/schedules", json={**body, "name": "mine", "cron": "0 * * * *"}, headers=eu)
    assert (r.status_code, r.json()["cron"]) == (201, "0 * * * *"), r.text


async def test_a_key_cannot_make_a_group_whose_retry_queue_it_does_not_see(
    client: httpx.AsyncClient, broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    # A group's failures go to its retry queue, <stream>_<group>_retry, which the group takes over
    # when a queue of that name exists. An admin key for the stream "clicks" alone made group "g"
    # of it: the group adopted another team's queue clicks_g_retry, and the key's reads of the
    # stream then sent what they liked into that queue as failures, a queue it may not even see.
    key = auth(create_key(conn, "clicks-admin", scopes=["admin"], queues=["clicks"])[1])
    await broker.create_queue("clicks_g_retry")
    stream = AsyncStream(broker, "clicks")
    await stream.create(partitions=1)
    r = await client.post("/v1/streams/clicks/groups", json={"group": "G"}, headers=key)
    assert (r.status_code, r.json()["error"]["code"]) == (403, "forbidden"), r.text
    assert await stream.groups() == []
    # With the retry queues in its patterns, the key makes its groups as before.
    wider = auth(create_key(conn, "clicks-all", scopes=["admin"], queues=["clicks", "clicks_*"])[1])
    r = await client.post("/v1/streams/clicks/groups", json={"group": "G"}, headers=wider)
    assert (r.status_code, r.json()) == (201, {"group": "G", "retry_queue": "clicks_g_retry"}), r.text
    # A retry queue named in the body is checked as the default is: another team's, refused.
    await broker.create_queue("us-payroll")
    body = {"group": "H", "retry_queue": "us-payroll"}
    r = await client.post("/v1/streams/clicks/groups", json=body, headers=wider)
    assert (r.status_code, r.json()["error"]["code"]) == (403, "forbidden"), r.text
    assert [g.name for g in await stream.groups()] == ["G"]


async def payroll_group(
    broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> tuple[AsyncStream, dict[str, str]]:
    """Stream eu-clicks (one partition) whose group "g", reading from the start, has another team's
    queue "us-payroll-retry" as its retry queue, named by hand; and a read key for eu-* alone."""
    await broker.create_queue("us-payroll-retry")
    stream = AsyncStream(broker, "eu-clicks")
    await stream.create(partitions=1)
    await stream.create_group("g", start="start", retry_queue="us-payroll-retry")
    return stream, auth(create_key(conn, "eu-reader", scopes=["read"], queues=["eu-*"])[1])


async def test_lists_leave_out_a_retry_queue_the_key_does_not_see(
    client: httpx.AsyncClient, broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    # A group's retry queue may be named by hand (create_stream_group(..., retry_queue => ...)),
    # outside every pattern of the keys that read the stream. The stream stats and the stream's
    # group list named it to a key for eu-* alone: another team's queue "us-payroll-retry".
    stream, eu = await payroll_group(broker, conn)
    await stream.create_group("own", retry_queue="eu-own-retry")
    spec = (await client.get("/openapi.json")).json()
    lists = [p for p, ops in spec["paths"].items() if "{" not in p and "get" in ops and p != "/"]
    for url in [*lists, "/v1/streams/eu-clicks/groups"]:
        r = await client.get(url, headers=eu)
        if r.status_code == 403:  # a route of another scope
            continue
        assert r.status_code == 200, (url, r.text)
        assert "us-payroll" not in r.text, (url, r.text)
    # The group itself is the stream's, and listed: only the queue's name is left out.
    groups = (await client.get("/v1/streams/eu-clicks/groups", headers=eu)).json()["groups"]
    assert [(g["name"], g["retry_queue"]) for g in groups] == [("g", None), ("own", "eu-own-retry")]
    stats = (await client.get("/v1/streams/stats", headers=eu)).json()["groups"]
    assert [(s["group"], s["retry_queue"]) for s in stats] == [("g", None), ("own", "eu-own-retry")]
    # A key that sees the queue is told its name.
    wide = auth(create_key(conn, "reader", scopes=["read"], queues=["*"])[1])
    groups = (await client.get("/v1/streams/eu-clicks/groups", headers=wide)).json()["groups"]
    assert [g["retry_queue"] for g in groups] == ["us-payroll-retry", "eu-own-retry"]


async def test_a_key_cannot_fail_messages_into_a_retry_queue_it_does_not_see(
    client: httpx.AsyncClient, broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    # An ack's failed messages are copied into the group's retry queue. A key for eu-* that may
    # read stream eu-clicks wrote, by acking with failures, into a group's hand-named retry queue
    # "us-payroll-retry" (the error text its own), a queue it may not even see; and a full retry
    # queue answered the ack with the queue's name (queue_full).
    stream, eu = await payroll_group(broker, conn)
    await stream.send_many([{"n": 1}, {"n": 2}])
    r = await client.post("/v1/streams/eu-clicks/groups/g/read", json={"consumer": "c"}, headers=eu)
    batch = r.json()["messages"]
    assert [m["id"] for m in batch] == [1, 2], r.text
    ack = {"consumer": "c", "acks": [{"partition": 0, "epoch": batch[0]["epoch"], "last_id": 2}]}
    failed = {**ack, "failed": [{"id": 1, "error": "forged"}]}
    r = await client.post("/v1/streams/eu-clicks/groups/g/ack", json=failed, headers=eu)
    assert (r.status_code, r.json()["error"]["code"]) == (403, "forbidden"), r.text
    assert "us-payroll" not in r.text
    assert (await broker.metrics("us-payroll-retry")).queue_length == 0
    assert [g.lag for g in await stream.groups()] == [2]  # nothing acked either
    # Full, the queue is not named either.
    await broker.queue("us-payroll-retry").set_policy(max_depth=1)
    await broker.queue("us-payroll-retry").send({"theirs": 1})
    r = await client.post("/v1/streams/eu-clicks/groups/g/ack", json=failed, headers=eu)
    assert (r.status_code, "us-payroll" in r.text) == (403, False), r.text
    # Without failures the key acks as before; a key that sees the queue fails messages into it.
    r = await client.post("/v1/streams/eu-clicks/groups/g/ack", json=ack, headers=eu)
    assert r.json() == {"partitions": [{"partition": 0, "acked": True}]}, r.text
    await broker.queue("us-payroll-retry").purge()
    both = auth(create_key(conn, "both", scopes=["read"], queues=["eu-*", "us-payroll-retry*"])[1])
    await stream.create_group("g2", start="start", retry_queue="us-payroll-retry-2")
    r = await client.post("/v1/streams/eu-clicks/groups/g2/read", json={"consumer": "c"}, headers=both)
    epoch = r.json()["messages"][0]["epoch"]
    body = {**failed, "acks": [{"partition": 0, "epoch": epoch, "last_id": 2}]}
    r = await client.post("/v1/streams/eu-clicks/groups/g2/ack", json=body, headers=both)
    assert r.json() == {"partitions": [{"partition": 0, "acked": True}]}, r.text
    assert (await broker.metrics("us-payroll-retry-2")).queue_length == 1


async def test_making_a_group_again_names_no_retry_queue_the_key_does_not_see(
    client: httpx.AsyncClient, broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    # Making a group is idempotent: an existing group is answered as it is. An admin key for eu-*
    # (which sees eu-clicks_g_retry, the default name) made group "g" again and was told its
    # hand-named retry queue, "us-payroll-retry".
    stream, _ = await payroll_group(broker, conn)
    eu = auth(create_key(conn, "eu-admin", scopes=["admin"], queues=["eu-*"])[1])
    r = await client.post("/v1/streams/eu-clicks/groups", json={"group": "g"}, headers=eu)
    assert (r.status_code, r.json()) == (201, {"group": "g", "retry_queue": None}), r.text
    assert [g.retry_queue for g in await stream.groups()] == ["us-payroll-retry"]


DOTLESS = "\u0131nvo\u0131ces"  # what a Turkish lower() makes of INVOICES


@pytest.fixture
def turkish_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A database whose collation is Turkish (ICU): there lower() folds I to a dotless i."""
    name = f"t_tr_{uuid.uuid4().hex}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL(
                "CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'"
                " LOCALE_PROVIDER icu ICU_LOCALE 'tr-TR'"
            ).format(sql.Identifier(name))
        )
    try:
        with psycopg.connect(dsn_for_db(pg_admin_dsn, name), autocommit=True) as conn:
            install(conn)
        yield dsn_for_db(pg_admin_dsn, name)
    finally:
        drop_db(pg_admin_dsn, name)


async def test_a_key_folds_no_letter_the_database_folds_otherwise(turkish_dsn: str) -> None:
    # A key's patterns were matched with A-Z folded to a-z, on the belief that every database's
    # lower() does the same. Under a Turkish collation lower('I') is a dotless i, and the
    # database takes "INVOICES" for the queue DOTLESS ("invoices" with dotless i's): a key for
    # invoices* read, purged and sent to that other team's queue by spelling its own in capitals.
    with psycopg.connect(turkish_dsn, autocommit=True) as conn:
        token = create_key(conn, "invoices", scopes=["admin"], queues=["invoices*"])[1]
    async with AsyncBroker(turkish_dsn, max_connections=2) as broker, client_for(broker) as client:
        await broker.create_queue(DOTLESS)
        await broker.queue(DOTLESS).send({"secret": 1})
        await broker.create_queue("invoices")
        key = auth(token)
        for method, url, body in [
            ("POST", "/v1/queues/INVOICES/read", {"qty": 10}),
            ("GET", "/v1/queues/INVOICES/metrics", None),
            ("POST", "/v1/queues/INVOICES/messages", {"message": {"forged": 1}}),
            ("POST", "/v1/queues/INVOICES/purge", None),
            ("POST", "/v1/queues/Invoices/read", {"qty": 10}),
        ]:
            r = await client.request(method, url, json=body, headers=key)
            assert (r.status_code, "secret" in r.text) == (403, False), (url, r.text)
        assert (await broker.metrics(DOTLESS)).queue_length == 1
        # Its own queue, in the letters the database folds alike, it reaches as before.
        r = await client.post("/v1/queues/invoices/messages", json={"message": 1}, headers=key)
        assert r.status_code == 201, r.text
        assert (await client.get("/v1/queues/iNVOiCES/metrics", headers=key)).status_code == 200
        listed = (await client.get("/v1/queues", headers=key)).json()["queues"]
        assert [q["queue_name"] for q in listed] == ["invoices"]
