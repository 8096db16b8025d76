"""HTTP send and read throughput of ``pgbroker serve`` on loopback, bounded in time and volume.

Starts uvicorn in this process on 127.0.0.1 (a free port), creates an admin key and a queue, then
runs C concurrent httpx clients: a send phase (batches of B messages) and a read+ack phase, each
stopping after N messages or T seconds. Prints one JSON line of results.

    python -m bench.http_bench --dsn postgresql://... [--messages 20000] [--batch 50] [--clients 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
import uuid
from typing import Any

import httpx
import psycopg
import uvicorn

from pgbroker.http import Settings, create_app
from pgbroker.http.auth import create_key
from pgbroker.install import install


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _phase(clients: int, budget: int, seconds: float, step: Any) -> tuple[int, float]:
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


async def bench(dsn: str, messages: int, batch: int, clients: int, seconds: float) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)
        _, token = create_key(conn, f"bench-{uuid.uuid4().hex[:6]}", scopes=["admin"])
    queue = f"http_bench_{uuid.uuid4().hex[:8]}"
    port = _free_port()
    settings = Settings(rate_per_second=1e9, rate_burst=1e9)
    app = create_app(dsn, settings=settings, max_connections=clients + 2)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    limits = httpx.Limits(max_connections=clients)
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, limits=limits
        ) as http:
            (await http.post("/v1/queues", json={"name": queue})).raise_for_status()
            body = {"messages": [{"i": i, "pad": "x" * 64} for i in range(batch)]}

            async def send() -> int:
                r = await http.post(f"/v1/queues/{queue}/messages", json=body)
                r.raise_for_status()
                return len(r.json()["msg_ids"])

            async def send_one() -> int:
                (
                    await http.post(f"/v1/queues/{queue}/messages", json={"message": {"i": 0}})
                ).raise_for_status()
                return 1

            async def read_ack() -> int:
                r = await http.post(f"/v1/queues/{queue}/read", json={"qty": batch, "vt": 60})
                r.raise_for_status()
                found = r.json()["messages"]
                if found:
                    receipts = [m["receipt"] for m in found]
                    (
                        await http.post(f"/v1/queues/{queue}/ack", json={"receipts": receipts})
                    ).raise_for_status()
                return len(found)

            single, single_s = await _phase(clients, messages // 10, seconds, send_one)
            sent, send_s = await _phase(clients, messages, seconds, send)
            read, read_s = await _phase(clients, sent + single, seconds, read_ack)
            await http.delete(f"/v1/queues/{queue}")
    finally:
        server.should_exit = True
        await serving
    return {
        "bench": "http",
        "clients": clients,
        "batch": batch,
        "single_send_per_s": round(single / single_s),
        "batch_send_msgs_per_s": round(sent / send_s),
        "read_ack_msgs_per_s": round(read / read_s),
        "messages_sent": sent + single,
        "messages_read": read,
    }


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
    print(json.dumps(asyncio.run(bench(args.dsn, args.messages, args.batch, args.clients, args.seconds))))


if __name__ == "__main__":
    main()
