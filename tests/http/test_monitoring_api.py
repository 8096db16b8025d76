"""The dashboard's history and workers over HTTP (routes/monitoring.py): samples of the queues a
key can see, over the last minutes, and the workers and stream consumers running now."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, tzinfo

import httpx
import pytest

from pgbroker.http.routes import monitoring as monitoring_routes
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.streams._client_async import AsyncStream
from tests.support.http import auth, make_queue

pytestmark = pytest.mark.anyio


async def test_the_history_answers_the_samples_of_the_queues_the_key_sees(
    client: httpx.AsyncClient, keys: dict[str, str], broker: AsyncBroker
) -> None:
    await make_queue(client, keys["admin"])
    await make_queue(client, keys["admin"], "other-x")
    jobs = broker.queue("jobs")
    await jobs.send_many([1, 2, 3])
    [held] = await jobs.read_many(1)
    await jobs.fail(held, error="boom")
    async with broker.connection() as conn:
        await conn.execute("SELECT pgbroker.sample_queue_history('0 s', '1 day')")
    r = await client.get("/v1/stats/history?minutes=5", headers=auth(keys["admin"]))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert (answer["interval_seconds"], answer["retention_seconds"]) == (10, 86400)
    [sample] = [s for s in answer["samples"] if s["queue_name"] == "jobs"]
    assert (sample["queue_length"], sample["in_flight"], sample["total_sent"]) == (3, 1, 3)
    assert (sample["total_retried"], sample["total_dead_lettered"]) == (1, 0)
    # A key of queues other-* sees their samples only.
    r = await client.get("/v1/stats/history", headers=auth(keys["other"]))
    assert {s["queue_name"] for s in r.json()["samples"]} == {"other-x"}
    for query in ("minutes=0", "minutes=x", "points=0", "points=5000"):
        r = await client.get(f"/v1/stats/history?{query}", headers=auth(keys["admin"]))
        assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_query"), query
    # The live feed has the same figures now.
    r = await client.get("/v1/stats", headers=auth(keys["admin"]))
    [live] = [q for q in r.json()["queues"] if q["queue_name"] == "jobs"]
    assert (live["in_flight"], live["total_retried"], live["total_dead_lettered"]) == (1, 1, 0)


class _AnHourAhead(datetime):
    """The wall clock of an API host an hour ahead of the database's (a VM resumed from sleep)."""

    @classmethod
    def now(cls, tz: tzinfo | None = None) -> _AnHourAhead:
        ahead = datetime.now(tz) + timedelta(hours=1)
        return cls.fromtimestamp(ahead.timestamp(), tz)


async def test_the_history_s_minutes_are_counted_on_the_database_s_clock(
    client: httpx.AsyncClient, keys: dict[str, str], broker: AsyncBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stamps the samples: an API host whose clock is an hour ahead asked for the
    samples since its own "5 minutes ago" and got none."""
    await make_queue(client, keys["admin"])
    async with broker.connection() as conn:
        await conn.execute("SELECT pgbroker.sample_queue_history('0 s', '1 day')")
    monkeypatch.setattr(monitoring_routes, "datetime", _AnHourAhead, raising=False)
    r = await client.get("/v1/stats/history?minutes=5", headers=auth(keys["admin"]))
    assert r.status_code == 200, r.text
    assert [s["queue_name"] for s in r.json()["samples"]] == ["jobs"]


async def test_workers_lists_queue_workers_and_stream_consumers_the_key_sees(
    client: httpx.AsyncClient, keys: dict[str, str], broker: AsyncBroker
) -> None:
    await make_queue(client, keys["admin"])
    await make_queue(client, keys["admin"], "other-x")
    worker = uuid.uuid4()
    async with broker.connection() as conn:
        for queue in ("jobs", "other-x"):
            await conn.execute(
                "SELECT pgbroker.worker_heartbeat(%s, %s, 'web-1', 4242, 4, 2, 17, 3, 1)",
                (queue, worker if queue == "jobs" else uuid.uuid4()),
            )
    stream = AsyncStream(broker, "clicks")
    await stream.create()
    await stream.create_group("billing")
    await stream.consumer("billing", name="consumer-a").read(10)
    r = await client.get("/v1/workers", headers=auth(keys["admin"]))
    assert r.status_code == 200, r.text
    answer = r.json()
    [mine] = [w for w in answer["queue_workers"] if w["queue_name"] == "jobs"]
    assert mine["worker_id"] == str(worker)
    assert (mine["host"], mine["pid"], mine["concurrency"], mine["in_flight"]) == ("web-1", 4242, 4, 2)
    assert (mine["completed"], mine["retried"], mine["dead_lettered"]) == (17, 3, 1)
    assert 0 <= mine["heartbeat_age_sec"] < 60
    [consumer] = answer["stream_consumers"]
    assert consumer["stream"] == "clicks"
    assert (consumer["group"], consumer["consumer"]) == ("billing", "consumer-a")
    r = await client.get("/v1/workers", headers=auth(keys["other"]))
    assert [w["queue_name"] for w in r.json()["queue_workers"]] == ["other-x"]
    assert r.json()["stream_consumers"] == []
