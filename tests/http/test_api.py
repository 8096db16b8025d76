"""The REST API end to end on a real database: every endpoint, and its JSON errors."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from pgbroker.queues._client_async import AsyncBroker
from tests.support.http import auth, make_queue

pytestmark = pytest.mark.anyio


async def test_queue_lifecycle(client: httpx.AsyncClient, keys: dict[str, str]) -> None:
    await make_queue(client, keys["admin"])
    await make_queue(client, keys["admin"])  # idempotent
    r = await client.get("/v1/queues", headers=auth(keys["admin"]))
    assert [q["queue_name"] for q in r.json()["queues"]] == ["jobs"]
    r = await client.get("/v1/queues/jobs/metrics", headers=auth(keys["consumer"]))
    assert r.status_code == 200
    assert r.json()["queue_length"] == 0
    r = await client.delete("/v1/queues/jobs", headers=auth(keys["admin"]))
    assert r.json() == {"dropped": "jobs"}
    r = await client.delete("/v1/queues/jobs", headers=auth(keys["admin"]))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "queue_not_found"


async def test_send_read_ack_cycle(client: httpx.AsyncClient, keys: dict[str, str]) -> None:
    await make_queue(client, keys["admin"])
    both = auth(keys["both"])
    r = await client.post(
        "/v1/queues/jobs/messages", json={"message": {"n": 1}, "headers": {"k": "v"}}, headers=both
    )
    assert r.status_code == 201
    [first] = r.json()["msg_ids"]
    r = await client.post(
        "/v1/queues/jobs/messages",
        json={"messages": [{"n": 2}, {"n": 3}], "headers": [None, {"x": 1}]},
        headers=both,
    )
    assert len(r.json()["msg_ids"]) == 2
    r = await client.post("/v1/queues/jobs/read", json={"vt": 30, "qty": 10}, headers=both)
    messages = r.json()["messages"]
    assert [m["message"] for m in messages] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert messages[0]["headers"] == {"k": "v"}
    assert messages[0]["msg_id"] == first
    receipts = [m["receipt"] for m in messages]

    r = await client.post("/v1/queues/jobs/extend", json={"receipt": receipts[0], "vt": 60}, headers=both)
    assert r.status_code == 200
    renewed = r.json()["receipts"][str(first)]
    # The old receipt no longer holds: the single form answers 409, the batch form lists it.
    r = await client.post("/v1/queues/jobs/ack", json={"receipt": receipts[0]}, headers=both)
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "stale_receipt"
    forged = f"{messages[1]['msg_id']}:9:1"
    r = await client.post("/v1/queues/jobs/ack", json={"receipts": [renewed, forged]}, headers=both)
    assert r.json() == {"acked": [first], "stale": [forged]}

    r = await client.post("/v1/queues/jobs/nack", json={"receipts": receipts[1:]}, headers=both)
    assert sorted(r.json()["nacked"]) == [m["msg_id"] for m in messages[1:]]
    r = await client.post("/v1/queues/jobs/read", json={"qty": 10}, headers=both)
    again = r.json()["messages"]
    assert [m["read_ct"] for m in again] == [2, 2]
    r = await client.post(
        "/v1/queues/jobs/nack", json={"receipt": again[0]["receipt"], "delay": 0}, headers=both
    )
    assert r.json()["nacked"] == [again[0]["msg_id"]]


async def test_archive_delete_purge(client: httpx.AsyncClient, keys: dict[str, str]) -> None:
    await make_queue(client, keys["admin"])
    r = await client.post(
        "/v1/queues/jobs/messages", json={"messages": [1, 2, 3, 4]}, headers=auth(keys["producer"])
    )
    a, b, c, _ = r.json()["msg_ids"]
    r = await client.post(
        "/v1/queues/jobs/archive", json={"msg_ids": [a, 999]}, headers=auth(keys["consumer"])
    )
    assert r.json() == {"archived": [a]}
    r = await client.post("/v1/queues/jobs/delete", json={"msg_ids": [b]}, headers=auth(keys["consumer"]))
    assert r.json() == {"deleted": [b]}
    r = await client.post("/v1/queues/jobs/purge", headers=auth(keys["admin"]))
    assert r.json() == {"purged": 2}
    assert c


async def test_delay_and_long_poll(client: httpx.AsyncClient, keys: dict[str, str]) -> None:
    await make_queue(client, keys["admin"])
    both = auth(keys["both"])
    await client.post("/v1/queues/jobs/messages", json={"message": "later", "delay": 60}, headers=both)
    r = await client.post("/v1/queues/jobs/read", json={}, headers=both)
    assert r.json() == {"messages": []}

    async def send_soon() -> None:
        await asyncio.sleep(0.3)
        await client.post("/v1/queues/jobs/messages", json={"message": "now"}, headers=both)

    started = time.monotonic()
    sender = asyncio.create_task(send_soon())
    r = await client.post("/v1/queues/jobs/read", json={"wait": 5}, headers=both)
    await sender
    assert [m["message"] for m in r.json()["messages"]] == ["now"]
    assert 0.25 < time.monotonic() - started < 4


async def test_a_missing_queue_stream_or_group_is_told_with_how_to_create_it_over_http(
    client: httpx.AsyncClient, keys: dict[str, str]
) -> None:
    # The engine's words are a SQL client's: a send said 'relation "pgmq.q_nope" does not exist
    # (queue "nope" does not exist)', and every hint gave SQL and the command line only.
    admin = auth(keys["admin"])
    for path, body in [("/v1/queues/nope/messages", {"message": 1}), ("/v1/queues/nope/read", {})]:
        r = await client.post(path, json=body, headers=admin)
        assert (r.status_code, r.json()["error"]) == (
            404,
            {
                "code": "queue_not_found",
                "message": 'queue "nope" does not exist',
                "hint": 'Create it first: POST /v1/queues {"name": "nope"} (an admin key), or: '
                "pgbroker create nope",
            },
        )
    r = await client.post("/v1/streams/nost/groups/g/read", json={"consumer": "c"}, headers=admin)
    assert r.json()["error"]["hint"].startswith('Create it first: POST /v1/streams {"name": "nost"}')
    r = await client.post("/v1/streams", json={"name": "clicks"}, headers=admin)
    assert r.status_code == 201, r.text
    r = await client.post("/v1/streams/clicks/groups/nog/read", json={"consumer": "c"}, headers=admin)
    hint = r.json()["error"]["hint"]
    assert hint.startswith('Create it first: POST /v1/streams/clicks/groups {"group": "nog"}'), hint


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/queues/nope/messages", {"message": 1}, 404, "queue_not_found"),
        ("/v1/queues/jobs/messages", {}, 422, "invalid_body"),
        ("/v1/queues/jobs/messages", {"message": 1, "messages": [1]}, 422, "invalid_body"),
        ("/v1/queues/jobs/messages", {"messages": []}, 422, "invalid_body"),
        ("/v1/queues/jobs/messages", {"message": 1, "delay": -1}, 422, "invalid_body"),
        ("/v1/queues/jobs/messages", {"message": 1, "headers": [1]}, 422, "invalid_body"),
        ("/v1/queues/jobs/read", {"qty": 0}, 422, "invalid_body"),
        ("/v1/queues/jobs/read", {"wait": 1e9}, 422, "invalid_body"),
        ("/v1/queues/jobs/read", {"vt": True}, 422, "invalid_body"),
        ("/v1/queues/jobs/ack", {"receipt": "garbage"}, 400, "invalid_argument"),
        ("/v1/queues/jobs/ack", {}, 422, "invalid_body"),
        ("/v1/queues/jobs/extend", {"receipt": "1:1:1"}, 422, "invalid_body"),
        ("/v1/queues/jobs/delete", {"msg_ids": ["x"]}, 422, "invalid_body"),
        ("/v1/queues", {"name": "x" * 200}, 400, "invalid_queue_name"),
        ("/v1/queues", {"name": 3}, 422, "invalid_body"),
    ],
)
async def test_errors(
    client: httpx.AsyncClient, keys: dict[str, str], path: str, body: object, status: int, code: str
) -> None:
    await make_queue(client, keys["admin"])
    r = await client.post(path, json=body, headers=auth(keys["admin"]))
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code
    assert r.json()["error"]["message"]


async def test_invalid_json_and_unknown_routes(client: httpx.AsyncClient, keys: dict[str, str]) -> None:
    await make_queue(client, keys["admin"])
    headers = {**auth(keys["admin"]), "content-type": "application/json"}
    r = await client.post("/v1/queues/jobs/messages", content=b"{nope", headers=headers)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json")
    r = await client.post("/v1/queues/jobs/messages", content=b'{"message": NaN}', headers=headers)
    assert r.json()["error"]["code"] == "invalid_json"
    r = await client.get("/v1/nowhere")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    r = await client.get("/v1/queues/jobs/read")
    assert (r.status_code, r.json()["error"]["code"]) == (405, "method_not_allowed")


async def test_healthz(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz")
    assert r.json() == {"status": "ok"}


async def test_dead_letters_listed_and_replayed(
    client: httpx.AsyncClient, keys: dict[str, str], broker: AsyncBroker
) -> None:
    await make_queue(client, keys["admin"])
    queue = broker.queue("jobs")
    await queue.set_policy(max_deliveries=1)
    await queue.send_many([{"n": 1}, {"n": 2}])
    for message in await queue.read_many(2):
        assert await queue.fail(message, error="boom") == "dead_lettered"
    r = await client.get("/v1/queues/jobs/dead-letters", headers=auth(keys["consumer"]))
    letters = r.json()["messages"]
    assert [m["message"] for m in letters] == [{"n": 1}, {"n": 2}]
    assert letters[0]["headers"]["x-pgbroker-dead-letter"]["error"] == "boom"
    r = await client.get(
        f"/v1/queues/jobs/dead-letters?limit=1&after={letters[0]['msg_id']}", headers=auth(keys["consumer"])
    )
    assert [m["msg_id"] for m in r.json()["messages"]] == [letters[1]["msg_id"]]
    for query in ("limit=0", "limit=x", "after=-1", "after=" + "9" * 5000):
        r = await client.get(f"/v1/queues/jobs/dead-letters?{query}", headers=auth(keys["consumer"]))
        assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_query"), query

    replay = "/v1/queues/jobs/dead-letters/replay"
    r = await client.post(replay, headers=auth(keys["consumer"]))
    assert r.status_code == 403  # replaying is an admin action
    r = await client.post(replay, json={"msg_ids": [letters[0]["msg_id"]]}, headers=auth(keys["admin"]))
    [pair] = r.json()["replayed"]
    assert pair["dead_letter_id"] == letters[0]["msg_id"]
    r = await client.post(replay, headers=auth(keys["admin"]))  # no body: all that are left
    assert [p["dead_letter_id"] for p in r.json()["replayed"]] == [letters[1]["msg_id"]]
    again = await queue.read_many(5)
    assert sorted(m.message["n"] for m in again) == [1, 2]
    assert all("x-pgbroker-dead-letter" not in (m.headers or {}) for m in again)


async def test_a_dead_letter_is_shown_by_its_original_msg_id_with_every_attempt(
    client: httpx.AsyncClient, keys: dict[str, str], broker: AsyncBroker
) -> None:
    await make_queue(client, keys["admin"])
    dlq = await broker.create_queue("jobs_dlq")
    await dlq.send_many(["the dead-letter queue's own message"] * 3)  # so that the ids differ
    queue = broker.queue("jobs")
    await queue.set_policy(
        max_deliveries=2, backoff="fixed", backoff_base_seconds=0, dead_letter_queue="jobs_dlq"
    )
    sent = await queue.send({"n": 1})
    for delivery in (1, 2):
        [message] = await queue.read_many(1)
        await queue.fail(message, error=f"boom {delivery}", traceback=f"Traceback {delivery}")
    r = await client.get(f"/v1/queues/jobs/dead-letters/{sent}", headers=auth(keys["consumer"]))
    assert r.status_code == 200, r.text
    letter = r.json()
    assert letter["msg_id"] == sent
    attempts = letter["headers"]["x-pgbroker-attempts"]
    assert [(a["delivery"], a["error"], a["traceback"]) for a in attempts] == [
        (1, "boom 1", "Traceback 1"),
        (2, "boom 2", "Traceback 2"),
    ]
    r = await client.get(f"/v1/queues/jobs/dead-letters/{sent + 1}", headers=auth(keys["consumer"]))
    assert (r.status_code, r.json()["error"]["code"]) == (404, "dead_letter_not_found")
    # The literal paths beside it keep their own Allow on a 405.
    for action in ("replay", "purge"):
        path = f"/v1/queues/jobs/dead-letters/{action}"
        r = await client.request("OPTIONS", path, headers=auth(keys["admin"]))
        assert (r.status_code, r.headers["allow"]) == (405, "POST"), action
    for bad in ("0", "9" * 30):
        r = await client.get(f"/v1/queues/jobs/dead-letters/{bad}", headers=auth(keys["consumer"]))
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), bad
    r = await client.get("/v1/queues/jobs/dead-letters/replay", headers=auth(keys["consumer"]))
    assert (r.status_code, r.headers["allow"]) == (405, "POST")
    r = await client.post(
        "/v1/queues/jobs/dead-letters/replay", json={"msg_ids": [sent]}, headers=auth(keys["admin"])
    )
    assert [p["dead_letter_id"] for p in r.json()["replayed"]] == [sent]


async def test_an_http_consumer_reports_failures_kept_with_the_message(
    client: httpx.AsyncClient, keys: dict[str, str], broker: AsyncBroker
) -> None:
    await make_queue(client, keys["admin"])
    await broker.queue("jobs").set_policy(max_deliveries=2, backoff="fixed", backoff_base_seconds=0)
    both = auth(keys["both"])
    await client.post("/v1/queues/jobs/messages", json={"messages": [{"n": 1}, {"n": 2}]}, headers=both)
    read = (await client.post("/v1/queues/jobs/read", json={"qty": 2}, headers=both)).json()["messages"]
    first, second = read
    r = await client.post(
        "/v1/queues/jobs/fail",
        json={"receipt": first["receipt"], "error": "ValueError: bad n", "traceback": "File app.js, line 3"},
        headers=both,
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"outcomes": {str(first["msg_id"]): "retry"}, "stale": []}
    batch = {"receipts": [second["receipt"], first["receipt"]]}
    r = await client.post("/v1/queues/jobs/fail", json=batch, headers=both)
    assert r.json() == {"outcomes": {str(second["msg_id"]): "retry"}, "stale": [first["receipt"]]}
    r = await client.post("/v1/queues/jobs/fail", json={"receipt": first["receipt"]}, headers=both)
    assert (r.status_code, r.json()["error"]["code"]) == (409, "stale_receipt")
    [again] = [m for m in await broker.queue("jobs").peek(5) if m.msg_id == first["msg_id"]]
    assert again.headers is not None
    [attempt] = again.headers["x-pgbroker-attempts"]
    assert (attempt["error"], attempt["traceback"]) == ("ValueError: bad n", "File app.js, line 3")
    producer = auth(keys["producer"])
    r = await client.post("/v1/queues/jobs/fail", json={"receipt": first["receipt"]}, headers=producer)
    assert r.status_code == 403


async def test_whoami(client: httpx.AsyncClient, keys: dict[str, str]) -> None:
    r = await client.get("/v1/key", headers=auth(keys["other"]))
    assert r.json() == {
        "name": "other",
        "scopes": ["admin", "read", "send"],
        "queues": ["other-*"],
        "groups": ["*"],
    }
    assert (await client.get("/v1/key")).status_code == 401


async def test_deeply_nested_json_is_refused_not_a_server_error(
    client: httpx.AsyncClient, keys: dict[str, str]
) -> None:
    await make_queue(client, keys["admin"])
    headers = {**auth(keys["admin"]), "content-type": "application/json"}
    deep = b'{"message": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    r = await client.post("/v1/queues/jobs/messages", content=deep, headers=headers)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json")


async def test_pause_resume_and_job_headers_on_send(client: httpx.AsyncClient, keys: dict[str, str]) -> None:
    await make_queue(client, keys["admin"])
    both = auth(keys["both"])
    await client.post("/v1/queues/jobs/messages", json={"message": "low"}, headers=both)
    r = await client.post("/v1/queues/jobs/messages", json={"message": "high", "priority": 9}, headers=both)
    first = await client.post(
        "/v1/queues/jobs/messages", json={"message": "d", "dedup_key": "k"}, headers=both
    )
    again = await client.post(
        "/v1/queues/jobs/messages", json={"message": "d", "dedup_key": "k"}, headers=both
    )
    assert first.json() == again.json()
    r = await client.post("/v1/queues/jobs/pause", headers=both)
    assert r.status_code == 403  # an admin's operation
    r = await client.post("/v1/queues/jobs/pause", headers=auth(keys["admin"]))
    assert r.json() == {"queue_name": "jobs", "paused": True, "changed": True}
    r = await client.post("/v1/queues/jobs/read", json={"qty": 5}, headers=both)
    assert r.json() == {"messages": []}
    r = await client.post("/v1/queues/jobs/resume", headers=auth(keys["admin"]))
    assert r.json() == {"queue_name": "jobs", "paused": False, "changed": True}
    r = await client.post("/v1/queues/jobs/read", json={"qty": 5}, headers=both)
    assert [m["message"] for m in r.json()["messages"]] == ["high", "low", "d"]
    r = await client.post("/v1/queues/jobs/messages", json={"message": 1, "priority": 1.5}, headers=both)
    assert r.status_code == 422
