"""/metrics (parsed with prometheus_client's own parser), pgbroker.queue_stats() on both sides of
its exact-count bound, the dashboard feed, and the OpenAPI spec against the routes."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.routing import Route

from pgbroker.http import Settings, create_app
from pgbroker.queues._client_async import AsyncBroker
from tests.support.http import auth, client_for

pytestmark = pytest.mark.anyio


def samples(text: str) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("queue", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics(
    client: httpx.AsyncClient, keys: dict[str, str], conn: psycopg.Connection[Any]
) -> None:
    admin = auth(keys["admin"])
    assert (await client.get("/metrics")).status_code == 401
    for name in ("jobs", "other-x"):
        await client.post("/v1/queues", json={"name": name}, headers=admin)
    await client.post("/v1/queues/jobs/messages", json={"messages": [1, 2, 3]}, headers=admin)
    await client.post("/v1/queues/jobs/read", json={"vt": 60}, headers=admin)
    r = await client.get("/metrics", headers=admin)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    got = samples(r.text)
    assert got[("pgbroker_queue_length", "jobs")] == 3
    assert got[("pgbroker_queue_visible_length", "jobs")] == 2
    assert got[("pgbroker_queue_messages_sent_total", "jobs")] == 3
    assert got[("pgbroker_queue_length_estimated", "jobs")] == 0
    assert got[("pgbroker_queue_dead_letters", "jobs")] == 0
    assert 0 <= got[("pgbroker_queue_oldest_message_age_seconds", "jobs")] < 60
    assert got[("pgbroker_queue_length", "other-x")] == 0
    assert got[("pgbroker_queue_messages_consumed_total", "jobs")] == 0
    # A key sees only its queues.
    got = samples((await client.get("/metrics", headers=auth(keys["other"]))).text)
    assert {queue for _, queue in got} == {"other-x"}


async def test_consumed_counter_follows_acks_and_deletes(
    client: httpx.AsyncClient, keys: dict[str, str]
) -> None:
    admin = auth(keys["admin"])
    await client.post("/v1/queues", json={"name": "jobs"}, headers=admin)
    await client.post("/v1/queues/jobs/messages", json={"messages": [1, 2, 3, 4, 5]}, headers=admin)
    r = await client.post("/v1/queues/jobs/read", json={"qty": 3}, headers=admin)
    await client.post(
        "/v1/queues/jobs/ack", json={"receipts": [m["receipt"] for m in r.json()["messages"]]}, headers=admin
    )
    [fourth] = (await client.post("/v1/queues/jobs/read", json={}, headers=admin)).json()["messages"]
    await client.post("/v1/queues/jobs/delete", json={"msg_ids": [fourth["msg_id"]]}, headers=admin)
    # Backends report their table statistics at most about once a second.
    deadline = time.monotonic() + 10
    while True:
        got = samples((await client.get("/metrics", headers=admin)).text)
        if got[("pgbroker_queue_messages_consumed_total", "jobs")] == 4 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert got[("pgbroker_queue_messages_consumed_total", "jobs")] == 4
    assert got[("pgbroker_queue_length", "jobs")] == 1


async def test_metrics_public(broker: AsyncBroker) -> None:
    async with client_for(broker, Settings(metrics_public=True)) as client:
        assert (await client.get("/metrics")).status_code == 200


def test_queue_stats_estimates_past_the_bound(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT pgmq.create('big')")
    conn.execute("SELECT pgmq.send_batch('big', array_fill('{}'::jsonb, ARRAY[500]))")
    conn.execute("SELECT pgbroker.read('big', 60, 50)")
    conn.execute("ANALYZE pgmq.q_big")
    row = conn.execute(
        "SELECT queue_length, visible_length, length_is_estimate, total_sent FROM pgbroker.queue_stats(100)"
    ).fetchone()
    assert row is not None
    length, visible, estimated, sent = row
    assert estimated
    assert sent == 500
    assert 400 <= length <= 600  # the planner's estimate, scaled to the table's size
    assert visible == length - 50  # the leased 50 are counted exactly through the vt index
    exact = conn.execute(
        "SELECT queue_length, visible_length, length_is_estimate FROM pgbroker.queue_stats()"
    )
    assert exact.fetchone() == (500, 450, False)


async def test_stats_feed_and_dashboard(client: httpx.AsyncClient, keys: dict[str, str]) -> None:
    admin = auth(keys["admin"])
    await client.post("/v1/queues", json={"name": "jobs"}, headers=admin)
    await client.post("/v1/queues/jobs/messages", json={"message": 1}, headers=admin)
    r = await client.get("/v1/stats", headers=admin)
    [jobs] = r.json()["queues"]
    assert (jobs["queue_name"], jobs["queue_length"], jobs["total_sent"]) == ("jobs", 1, 1)
    assert jobs["total_consumed"] == 0
    r = await client.get("/dashboard")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert '<script src="/dashboard/app.js"' in r.text
    # No script but this server's: a payload shown in the page could not run.
    assert "script-src 'self'" in r.headers["content-security-policy"]
    script = await client.get("/dashboard/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "/v1/stats" in script.text
    assert "sessionStorage" in script.text
    assert (await client.get("/dashboard/app.css")).headers["content-type"].startswith("text/css")


async def test_root_leads_to_the_dashboard_and_docs_render_the_spec(client: httpx.AsyncClient) -> None:
    r = await client.get("/")
    assert (r.status_code, r.headers["location"]) == (307, "/dashboard")
    r = await client.get("/docs")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert '<script src="/docs/app.js"' in r.text
    assert "script-src 'self'" in r.headers["content-security-policy"]  # no CDN, no inline script
    script = await client.get("/docs/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert 'fetch("/openapi.json")' in script.text
    assert (await client.get("/docs/app.css")).headers["content-type"].startswith("text/css")


async def test_openapi_matches_routes(client: httpx.AsyncClient, broker: AsyncBroker) -> None:
    spec = (await client.get("/openapi.json")).json()
    assert spec["openapi"].startswith("3.")
    documented = {(path, method.upper()) for path, ops in spec["paths"].items() for method in ops}
    app = create_app(broker=broker)
    served = {
        (r.path.replace(":int", ""), method)  # a path's convertor is the server's own business
        for r in app.routes
        if isinstance(r, Route)
        for method in (r.methods or ())
        if method != "HEAD"
    }
    assert documented == served
    codes = set(spec["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"])
    assert {"queue_not_found", "stale_receipt", "unauthorized", "forbidden", "rate_limited"} <= codes


async def test_every_route_is_in_the_spec_with_the_scope_it_enforces(
    client: httpx.AsyncClient, broker: AsyncBroker, keys: dict[str, str]
) -> None:
    spec = (await client.get("/openapi.json")).json()
    await client.post("/v1/queues", json={"name": "jobs"}, headers=auth(keys["admin"]))
    # A key with every scope but the one named: it must be refused (403) where that scope is needed.
    lacking = {"send": keys["consumer"], "read": keys["producer"], "admin": keys["both"]}
    app = create_app(broker=broker)
    served = [
        (r.path.replace(":int", ""), method)  # a path's convertor is the server's own business
        for r in app.routes
        if isinstance(r, Route)
        for method in r.methods or ()
        if method != "HEAD"
    ]
    assert len(served) == 51
    for path, method in served:
        operation = spec["paths"][path][method.lower()]
        scope = operation["x-pgbroker-scope"]
        url = path.replace("{queue}", "jobs").replace("{stream}", "clicks").replace("{group}", "g")
        url = url.replace("{msg_id}", "1")
        # A body that would pass, so that only the key decides (a queue named in the body: create).
        body = {
            ("/v1/queues", "POST"): {"name": "new"},
            ("/v1/streams", "POST"): {"name": "new"},
            ("/v1/schedules", "POST"): {"name": "s", "queue": "jobs", "cron": "* * * * *", "message": {}},
        }.get((path, method))
        anonymous = await client.request(method, url, json=body)
        if scope == "none":
            assert operation["security"] == [], path
            assert str(anonymous.status_code) in operation["responses"], (path, method)
            continue
        assert "security" not in operation  # the spec's default: a bearer token or X-API-Key
        assert (anonymous.status_code, anonymous.json()["error"]["code"]) == (401, "unauthorized"), path
        assert scope in ("key", *lacking), (path, method, scope)
        if scope in lacking:
            r = await client.request(method, url, json=body, headers=auth(lacking[scope]))
            assert (r.status_code, r.json()["error"]["code"]) == (403, "forbidden"), (path, method, r.text)


async def test_every_spec_operation_has_a_handler(client: httpx.AsyncClient, keys: dict[str, str]) -> None:
    spec = (await client.get("/openapi.json")).json()
    await client.post("/v1/queues", json={"name": "jobs"}, headers=auth(keys["admin"]))
    for path, operations in spec["paths"].items():
        for method in operations:
            url = path.replace("{queue}", "jobs").replace("{msg_id}", "1")
            r = await client.request(method.upper(), url, headers=auth(keys["admin"]))
            # {name} is no schedule's name, {stream} no stream's, 1 no dead letter's id
            not_found = (
                "queue_not_found",
                "schedule_not_found",
                "stream_not_found",
                "stream_group_not_found",
                "dead_letter_not_found",
            )
            assert r.status_code not in (404, 405) or r.json()["error"]["code"] in not_found, (
                path,
                method,
            )
            documented = operations[method]["responses"]
            assert str(r.status_code) in documented, (path, method, r.status_code, r.text)


async def test_the_spec_and_the_server_share_the_settings_limits(
    broker: AsyncBroker, keys: dict[str, str]
) -> None:
    settings = Settings(key_cache_seconds=0, max_batch=5, max_wait_seconds=1.5)
    async with client_for(broker, settings, keys["admin"]) as client:
        spec = (await client.get("/openapi.json")).json()
        schemas = spec["components"]["schemas"]
        assert schemas["SendBatch"]["properties"]["messages"]["maxItems"] == 5
        assert schemas["ReadBody"]["properties"]["qty"]["maximum"] == 5
        assert schemas["ReadBody"]["properties"]["wait"]["maximum"] == 1.5
        [_, limit, _] = spec["paths"]["/v1/queues/{queue}/dead-letters"]["get"]["parameters"]
        assert limit["schema"]["maximum"] == 5
        assert "x-pgbroker-limit" not in json.dumps(spec)
        await client.post("/v1/queues", json={"name": "jobs"})
        for path, body in [
            ("/v1/queues/jobs/messages", {"messages": [1] * 6}),
            ("/v1/queues/jobs/read", {"qty": 6}),
            ("/v1/queues/jobs/read", {"wait": 1.6}),
            ("/v1/queues/jobs/delete", {"msg_ids": [1, 2, 3, 4, 5, 6]}),
        ]:
            r = await client.post(path, json=body)
            assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_body"), (path, body)
        r = await client.post("/v1/queues/jobs/messages", json={"messages": [1] * 5})
        assert r.status_code == 201
        r = await client.get("/v1/queues/jobs/dead-letters?limit=6")
        assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_query")


async def test_nul_characters_are_refused_by_the_model(
    client: httpx.AsyncClient, keys: dict[str, str]
) -> None:
    # jsonb cannot store U+0000: the spec's JsonValue says so, and the server refuses it before
    # Postgres would.
    admin = {**auth(keys["admin"]), "content-type": "application/json"}
    await client.post("/v1/queues", json={"name": "jobs"}, headers=admin)
    for body in (
        b'{"message": "a\\u0000b"}',
        b'{"message": {"k\\u0000": 1}}',
        b'{"messages": [1], "headers": [{"x": ["\\u0000"]}]}',
    ):
        r = await client.post("/v1/queues/jobs/messages", content=body, headers=admin)
        assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_body"), body
    # An escaped backslash before u0000 is no NUL.
    r = await client.post("/v1/queues/jobs/messages", content=b'{"message": "\\\\u0000"}', headers=admin)
    assert r.status_code == 201, r.text


async def test_the_paused_gauge_follows_pause_and_resume(
    client: httpx.AsyncClient, keys: dict[str, str]
) -> None:
    admin = auth(keys["admin"])
    await client.post("/v1/queues", json={"name": "jobs"}, headers=admin)
    assert samples((await client.get("/metrics", headers=admin)).text)[("pgbroker_queue_paused", "jobs")] == 0
    await client.post("/v1/queues/jobs/pause", headers=admin)
    assert samples((await client.get("/metrics", headers=admin)).text)[("pgbroker_queue_paused", "jobs")] == 1
    await client.post("/v1/queues/jobs/resume", headers=admin)
    assert samples((await client.get("/metrics", headers=admin)).text)[("pgbroker_queue_paused", "jobs")] == 0
