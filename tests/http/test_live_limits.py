"""Authentication and limits through a real socket: ``pgbroker serve`` (uvicorn, httptools) in its
own process, so that nothing in the HTTP server in front of the app bypasses them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import psycopg

from pgbroker._db.api_keys import create_key
from tests.http.live import pgbroker_serve


def test_keys_scopes_sizes_and_rates_on_a_live_server(dsn: str, conn: psycopg.Connection[Any]) -> None:
    _, admin = create_key(conn, "admin", scopes=["admin"], rate_per_second=1000)
    _, reader = create_key(conn, "reader", scopes=["read"], rate_per_second=1000)
    _, slow = create_key(conn, "slow", scopes=["read"])  # the server's default: --rate 0.5 --burst 2
    conn.execute("SELECT pgmq.create('jobs')")
    with (
        pgbroker_serve(dsn, "--max-body", "1000", "--rate", "0.5", "--burst", "2") as server,
        httpx.Client(base_url=server.url) as http,
    ):

        def code(r: httpx.Response) -> tuple[int, str]:
            return r.status_code, r.json()["error"]["code"]

        assert code(http.get("/v1/queues")) == (401, "unauthorized")
        assert code(http.get("/v1/queues", headers={"Authorization": f"Bearer {admin}x"})) == (
            401,
            "unauthorized",
        )
        as_reader = {"Authorization": f"Bearer {reader}"}
        r = http.post("/v1/queues/jobs/messages", json={"message": 1}, headers=as_reader)
        assert code(r) == (403, "forbidden")

        as_admin = {"Authorization": f"Bearer {admin}"}
        r = http.post("/v1/queues/jobs/messages", json={"message": "x" * 2000}, headers=as_admin)
        assert code(r) == (413, "request_too_large")

        def chunks() -> Iterator[bytes]:  # chunked: no Content-Length to refuse up front
            yield b'{"message": "'
            for _ in range(20):
                yield b"x" * 100
            yield b'"}'

        r = http.post("/v1/queues/jobs/messages", content=chunks(), headers=as_admin)
        assert code(r) == (413, "request_too_large")
        assert (
            http.post("/v1/queues/jobs/messages", json={"message": "ok"}, headers=as_admin).status_code == 201
        )

        as_slow = {"Authorization": f"Bearer {slow}"}
        statuses = [http.get("/v1/queues", headers=as_slow).status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        r = http.get("/v1/queues", headers=as_slow)
        assert code(r) == (429, "rate_limited")
        assert int(r.headers["retry-after"]) >= 1
        assert http.get("/v1/queues", headers=as_reader).status_code == 200  # per key
