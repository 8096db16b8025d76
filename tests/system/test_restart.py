"""A restart of Postgres costs no call once the server accepts connections again: `pgbroker serve`
and the clients find the pooled connections the restart closed before they use them
(pgbroker._db.liveness), so no request fails on one; a worker loses no message and fails none.

The cluster is a private embedded one, so that restarting it disturbs no other test.
"""

from __future__ import annotations

import asyncio
import logging

import httpx
import psycopg
import pytest

from pgbroker import Broker, Message, Worker
from pgbroker._db.api_keys import create_key
from pgbroker.embedded import EmbeddedPostgres
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.runtime._app import serve
from tests.http.live import pgbroker_serve
from tests.support.postgres import _restart_and_wait
from tests.support.worker import while_serving

pytestmark = pytest.mark.slow

POOL_SIZE = 6  # every pooled connection is dead after the restart: each could cost a request


def test_serve_loses_no_request_to_a_restart(cluster: EmbeddedPostgres) -> None:
    dsn = cluster.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgmq.create('jobs')")
        _, token = create_key(conn, "restart", scopes=["send", "read"])
    headers = {"authorization": f"Bearer {token}"}
    with (
        pgbroker_serve(dsn, "--connections", str(POOL_SIZE)) as server,
        httpx.Client(base_url=server.url, headers=headers, timeout=10) as http,
    ):
        # Fill the pool: concurrent long polls hold every connection at once.
        for i in range(2 * POOL_SIZE):
            assert http.post("/v1/queues/jobs/messages", json={"message": {"before": i}}).status_code == 201
        _restart_and_wait(cluster)
        answers = [
            http.post("/v1/queues/jobs/messages", json={"message": {"after": i}}).status_code
            for i in range(15)
        ]
        assert answers == [201] * 15, server.log()
        read = http.post("/v1/queues/jobs/read", json={"qty": 100, "vt": 30})
        assert read.status_code == 200
    sent = sorted(
        (next(iter(m["message"])), next(iter(m["message"].values()))) for m in read.json()["messages"]
    )
    assert sent == sorted([("before", i) for i in range(2 * POOL_SIZE)] + [("after", i) for i in range(15)])


def test_the_client_loses_no_call_to_a_restart(cluster: EmbeddedPostgres) -> None:
    with Broker(cluster.dsn(), max_connections=POOL_SIZE) as broker:
        jobs = broker.create_queue("jobs")
        jobs.send_many([{"n": i} for i in range(POOL_SIZE)])
        _restart_and_wait(cluster)
        for i in range(15):
            jobs.send({"after": i})
        assert jobs.metrics().queue_length == POOL_SIZE + 15


def test_a_worker_loses_no_message_and_fails_none_to_a_restart(
    cluster: EmbeddedPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    """A restart under a busy worker: every connection of its pool dies at once, with reads and
    acks in flight. The worker waits the server out and goes on; no message is lost, and none is
    counted as a handler failure (retried or dead-lettered): a lost connection is the database's,
    never the handler's. A message is handled again only after a read whose answer the restart cut
    (a later delivery); the outage is said (the listener's warning)."""
    caplog.set_level(logging.WARNING)
    dsn = cluster.dsn()
    with Broker(dsn) as broker:
        broker.create_queue("jobs")
    handled: list[tuple[int, int]] = []

    async def handle(message: Message) -> None:
        handled.append((message.msg_id, message.read_ct))
        await asyncio.sleep(0.02)

    worker = Worker("jobs", handle, concurrency=8, vt=10, poll_max=1.0)

    async def scenario() -> tuple[list[int], int]:
        async with AsyncBroker(dsn, min_connections=8, max_connections=12) as abroker:
            task = asyncio.create_task(serve([worker], broker=abroker, handle_signals=False))
            jobs = abroker.queue("jobs")
            sent = await jobs.send_many([{"n": n} for n in range(1000)])
            await while_serving(task, lambda: len(handled) >= 100, "100 handled before the restart")
            at_restart = len(handled)
            await asyncio.to_thread(_restart_and_wait, cluster)
            async with AsyncBroker(dsn) as after:
                sent += await after.queue("jobs").send_many([{"n": n} for n in range(1000, 1200)])
            await while_serving(
                task, lambda: {m for m, _ in handled} >= set(sent), "every message handled", seconds=120
            )
            await while_serving(task, lambda: worker.stats.completed >= len(sent), "every one acked", 60)
            worker.stop()
            await task
            return sent, at_restart

    sent, at_restart = asyncio.run(scenario())
    assert at_restart < 1000  # the restart came while the worker worked
    with psycopg.connect(dsn) as conn:
        archived = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.a_jobs").fetchall()]
        left = conn.execute("SELECT count(*) FROM pgmq.q_jobs").fetchone()
    assert sorted(archived) == sorted(sent)
    assert left == (0,)
    assert (worker.stats.retried, worker.stats.dead_lettered) == (0, 0)
    deliveries: dict[int, list[int]] = {}
    for msg_id, read_ct in handled:
        deliveries.setdefault(msg_id, []).append(read_ct)
    assert all(reads == sorted(set(reads)) for reads in deliveries.values()), "handled twice in one delivery"
    assert any(r.name == "pgbroker.listen" for r in caplog.records)
