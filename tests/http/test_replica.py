"""``pgbroker serve --replica-dsn``: the reporting operations read from a streaming standby (a
real one, tests/support/replication.py) and say how far behind it is; writes go to the primary.

The standby's replay is paused while the primary takes more messages, so what each answer shows
says which server it came from.
"""

from __future__ import annotations

import re
import time

import httpx
import psycopg
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from pgbroker import Broker
from pgbroker._db.api_keys import create_key
from pgbroker.embedded import EmbeddedPostgres
from pgbroker.http import create_app
from pgbroker.http.routes import all_operations
from pgbroker.queues._client_async import AsyncBroker
from tests.http.live import pgbroker_serve
from tests.support.browser import row_text, use_key, wait_for
from tests.support.replication import multi_host_dsn, pause_replay, resume_replay, wait_caught_up

pytestmark = pytest.mark.slow

LAG_GAUGE = re.compile(r"^pgbroker_replica_replay_lag_seconds (\S+)$", re.MULTILINE)


def _jobs_length(http: httpx.Client) -> int:
    answer = http.get("/v1/stats")
    assert answer.status_code == 200, answer.text
    (jobs,) = [q for q in answer.json()["queues"] if q["queue_name"] == "jobs"]
    return int(jobs["queue_length"])


def test_serve_reports_from_the_replica_and_writes_to_the_primary(
    replicated: tuple[EmbeddedPostgres, EmbeddedPostgres],
) -> None:
    primary, standby = replicated
    with Broker(primary.dsn(), max_connections=1) as broker:
        jobs = broker.create_queue("jobs")
        broker.create_queue("jobs_dlq")
        jobs.set_policy(max_deliveries=1, dead_letter_queue="jobs_dlq")
        jobs.send_many([{"n": n} for n in range(3)])
        leased = jobs.read(vt=30)
        assert leased is not None
        jobs.fail(leased, error="boom")  # the one delivery it had: a dead letter
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        _, token = create_key(conn, "reports", scopes=["send", "read"])
    wait_caught_up(primary, standby)
    pause_replay(standby)
    with (
        pgbroker_serve(primary.dsn(), "--replica-dsn", standby.dsn(), "--connections", "2") as server,
        httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {token}"}, timeout=30) as http,
    ):
        sent = http.post("/v1/queues/jobs/messages", json={"messages": [{"n": n} for n in range(3, 8)]})
        assert sent.status_code == 201, server.log()  # a write: the primary's
        with Broker(primary.dsn(), max_connections=1) as broker:
            assert broker.queue("jobs").metrics().queue_length == 7

        # Every reporting operation answers from the paused replica: what it held before the sends.
        stats = http.get("/v1/stats").json()
        assert [q["queue_length"] for q in stats["queues"] if q["queue_name"] == "jobs"] == [2]
        assert stats["replica_lag_seconds"] > 0
        assert http.get("/v1/queues/jobs/metrics").json()["queue_length"] == 2
        assert len(http.get("/v1/queues/jobs/peek").json()["messages"]) == 2
        (dead,) = http.get("/v1/queues/jobs/dead-letters").json()["messages"]
        assert dead["message"] == {"n": 0}
        metrics = http.get("/metrics").text
        assert 'pgbroker_queue_length{queue="jobs"} 2.0' in metrics
        lag = LAG_GAUGE.search(metrics)
        assert lag is not None, metrics
        assert float(lag.group(1)) > 0
        # None of them writes (a standby would refuse with 25006, answered 503).
        for operation in all_operations():
            if operation.reporting:
                path = operation.path.replace("{queue}", "jobs")
                answer = http.request(operation.method, path)
                assert answer.status_code == 200, f"{operation.method} {path}: {answer.text}"

        resume_replay(standby)
        deadline = time.monotonic() + 60
        while _jobs_length(http) != 7 or http.get("/v1/stats").json()["replica_lag_seconds"] != 0:
            assert time.monotonic() < deadline, "the replica's figures did not catch up"
            time.sleep(0.1)
        assert 'pgbroker_queue_length{queue="jobs"} 7.0' in http.get("/metrics").text


def test_a_replica_dsn_preferring_a_standby_falls_back_to_the_primary_when_none_is_left(
    replicated: tuple[EmbeddedPostgres, EmbeddedPostgres],
) -> None:
    primary, standby = replicated
    with Broker(primary.dsn(), max_connections=1) as broker:
        broker.create_queue("jobs").send({"n": 1})
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        _, token = create_key(conn, "reports", scopes=["send", "read"])
    wait_caught_up(primary, standby)
    replica_dsn = multi_host_dsn(primary, standby, attrs="prefer-standby")
    with (
        pgbroker_serve(primary.dsn(), "--replica-dsn", replica_dsn, "--connections", "2") as server,
        httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {token}"}, timeout=60) as http,
    ):
        assert http.get("/v1/stats").json()["replica_lag_seconds"] == 0
        with psycopg.connect(replica_dsn) as conn:
            assert conn.info.port == standby.port  # the standby first, though listed second
        standby.stop()
        assert http.post("/v1/queues/jobs/messages", json={"message": {"n": 2}}).status_code == 201
        # The replica's pool reconnects by the same DSN and gets the primary: the figures are
        # the latest (a request may fail while it finds its connections gone: 503).
        deadline = time.monotonic() + 60
        while (answer := http.get("/v1/stats")).status_code != 200 or _jobs_length(http) != 2:
            assert time.monotonic() < deadline, f"the reports never reached the primary: {answer.text}"
            time.sleep(0.1)
        assert answer.json()["replica_lag_seconds"] == 0


@pytest.mark.anyio
async def test_create_app_takes_an_opened_replica_broker(
    replicated: tuple[EmbeddedPostgres, EmbeddedPostgres],
) -> None:
    primary, standby = replicated
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        conn.execute("SELECT pgmq.create('jobs')")
        _, token = create_key(conn, "reports", scopes=["send", "read"])
    wait_caught_up(primary, standby)
    pause_replay(standby)
    async with (
        AsyncBroker(primary.dsn(), max_connections=2) as on_primary,
        AsyncBroker(standby.dsn(), max_connections=2) as on_replica,
    ):
        app = create_app(broker=on_primary, replica=on_replica)
        transport = httpx.ASGITransport(app=app)
        headers = {"authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://pgbroker.test", headers=headers
        ) as http:
            sent = await http.post("/v1/queues/jobs/messages", json={"message": {"n": 1}})
            assert sent.status_code == 201, sent.text
            stats = (await http.get("/v1/stats")).json()
    assert [q["queue_length"] for q in stats["queues"]] == [0]  # the paused replica's
    assert stats["replica_lag_seconds"] > 0
    with pytest.raises(ValueError, match="at most one of replica_dsn and replica"):
        create_app(broker=on_primary, replica=on_replica, replica_dsn=standby.dsn())


def test_without_a_replica_the_figures_are_the_primary_s_and_no_lag_is_shown(dsn: str) -> None:
    with Broker(dsn, max_connections=1) as broker:
        broker.create_queue("jobs").send({"n": 1})
    with psycopg.connect(dsn, autocommit=True) as conn:
        _, token = create_key(conn, "reports", scopes=["read"])
    with (
        pgbroker_serve(dsn, "--connections", "2") as server,
        httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {token}"}, timeout=30) as http,
    ):
        assert _jobs_length(http) == 1
        assert http.get("/v1/stats").json()["replica_lag_seconds"] is None
        assert "pgbroker_replica_replay_lag_seconds" not in http.get("/metrics").text


def test_the_dashboard_says_its_figures_come_from_a_replica_and_how_far_behind(
    replicated: tuple[EmbeddedPostgres, EmbeddedPostgres], browser: WebDriver
) -> None:
    primary, standby = replicated
    with Broker(primary.dsn(), max_connections=1) as broker:
        broker.create_queue("jobs").send({"n": 1})
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        _, token = create_key(conn, "dashboard", scopes=["read"])
    wait_caught_up(primary, standby)
    pause_replay(standby)
    with Broker(primary.dsn(), max_connections=1) as broker:
        broker.queue("jobs").send({"n": 2})  # the replica will not show it
    with pgbroker_serve(primary.dsn(), "--replica-dsn", standby.dsn(), "--connections", "2") as server:
        browser.get(f"{server.url}/dashboard?refresh=400")
        use_key(browser, token)
        wait_for(browser, "the queue's row", lambda d: row_text(d, 'tr[data-queue="jobs"]'))
        status = wait_for(
            browser,
            "the status line to name the replica",
            lambda d: re.search(
                r"from a replica ([0-9.]+) s behind the primary", d.find_element(By.ID, "status").text
            ),
        )
        assert float(status.group(1)) > 0
        assert row_text(browser, 'tr[data-queue="jobs"] td.length') == "1"  # the replica's past
