"""Watchdog of ``pgbroker serve`` (issue 23, item 2): a transient database failure while the
server runs (its role's 200 ms lock_timeout meeting a maintenance lock on the queue table, then
every session of its database terminated) fails the requests it meets with a 503 that says to
retry, never leaves the server stuck: afterwards sends and a long-polling read work again."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import psycopg

from pgbroker._db.api_keys import create_key
from tests.http.live import pgbroker_serve
from tests.support.faults import freezable, impatient, sessions_frozen, table_locked, terminate_sessions
from tests.support.http import auth


def test_serve_answers_503_during_faults_and_works_again_after(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    _, token = create_key(conn, "watchdog", scopes=["admin"])
    conn.commit()
    headers = auth(token)
    with (
        pgbroker_serve(impatient(dsn), "--rate", "1000", "--burst", "1000") as server,
        httpx.Client(base_url=server.url, headers=headers, timeout=60) as client,
    ):
        assert client.post("/v1/queues", json={"name": "jobs"}).status_code == 201
        assert client.post("/v1/queues/jobs/messages", json={"message": {"n": 0}}).status_code == 201

        with table_locked(dsn, "pgmq.q_jobs"):
            during = client.post("/v1/queues/jobs/messages", json={"message": {"n": 1}})
        assert during.status_code == 503, during.text
        assert during.headers.get("Retry-After") == "1", during.headers
        terminate_sessions(dsn)

        answers = [client.post("/v1/queues/jobs/messages", json={"message": {"n": n}}) for n in (2, 3)]
        assert [a.status_code for a in answers] == [201, 201], [a.text for a in answers]

        # A long-polling read on an empty queue is woken by a send after the faults.
        drained = client.post("/v1/queues/jobs/read", json={"qty": 10, "vt": 60})
        assert sorted(m["message"]["n"] for m in drained.json()["messages"]) == [0, 2, 3]
        got: list[httpx.Response] = []
        reader = threading.Thread(
            target=lambda: got.append(client.post("/v1/queues/jobs/read", json={"qty": 1, "wait": 20}))
        )
        started = time.monotonic()
        reader.start()
        time.sleep(0.5)
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as sender:
            assert sender.post("/v1/queues/jobs/messages", json={"message": {"n": 4}}).status_code == 201
        reader.join(60)
        assert time.monotonic() - started < 15, "the read was not woken"
        assert [m["message"]["n"] for m in got[0].json()["messages"]] == [4]


def test_health_answers_503_on_a_database_that_hangs_and_200_again_without_a_restart(dsn: str) -> None:
    """Every session of serve's pool stops answering (its backends frozen with SIGSTOP, as a hung
    server, a stuck pooler or a network that drops packets without a word would leave them):
    /healthz answers 503 database_unavailable within its bound, and 200 again once the pool has
    replaced the sessions it gave up on, while the old ones still hang. It waited for the answer
    for as long as the hang lasted (for good behind a stuck pooler): a probe saw no answer at all,
    and each probe held one more of the pool's connections."""
    with (
        pgbroker_serve(freezable(dsn), "--connections", "2") as server,
        httpx.Client(base_url=server.url, timeout=90) as client,
    ):
        assert client.get("/healthz").status_code == 200
        with sessions_frozen(dsn) as frozen:
            assert frozen
            started = time.monotonic()
            hung = client.get("/healthz")
            assert hung.status_code == 503, hung.text
            assert hung.json()["error"]["code"] == "database_unavailable", hung.text
            assert time.monotonic() - started < 60
            # Each 503 closed the session it gave up on; the pool (2) opens new ones.
            deadline = time.monotonic() + 120
            while (answer := client.get("/healthz")).status_code != 200:
                assert answer.status_code == 503, answer.text
                assert time.monotonic() < deadline, "no 200 while the first sessions hang"


def test_the_history_sampler_gives_up_on_a_database_that_hangs_and_samples_again(dsn: str) -> None:
    """Every session of serve's pool stops answering (frozen with SIGSTOP) while it samples the
    dashboard's history every second: the sampler gives its round up (logged) and samples again on
    new sessions, the old ones still hanging. It waited for the answer for as long as the hang
    lasted (for good behind a stuck pooler), and the history stopped without a word."""

    def samples() -> int:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT count(*) FROM pgbroker.queue_history").fetchone()
        assert row is not None
        return int(row[0])

    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT pgmq.create('jobs')")
    with pgbroker_serve(freezable(dsn), "--history-interval", "1s", "--connections", "2") as server:
        deadline = time.monotonic() + 30
        while samples() == 0:
            assert time.monotonic() < deadline, "no sample before the hang"
            time.sleep(0.2)
        with sessions_frozen(dsn) as frozen:
            assert frozen
            before = samples()
            deadline = time.monotonic() + 90
            while samples() <= before:
                assert time.monotonic() < deadline, "no sample while the first sessions hang"
                time.sleep(0.5)
        assert "serve.history_sample_failed" in server.log_path.read_text(errors="replace")
