"""The REST API's peek and schedules: answers, paging, filters, scopes and errors."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgbroker.queues._client_async import AsyncBroker
from tests.support.http import auth

pytestmark = pytest.mark.anyio


async def test_peek_pages_and_filters_without_taking_messages(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str]
) -> None:
    queue = await broker.create_queue("jobs")
    ids = await queue.send_many(
        range(5), headers=[{"tenant": "acme" if n % 2 else "globex"} for n in range(5)]
    )
    await queue.read_many(1, vt=300)
    reader = auth(keys["consumer"])
    r = await client.get("/v1/queues/jobs/peek", params={"limit": 2}, headers=reader)
    assert r.status_code == 200, r.text
    page = r.json()
    assert [(m["msg_id"], m["state"], m["receipt"]) for m in page["messages"]] == [
        (ids[0], "in_flight", None),
        (ids[1], "waiting", None),
    ]
    assert page["next_after"] == ids[1]
    r = await client.get("/v1/queues/jobs/peek", params={"after": page["next_after"]}, headers=reader)
    assert [m["message"] for m in r.json()["messages"]] == [2, 3, 4]
    assert r.json()["next_after"] is None
    r = await client.get(
        "/v1/queues/jobs/peek",
        params={"header": "tenant", "header_value": "acme", "state": "waiting"},
        headers=reader,
    )
    assert [m["message"] for m in r.json()["messages"]] == [1, 3]
    r = await client.get(
        "/v1/queues/jobs/peek", params={"enqueued_before": "2000-01-01T00:00:00Z"}, headers=reader
    )
    assert r.json()["messages"] == []
    [message] = await queue.read_many(1)  # the peeks took nothing: the next read gets msg 2, first delivery
    assert (message.msg_id, message.read_ct) == (ids[1], 1)


async def test_peek_finds_by_body_field_and_retry_makes_messages_visible_now(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str]
) -> None:
    queue = await broker.create_queue("jobs")
    ids = await queue.send_many([{"sku": f"A-{n}", "qty": n} for n in range(4)])
    delayed = await queue.send({"sku": "later"}, delay=3600)
    reader = auth(keys["consumer"])
    r = await client.get("/v1/queues/jobs/peek", params={"contains": '{"sku": "A-2"}'}, headers=reader)
    assert r.status_code == 200, r.text
    assert [m["msg_id"] for m in r.json()["messages"]] == [ids[2]]
    r = await client.get("/v1/queues/jobs/peek", params={"contains": '{"qty": 3}'}, headers=reader)
    assert [m["msg_id"] for m in r.json()["messages"]] == [ids[3]]
    [leased] = await queue.read_many(1, vt=300)
    r = await client.post("/v1/queues/jobs/retry", json={"msg_ids": [leased.msg_id, delayed]}, headers=reader)
    assert r.status_code == 403  # an admin's action
    admin = auth(keys["admin"])
    r = await client.post(
        "/v1/queues/jobs/retry", json={"msg_ids": [leased.msg_id, delayed, 999_999]}, headers=admin
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"retried": [leased.msg_id, delayed]}
    states = {m.msg_id: m.state for m in await queue.peek(10)}
    assert (states[leased.msg_id], states[delayed]) == ("waiting", "waiting")


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"contains": "sku=A-1"}, 422),
        ({"contains": "[1]"}, 422),
        ({"state": "lost"}, 422),
        ({"header_value": "x"}, 422),
        ({"enqueued_after": "yesterday"}, 422),
        ({"enqueued_after": "2025-01-01T00:00:00"}, 422),  # no zone: ambiguous
        ({"limit": "0"}, 422),
    ],
)
async def test_bad_peek_queries_are_refused(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str], params: dict[str, str], status: int
) -> None:
    await broker.create_queue("jobs")
    r = await client.get("/v1/queues/jobs/peek", params=params, headers=auth(keys["consumer"]))
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] in {"invalid_query", "invalid_argument"}


async def test_peek_needs_a_read_scope_on_the_queue(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str]
) -> None:
    await broker.create_queue("jobs")
    assert (await client.get("/v1/queues/jobs/peek", headers=auth(keys["producer"]))).status_code == 403
    assert (await client.get("/v1/queues/jobs/peek", headers=auth(keys["other"]))).status_code == 403
    r = await client.get("/v1/queues/nope/peek", headers=auth(keys["consumer"]))
    assert r.status_code == 404


async def test_schedules_lifecycle(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str]
) -> None:
    await broker.create_queue("jobs")
    await broker.create_queue("other-jobs")
    admin = auth(keys["admin"])
    body = {
        "name": "report",
        "queue": "jobs",
        "cron": "0 9 * * mon-fri",
        "message": {"kind": "report"},
        "timezone": "Europe/Berlin",
    }
    r = await client.post("/v1/schedules", json=body, headers=admin)
    assert r.status_code == 201, r.text
    assert r.json()["next_run"].endswith(("07:00:00Z", "08:00:00Z"))
    r = await client.post("/v1/schedules", json=body, headers=admin)
    assert r.status_code == 400
    assert "already exists" in r.json()["error"]["message"]
    r = await client.post("/v1/schedules", json={**body, "cron": "0 9 * *"}, headers=admin)
    assert r.status_code == 400
    assert "expected 5 fields" in r.json()["error"]["message"]
    r = await client.post("/v1/schedules", json={**body, "name": "o", "queue": "other-jobs"}, headers=admin)
    assert r.status_code == 201
    # A key sees the schedules of its queues only; the rest are as if they did not exist.
    r = await client.get("/v1/schedules", headers=auth(keys["other"]))
    assert [s["name"] for s in r.json()["schedules"]] == ["o"]
    assert (await client.post("/v1/schedules/report/pause", headers=auth(keys["other"]))).status_code == 404
    assert (
        await client.post("/v1/schedules/report/pause", headers=auth(keys["consumer"]))
    ).status_code == 403
    r = await client.post("/v1/schedules", json={**body, "name": "x"}, headers=auth(keys["other"]))
    assert r.status_code == 403
    r = await client.post("/v1/schedules/report/pause", headers=admin)
    assert r.json()["paused"] is True
    r = await client.post("/v1/schedules/report/resume", headers=admin)
    assert r.json()["paused"] is False
    r = await client.get("/v1/schedules", headers=auth(keys["consumer"]))
    assert [s["name"] for s in r.json()["schedules"]] == ["o", "report"]
    assert (await client.delete("/v1/schedules/report", headers=admin)).json() == {"removed": "report"}
    r = await client.delete("/v1/schedules/report", headers=admin)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "schedule_not_found"


async def test_metrics_show_each_schedules_next_and_last_tick(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str]
) -> None:
    await broker.create_queue("jobs")
    await broker.create_queue("other-jobs")
    added = await broker.add_schedule("every", "jobs", "* * * * *", {})
    await broker.add_schedule("hidden", "other-jobs", "* * * * *", {})
    [tick] = [t for t in await broker.run_due_schedules(added.next_run) if t.schedule_name == "every"]
    await broker.pause_schedule("hidden")
    families = {
        f.name: f
        for f in text_string_to_metric_families(
            (await client.get("/metrics", headers=auth(keys["admin"]))).text
        )
    }
    by_schedule = {
        (name, s.labels["schedule"]): s.value
        for name in (
            "pgbroker_schedule_next_run_timestamp_seconds",
            "pgbroker_schedule_last_run_timestamp_seconds",
            "pgbroker_schedule_paused",
            "pgbroker_schedule_last_send_failed",
        )
        for s in families[name].samples
    }
    assert by_schedule[("pgbroker_schedule_last_run_timestamp_seconds", "every")] == tick.tick.timestamp()
    assert (
        by_schedule[("pgbroker_schedule_next_run_timestamp_seconds", "every")] == tick.tick.timestamp() + 60
    )
    assert by_schedule[("pgbroker_schedule_paused", "hidden")] == 1
    assert by_schedule[("pgbroker_schedule_last_send_failed", "every")] == 0
    # A key sees the schedules of its queues only.
    text = (await client.get("/metrics", headers=auth(keys["consumer"]))).text
    assert 'schedule="every"' in text
    text = (await client.get("/metrics", headers=auth(keys["other"]))).text
    assert 'schedule="every"' not in text
    assert 'schedule="hidden"' in text


async def test_purge_one_dead_letter(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str]
) -> None:
    queue = await broker.create_queue("jobs")
    await queue.set_policy(max_deliveries=1)
    await queue.send_many(["a", "b"])
    for message in await queue.read_many(2):
        await queue.fail(message, error="boom")
    first, second = await queue.peek(state="dead")
    body = {"msg_ids": [first.msg_id]}
    r = await client.post("/v1/queues/jobs/dead-letters/purge", json=body, headers=auth(keys["consumer"]))
    assert r.status_code == 403
    r = await client.post("/v1/queues/jobs/dead-letters/purge", json=body, headers=auth(keys["admin"]))
    assert r.json() == {"purged": 1}
    assert [m.msg_id for m in await queue.peek(state="dead")] == [second.msg_id]
