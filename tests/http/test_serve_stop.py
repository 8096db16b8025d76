"""`pgbroker serve` stopped (SIGTERM) with requests in flight: a long poll answers at once with
what it has (an empty answer is a normal one), and a request whose database calls hang gets
STOP_PATIENCE, then 503 (outcome_unknown for a send that may have committed), never a 500; the
process exits 0 within a few seconds. uvicorn waited for such requests up to its graceful timeout
(--max-wait + 5 s: 25 s by default), and then cut a hung one and answered it 500 with a traceback."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psycopg

from pgbroker._db.api_keys import create_key
from pgbroker._db.liveness import STOP_PATIENCE
from tests.http.live import LiveServer, pgbroker_serve
from tests.support.faults import freezable, sessions_frozen, sessions_open
from tests.support.http import auth

# From SIGTERM to the answers and to the exit: STOP_PATIENCE for a hung call, and the scheduling of
# a loaded machine; uvicorn's graceful timeout (25 s by default) is far above.
PROMPTLY = STOP_PATIENCE + 7.0


@contextmanager
def in_flight(calls: dict[str, Callable[[], httpx.Response]]) -> Iterator[dict[str, httpx.Response]]:
    """Each call made on its own thread while inside; their answers by name once out."""
    answers: dict[str, httpx.Response] = {}
    threads = [
        threading.Thread(target=lambda name=name, call=call: answers.__setitem__(name, call()))
        for name, call in calls.items()
    ]
    for thread in threads:
        thread.start()
    try:
        yield answers
    finally:
        for thread in threads:
            thread.join(90)


def stopped(server: LiveServer) -> float:
    """SIGTERM to the server; how long it took to exit (status 0)."""
    asked = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=90) == 0, server.log()
    return time.monotonic() - asked


def test_a_stop_answers_a_long_poll_at_once_with_what_it_has(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """A healthy long poll (wait 20 s) is not cut before the stop; at the stop it answers 200 with
    no messages, and serve exits 0, promptly. The poll held the stop for its whole wait."""
    _, token = create_key(conn, "stop", scopes=["admin"])
    conn.commit()
    conn.execute("SELECT pgmq.create('quiet')")
    conn.commit()
    with (
        pgbroker_serve(dsn) as server,
        httpx.Client(base_url=server.url, headers=auth(token), timeout=90) as client,
    ):
        polls = {"read": lambda: client.post("/v1/queues/quiet/read", json={"qty": 1, "wait": 20})}
        with in_flight(polls) as answers:
            time.sleep(2.0)
            assert not answers, "the long poll answered before its wait and before the stop"
            asked = time.monotonic()
            took = stopped(server)
        answered = time.monotonic() - asked
        assert answers["read"].status_code == 200, answers["read"].text
        assert answers["read"].json() == {"messages": []}
        assert answered < PROMPTLY, f"the long poll answered {answered:.1f} s after SIGTERM"
        assert took < PROMPTLY, f"serve exited {took:.1f} s after SIGTERM"
        assert "Traceback" not in server.log(), server.log()


def test_a_stop_answers_requests_on_a_hung_database_503_and_exits_promptly(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Every session of serve's pool frozen (SIGSTOP) with a send and a long-polling read in flight
    on them, then SIGTERM: each gets STOP_PATIENCE, then 503 with Retry-After (outcome_unknown for
    the send, database_unavailable for the read), and serve exits 0 within a few seconds, with no
    traceback in its log."""
    _, token = create_key(conn, "stop", scopes=["admin"])
    conn.commit()
    for name in ("jobs", "quiet"):
        conn.execute("SELECT pgmq.create(%s)", [name])
    conn.commit()
    with (
        pgbroker_serve(freezable(dsn), "--connections", "2", "--history-retention", "0") as server,
        httpx.Client(base_url=server.url, headers=auth(token), timeout=90) as client,
    ):
        sessions_open(dsn, 2)
        # The key is cached for 5 s from here: the requests below meet the hang in their own calls.
        assert client.post("/v1/queues/jobs/messages", json={"message": {"n": 0}}).status_code == 201
        with sessions_frozen(dsn) as frozen:
            assert len(frozen) >= 2
            calls = {
                "send": lambda: client.post("/v1/queues/jobs/messages", json={"message": {"n": 1}}),
                "read": lambda: client.post("/v1/queues/quiet/read", json={"qty": 1, "wait": 20}),
            }
            with in_flight(calls) as answers:
                time.sleep(1.0)
                asked = time.monotonic()
                took = stopped(server)
            answered = time.monotonic() - asked
        said = server.log()
    for name, code in (("send", "outcome_unknown"), ("read", "database_unavailable")):
        answer = answers[name]
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == code, answer.text
        assert "stopping" in answer.json()["error"]["message"], answer.text
        assert answer.headers["Retry-After"] == "1"
    assert answered < PROMPTLY, f"answered {answered:.1f} s after SIGTERM"
    assert took < PROMPTLY, f"serve exited {took:.1f} s after SIGTERM"
    assert "Traceback" not in said, said
