"""HTTP send and read throughput of ``pgbroker serve`` on loopback, bounded in time and volume.

Starts the server as its own process through the CLI (``pgbroker serve`` on a free 127.0.0.1
port), creates an admin key and a queue, then runs C concurrent keep-alive httpx clients in this
process: single sends, batch sends of B messages, and read+ack of B at a time, each phase
stopping after N messages or T seconds. Prints one JSON line of results.

The server gets a process of its own because a client sharing its event loop (as in the first
version of this bench) measured mostly the client: httpx spends about as much CPU per request as
the server does.

    python -m bench.http_bench --dsn postgresql://... [--messages 20000] [--batch 50] [--clients 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import psycopg

from pgbroker._db.api_keys import create_key
from pgbroker._db.install import install


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def serving(dsn: str, connections: int) -> Iterator[str]:
    """``pgbroker serve`` in a child process, without rate limits; yields its base URL."""
    port = _free_port()
    argv = [sys.executable, "-m", "pgbroker.cli", "--dsn", dsn, "serve", "--port", str(port)]
    argv += ["--rate", "1e9", "--burst", "1e9", "--connections", str(connections)]
    server = subprocess.Popen(argv)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("pgbroker serve did not come up") from None
                time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


async def _phase(
    clients: int, budget: int, seconds: float, step: Callable[[], Awaitable[int]]
) -> tuple[int, float]:
    """Run ``step`` (returns messages handled, 0 when done) in ``clients`` tasks until the budget."""
    done = 0
    started = time.perf_counter()
    deadline = started + seconds

    async def worker() -> None:
        nonlocal done
        while done < budget and time.perf_counter() < deadline:
            n = await step()
            if n == 0:
                return
            done += n

    await asyncio.gather(*(worker() for _ in range(clients)))
    return done, time.perf_counter() - started


async def _run(
    url: str, token: str, messages: int, batch: int, clients: int, seconds: float
) -> dict[str, Any]:
    queue = f"http_bench_{uuid.uuid4().hex[:8]}"
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, limits=limits
    ) as http:
        (await http.post("/v1/queues", json={"name": queue})).raise_for_status()
        body = {"messages": [{"i": i, "pad": "x" * 64} for i in range(batch)]}

        async def send_batch() -> int:
            r = await http.post(f"/v1/queues/{queue}/messages", json=body)
            r.raise_for_status()
            return len(r.json()["msg_ids"])

        async def send_one() -> int:
            (await http.post(f"/v1/queues/{queue}/messages", json={"message": {"i": 0}})).raise_for_status()
            return 1

        async def read_ack() -> int:
            r = await http.post(f"/v1/queues/{queue}/read", json={"qty": batch, "vt": 60})
            r.raise_for_status()
            found = r.json()["messages"]
            if found:
                receipts = [m["receipt"] for m in found]
                (await http.post(f"/v1/queues/{queue}/ack", json={"receipts": receipts})).raise_for_status()
            return len(found)

        single, single_s = await _phase(clients, messages // 10, seconds, send_one)
        sent, send_s = await _phase(clients, messages, seconds, send_batch)
        read, read_s = await _phase(clients, sent + single, seconds, read_ack)
        await http.delete(f"/v1/queues/{queue}")
    return {
        "single_send_per_s": round(single / single_s),
        "batch_send_msgs_per_s": round(sent / send_s),
        "read_ack_msgs_per_s": round(read / read_s),
        "messages_sent": sent + single,
        "messages_read": read,
    }


def bench(dsn: str, messages: int, batch: int, clients: int, seconds: float) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)
        _, token = create_key(conn, f"bench-{uuid.uuid4().hex[:6]}", scopes=["admin"])
        row = conn.execute(
            "SELECT current_setting('synchronous_commit'), current_setting('fsync')"
        ).fetchone()
        assert row is not None
        settings = {"synchronous_commit": row[0], "fsync": row[1]}
    with serving(dsn, clients + 2) as url:
        results = asyncio.run(_run(url, token, messages, batch, clients, seconds))
    return {"bench": "http", "clients": clients, "batch": batch, **results, "postgres": settings}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="cap per phase")
    args = parser.parse_args()
    print(json.dumps(bench(args.dsn, args.messages, args.batch, args.clients, args.seconds)))


if __name__ == "__main__":
    main()
