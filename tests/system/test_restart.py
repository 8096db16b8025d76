"""A restart of Postgres costs no call once the server accepts connections again: `pgbroker serve`
and the clients find the pooled connections the restart closed before they use them
(pgbroker._db.liveness), so no request fails on one.

The cluster is a private embedded one, so that restarting it disturbs no other test.
"""

from __future__ import annotations

import httpx
import psycopg
import pytest

from pgbroker import Broker
from pgbroker._db.api_keys import create_key
from pgbroker.embedded import EmbeddedPostgres
from tests.http.live import pgbroker_serve
from tests.support.postgres import _restart_and_wait

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
