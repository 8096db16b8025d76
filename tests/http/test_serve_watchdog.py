"""Watchdog of ``pgbroker serve`` (issue 23, item 2): a transient database failure while the
server runs (its role's 200 ms lock_timeout meeting a maintenance lock on the queue table, then
every session of its database terminated) fails the requests it meets with a 503 that says to
retry, never leaves the server stuck: afterwards sends and a long-polling read work again."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import replace
from typing import Any

import httpx
import psycopg
import pytest

from pgbroker._db.api_keys import create_key
from pgbroker._db.dsn import pooler_mode
from pgbroker._db.liveness import STOP_PATIENCE
from pgbroker._db.pools import PoolTimeouts
from pgbroker.http import create_app
from pgbroker.http.app import _server_pool
from pgbroker.http.replica import HEALTH_INTERVAL, WatchedReplica
from pgbroker.http.replica import POOL_NAME as REPLICA_POOL
from tests.http.live import pgbroker_serve
from tests.support.faults import (
    freezable,
    impatient,
    sessions_frozen,
    sessions_open,
    table_locked,
    terminate_sessions,
)
from tests.support.http import SETTINGS, auth


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


# The bound the next test gives a request's database calls past its wait: far above what they
# take (milliseconds), short for the test.
ANSWER_WITHIN = 5.0
# How soon past its bound a request given up must be answered: the driver's own wait for the
# cancel of a frozen call (5 s) is more, the machine's scheduling under load far less.
PROMPTLY = 4.0


@pytest.mark.anyio
async def test_requests_on_a_database_that_hangs_answer_503_past_their_bound_and_work_again_after(
    dsn: str, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Every session of the server's pool (2, as serve makes it) stops answering (frozen with
    SIGSTOP): a send and a long-polling read each answer 503 with Retry-After (outcome_unknown,
    database_unavailable) once the bound past their wait has run out, and a warning says so; the
    sessions given up are closed, so the next request, on new ones, is answered while the old ones
    still hang, and every request once the hang ends. A long poll longer than the bound itself is
    not cut. Each request waited for as long as the hang lasted (for good behind a stuck pooler),
    holding its pool connection: a few hung sessions starved the whole API without a word."""
    _, token = create_key(conn, "watchdog", scopes=["admin"])
    conn.commit()
    # Keys cached: the requests meet the hang in their own calls, after the key's look-up.
    settings = replace(
        SETTINGS, key_cache_seconds=3600, answer_within_seconds=ANSWER_WITHIN, history_retention_seconds=0
    )
    app = create_app(freezable(dsn), settings=settings, max_connections=2)
    transport = httpx.ASGITransport(app=app)
    caplog.set_level(logging.WARNING, logger="pgbroker.http")

    async def send(n: int) -> httpx.Response:
        return await client.post("/v1/queues/jobs/messages", json={"message": {"n": n}})

    async def timed_send(n: int) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        return await send(n), time.monotonic() - started

    async def read(queue: str, wait: float) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        answer = await client.post(f"/v1/queues/{queue}/read", json={"qty": 10, "vt": 60, "wait": wait})
        return answer, time.monotonic() - started

    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://test", headers=auth(token)) as client,
    ):
        for name in ("jobs", "quiet"):
            assert (await client.post("/v1/queues", json={"name": name})).status_code == 201
        long_poll, waited = await read("quiet", ANSWER_WITHIN + 1)
        assert long_poll.status_code == 200, long_poll.text
        assert long_poll.json()["messages"] == []
        assert waited >= ANSWER_WITHIN + 1

        with sessions_frozen(dsn) as frozen:
            assert len(frozen) >= 2  # both pooled sessions
            (sent, sent_for), (polled, polled_for) = await asyncio.wait_for(
                asyncio.gather(timed_send(0), read("quiet", 1)), 60
            )
            # The send may yet be run by the server: its outcome is unknown (retry it with an
            # Idempotency-Key); the read is only unavailable.
            for answer, code in ((sent, "outcome_unknown"), (polled, "database_unavailable")):
                assert answer.status_code == 503, answer.text
                assert answer.json()["error"]["code"] == code, answer.text
                assert answer.headers["Retry-After"] == "1"
            assert sent_for >= ANSWER_WITHIN
            assert polled_for >= ANSWER_WITHIN + 1  # its wait allowed for
            # Answered once the bound runs out, not after the driver's cancel of the frozen call
            # too (5 s more, waited out in the background now).
            assert sent_for < ANSWER_WITHIN + PROMPTLY, f"the send answered after {sent_for:.1f} s"
            assert polled_for < ANSWER_WITHIN + 1 + PROMPTLY, f"the read answered after {polled_for:.1f} s"
            unanswered = [r for r in caplog.records if r.getMessage().startswith("serve.request_unanswered")]
            assert [r.levelno for r in unanswered] == [logging.WARNING] * 2
            # Neither hung session went back to the pool: this one runs on a new one.
            assert (await asyncio.wait_for(send(1), 60)).status_code == 201

        assert [(await send(n)).status_code for n in (2, 3)] == [201, 201]
        # The given-up send may have been run once its session went on: 0 may be there too.
        drained, _ = await read("jobs", 0)
        assert {1, 2, 3} <= {m["message"]["n"] for m in drained.json()["messages"]}


def test_serve_answer_within_sets_the_bound_of_a_request_on_a_database_that_hangs(dsn: str) -> None:
    """`pgbroker serve --answer-within 1`: a request whose sessions hang answers 503 about 1 s
    past its wait, not the default 30 s; the option was missing, so the bound could be set only
    from Python."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SELECT pgmq.create('jobs')")
    with (
        pgbroker_serve(
            freezable(dsn), "--public-metrics", "--connections", "2", "--answer-within", "1"
        ) as server,
        httpx.Client(base_url=server.url, timeout=90) as client,
    ):
        assert client.get("/metrics").status_code == 200
        with sessions_frozen(dsn) as frozen:
            assert frozen
            started = time.monotonic()
            hung = client.get("/metrics")
            took = time.monotonic() - started
        assert hung.status_code == 503, hung.text
        assert hung.json()["error"]["code"] == "database_unavailable", hung.text
        assert took < 25, f"answered after {took:.1f} s: the default bound (30 s), not 1 s"


def test_a_replica_watch_closed_as_the_replica_is_suspected_ends(dsn: str) -> None:
    """`pgbroker serve --replica-dsn` closes its replica's watch at shutdown, and waits for it. A
    watch told to look at the replica (a report failed on it) as it was closed went on: it waited
    for that with asyncio.wait_for, which on Python 3.11 returns when the event comes together
    with the cancellation (CPython gh-86296), so it looked at the replica and watched on, and the
    shutdown waited for good. Every turn of the event loop between the two is tried."""
    mode = pooler_mode(None)
    timeouts = PoolTimeouts()

    async def scenario() -> list[int]:
        stuck = []
        for turns in range(12):
            watched = WatchedReplica(
                dsn, lambda: _server_pool(dsn, 2, mode, timeouts, REPLICA_POOL), timeouts, mode
            )
            await watched.start()
            watched.suspect()
            for _ in range(turns):
                await asyncio.sleep(0)
            closing = asyncio.create_task(watched.close())
            done, _ = await asyncio.wait([closing], timeout=3 * HEALTH_INTERVAL)
            if not done:
                stuck.append(turns)
                assert watched._task is not None
                watched._task.cancel()
                await closing
        return stuck

    assert asyncio.run(scenario()) == [], "watches that went on after close() (turns)"


# psycopg's own wait for the cancel of a query whose task is cancelled, before it closes the
# connection: what the stop of serve waited for on a hung server, past its stop's patience.
DRIVER_CANCEL_WAIT = 5.0


@pytest.mark.anyio
async def test_serve_stops_within_its_stop_patience_while_a_history_sample_hangs(dsn: str) -> None:
    """Every session of serve's pool frozen while the history sampler's round is in flight, then the
    server stops: its shutdown gives the round STOP_PATIENCE, as every long-running command gives a
    call at its stop. The sampler was cancelled instead, and the shutdown waited for psycopg's
    cancel of the frozen query (5 s), pgbroker serve's SIGTERM taking 5.5 s where the scheduler
    took 3.1 s."""
    settings = replace(SETTINGS, history_interval_seconds=0.5)
    app = create_app(freezable(dsn), settings=settings, max_connections=2)
    running = app.router.lifespan_context(app)
    await running.__aenter__()
    stopped = False
    try:
        await asyncio.to_thread(sessions_open, dsn, 2)  # the pool opens them on this loop
        with sessions_frozen(dsn) as frozen:
            assert len(frozen) >= 2
            await asyncio.sleep(2.0)  # a round starts every 0.5 s: one waits on a frozen session now
            asked = time.monotonic()
            stopped = True
            await running.__aexit__(None, None, None)
            took = time.monotonic() - asked
    finally:
        if not stopped:
            await running.__aexit__(None, None, None)
    assert took >= STOP_PATIENCE - 0.5, f"{took:.1f} s: no round was in flight"
    assert took < DRIVER_CANCEL_WAIT, f"the shutdown took {took:.1f} s"
