"""The HTTP server against hostile clients: sockets that send nothing or their headers a byte at
a time, uploads cut off mid-body, database failures whose text names the server's files, crowds
of requests, and floods of made-up API keys."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from pgbroker._db.api_keys import create_key
from pgbroker.http import Settings
from pgbroker.queues._client_async import AsyncBroker
from tests.http.live import pgbroker_serve
from tests.support.http import auth, client_for


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)))


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (what it sends is read)."""
    sock.settimeout(within)
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            if sock.recv(65536) == b"":
                return True
    except (TimeoutError, ConnectionResetError):
        return False
    return False


def test_silent_slow_and_idle_connections_are_closed(dsn: str) -> None:
    with pgbroker_serve(dsn, "--head-timeout", "1", "--keep-alive", "1") as server:
        silent = [_connect(server.url) for _ in range(50)]
        slow = _connect(server.url)
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        idle = _connect(server.url)
        idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        started = time.monotonic()
        try:
            for _ in range(10):  # a header a byte at a time, each in time, the whole too late
                slow.sendall(b"X")
                time.sleep(0.5)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed already
        # Far beyond the 1 s deadlines; before the change, none of them was ever closed.
        assert all(_closed_by_server(s, within=30) for s in [*silent, slow, idle])
        assert time.monotonic() - started >= 1.0
        for s in [*silent, slow, idle]:
            s.close()
        assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_a_body_dribbled_in_is_cut_off(dsn: str, conn: psycopg.Connection[Any]) -> None:
    _, token = create_key(conn, "admin", scopes=["admin"])
    conn.execute("SELECT pgmq.create('jobs')")
    with pgbroker_serve(dsn, "--body-timeout", "1") as server:
        sock = _connect(server.url)
        sock.sendall(
            b"POST /v1/queues/jobs/messages HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {token}\r\n".encode()
            + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        sock.settimeout(30)  # far beyond the 1 s deadline; before it, the server waited for ever
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        sock.close()
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"request_timeout" in answer
    assert conn.execute("SELECT count(*) FROM pgmq.q_jobs").fetchone() == (0,)


def test_a_client_gone_mid_upload_leaves_no_traceback(dsn: str, conn: psycopg.Connection[Any]) -> None:
    _, token = create_key(conn, "admin", scopes=["admin"])
    conn.execute("SELECT pgmq.create('jobs')")
    with pgbroker_serve(dsn) as server:
        for _ in range(3):
            sock = _connect(server.url)
            sock.sendall(
                b"POST /v1/queues/jobs/messages HTTP/1.1\r\nHost: x\r\n"
                + f"Authorization: Bearer {token}\r\n".encode()
                + b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                + b'{"message": "'
                + b"x" * 1000
            )
            time.sleep(0.5)  # the server is reading the body
            sock.close()
        time.sleep(1)
        r = httpx.get(f"{server.url}/v1/queues", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200
        log = server.log()
        assert "Traceback" not in log, log
        assert "internal_error" not in log, log
    assert conn.execute("SELECT count(*) FROM pgmq.q_jobs").fetchone() == (0,)


@pytest.mark.anyio
async def test_a_database_failure_is_told_without_the_servers_text(
    broker: AsyncBroker, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    _, token = create_key(conn, "admin", scopes=["admin"])
    conn.execute("SELECT pgmq.create('jobs')")
    row = conn.execute(
        "SELECT current_setting('data_directory'), pg_relation_filepath('pgmq.q_jobs')"
    ).fetchone()
    assert row is not None
    data_dir, relation = row
    Path(data_dir, relation).unlink()  # a missing data file: the server's error names its path
    async with client_for(broker, token=token) as client:
        with caplog.at_level(logging.ERROR, logger="pgbroker.http"):
            r = await client.post("/v1/queues/jobs/read", json={})
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "database_error"
    assert "58P01" in error["message"]
    for told in (relation, data_dir, "could not open"):
        assert told not in r.text
    request_id = r.headers["x-request-id"]
    assert request_id in error["hint"]
    logged = [rec for rec in caplog.records if request_id in rec.getMessage()]
    [record] = logged
    assert record.exc_info is not None
    assert "could not open file" in str(record.exc_info[1])


@pytest.mark.anyio
async def test_requests_past_the_concurrency_limit_are_answered_busy(
    broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    _, token = create_key(conn, "admin", scopes=["admin"])
    conn.execute("SELECT pgmq.create('jobs')")
    settings = Settings(
        key_cache_seconds=0,
        rate_per_second=1000,
        rate_burst=1000,
        max_concurrency=2,
        max_concurrency_per_key=3,  # (this one key may hold every slot)
    )
    async with client_for(broker, settings, token) as client:
        polls = [asyncio.create_task(client.post("/v1/queues/jobs/read", json={"wait": 3})) for _ in range(2)]
        await asyncio.sleep(1)  # both long polls are waiting
        busy = await client.get("/v1/queues")
        assert busy.status_code == 503, busy.text
        assert busy.json()["error"]["code"] == "server_busy"
        assert busy.headers["retry-after"] == "1"
        assert [r.status_code for r in await asyncio.gather(*polls)] == [200, 200]
        assert (await client.get("/v1/queues")).status_code == 200


@pytest.mark.anyio
async def test_one_key_cannot_hold_every_request_slot(
    broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    # --max-concurrency bounds the requests of every key together, long polls included. One key
    # holding every slot with long polls on an empty queue of its own (256 of them every 20 s is
    # 13 requests a second, far within a key's rate) left every other key 503 server_busy: one
    # tenant locked the others out. A key has at most half of the slots.
    hog = auth(create_key(conn, "hog", scopes=["admin"], queues=["hog"])[1])
    other = auth(create_key(conn, "other", scopes=["read"], queues=["other"])[1])
    conn.execute("SELECT pgmq.create('hog')")
    settings = Settings(key_cache_seconds=0, rate_per_second=1000, rate_burst=1000, max_concurrency=4)
    async with client_for(broker, settings) as client:
        # Long polls of the hog, one after the other, until one is answered at once: refused.
        polls: list[asyncio.Task[httpx.Response]] = []
        while not polls or not polls[-1].done():
            assert len(polls) < 8, "no long poll was refused"
            polls.append(
                asyncio.create_task(client.post("/v1/queues/hog/read", json={"wait": 20}, headers=hog))
            )
            await asyncio.wait(polls[-1:], timeout=0.5)  # a waiting poll takes 20 s, a refusal none
        refused = polls[-1].result()
        assert (refused.status_code, refused.json()["error"]["code"]) == (429, "rate_limited"), refused.text
        assert refused.headers["retry-after"] == "1"
        r = await client.get("/v1/queues", headers=other)
        assert r.status_code == 200, r.text
        await broker.queue("hog").send_many([{"n": i} for i in range(4)])  # the polls end
        assert [r.status_code for r in await asyncio.gather(*polls)] == [200, 200, 429]
        assert (await client.get("/v1/queues", headers=hog)).status_code == 200


async def _hold_until_refused(
    client: httpx.AsyncClient, queue: str, headers: dict[str, str]
) -> list[asyncio.Task[httpx.Response]]:
    """Long polls of a key on its empty queue, one after the other, until one is answered at once."""
    polls: list[asyncio.Task[httpx.Response]] = []
    while not polls or not polls[-1].done():
        assert len(polls) < 16, "no long poll was refused"
        polls.append(
            asyncio.create_task(client.post(f"/v1/queues/{queue}/read", json={"wait": 20}, headers=headers))
        )
        await asyncio.wait(polls[-1:], timeout=0.5)  # a waiting poll takes 20 s, a refusal none
    return polls


@pytest.mark.anyio
async def test_two_keys_cannot_hold_every_request_slot(
    broker: AsyncBroker, conn: psycopg.Connection[Any]
) -> None:
    # Each key at its share (half of --max-concurrency), two keys held every slot with long polls,
    # and every other key was answered 503 server_busy. The last quarter of the slots go one per
    # key with none in hand: a third key is served while both hogs hold all they may.
    hogs = [auth(create_key(conn, f"hog{n}", scopes=["read"], queues=[f"hog{n}"])[1]) for n in (1, 2)]
    other = auth(create_key(conn, "other", scopes=["read"], queues=["other"])[1])
    conn.execute("SELECT pgmq.create('hog1'), pgmq.create('hog2'), pgmq.create('other')")
    settings = Settings(key_cache_seconds=0, rate_per_second=1000, rate_burst=1000, max_concurrency=8)
    async with client_for(broker, settings) as client:
        polls = [await _hold_until_refused(client, f"hog{n}", hogs[n - 1]) for n in (1, 2)]
        assert [len(p) - 1 for p in polls] == [4, 2]  # the first at its share, the second short of it
        refused = polls[1][-1].result()
        assert (refused.status_code, refused.json()["error"]["code"]) == (429, "rate_limited"), refused.text
        assert "kept for keys with none" in refused.json()["error"]["message"]
        assert refused.headers["retry-after"] == "1"
        r = await client.post("/v1/queues/other/read", json={}, headers=other)
        assert r.status_code == 200, r.text
        for n in (1, 2):
            await broker.queue(f"hog{n}").send_many([{"n": i} for i in range(4)])  # the polls end
        for held in polls:
            assert [r.status_code for r in await asyncio.gather(*held)] == [200] * (len(held) - 1) + [429]


@pytest.mark.anyio
async def test_made_up_keys_stop_reaching_the_database(
    broker: AsyncBroker, conn: psycopg.Connection[Any], dsn: str
) -> None:
    _, token = create_key(conn, "admin", scopes=["admin"])
    secret = token.split("_", 2)[2]
    settings = Settings(
        key_cache_seconds=5,
        rate_per_second=1000,
        rate_burst=1000,
        auth_failures_per_second=0.01,
        auth_failure_burst=5,
    )
    async with client_for(broker, settings) as client:

        async def status(key_id: int) -> int:
            r = await client.get("/v1/queues", headers={"Authorization": f"Bearer pgb_{key_id}_{secret}"})
            return r.status_code

        assert (
            await client.get("/v1/queues", headers={"Authorization": f"Bearer {token}"})
        ).status_code == 200
        assert [await status(900_000 + i) for i in range(5)] == [401] * 5
        # With the keys table locked, a lookup would wait for the lock: the answers come at once.
        with psycopg.connect(dsn) as locker, locker.transaction():
            locker.execute("LOCK TABLE pgbroker.api_keys IN ACCESS EXCLUSIVE MODE")
            answers = await asyncio.wait_for(
                asyncio.gather(*(status(900_100 + i) for i in range(50))), timeout=20
            )
            assert set(answers) == {429}
            # A key the server knows still passes: it is not looked up again.
            r = await client.get("/v1/queues", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200
