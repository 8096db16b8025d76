"""Throughput through pgbouncer in transaction pooling mode against a direct connection.

    python -m bench.pooler_bench [--rounds 3] [--threads 4] [--loops 400]

Three ways to reach one private embedded cluster, in alternating rounds of one run:
- ``direct``: psycopg's defaults (server-side prepared statements after five executions);
- ``direct, unprepared``: what PGBROKER_POOLER=transaction costs on a direct connection;
- ``pgbouncer``: Debian's pgbouncer, pool_mode = transaction, PGBROKER_POOLER=transaction.
Each of ``--threads`` threads sends, reads and acks one message ``--loops`` times through one
Broker; the rate is messages through the whole cycle per second.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from psycopg.conninfo import make_conninfo
from tests.support.pooler import transaction_pooler

from bench.harness import Server, alternating_rounds, connect, mean_rate
from pgbroker import Broker
from pgbroker._db.dsn import POOLER_ENV
from pgbroker._db.install import install

SYSTEMS = ("direct", "direct, unprepared", "pgbouncer")


@contextmanager
def _pooler_mode(on: bool) -> Iterator[None]:
    before = os.environ.pop(POOLER_ENV, None)
    if on:
        os.environ[POOLER_ENV] = "transaction"
    try:
        yield
    finally:
        os.environ.pop(POOLER_ENV, None)
        if before is not None:
            os.environ[POOLER_ENV] = before


def _cycle(dsn: str, queue: str, threads: int, loops: int) -> float:
    with Broker(dsn, max_connections=threads) as broker:
        jobs = broker.create_queue(queue)

        def one() -> None:
            for i in range(loops):
                jobs.send({"i": i})
                for message in jobs.read_many(1, vt=30):
                    jobs.ack(message)

        workers = [threading.Thread(target=one) for _ in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return threads * loops / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--loops", type=int, default=400)
    args = parser.parse_args()
    with Server(None, None) as server:
        with connect(server.admin_dsn) as admin:
            admin.execute("CREATE DATABASE pooler_bench")
        direct = server.dsn_for("pooler_bench")
        with connect(direct) as conn:
            install(conn)
        with transaction_pooler(server.admin_dsn, pool_size=args.threads) as pooler:
            through_pooler = make_conninfo(pooler, dbname="pooler_bench")
            rates: dict[str, list[float | None]] = {system: [] for system in SYSTEMS}
            for n, system in alternating_rounds(SYSTEMS, args.rounds):
                dsn = through_pooler if system == "pgbouncer" else direct
                with _pooler_mode(system != "direct"):
                    rate = _cycle(dsn, f"q_{n}_{SYSTEMS.index(system)}", args.threads, args.loops)
                rates[system].append(rate)
                print(f"round {n + 1}: {system:<20} {rate:8.0f} msg/s", flush=True)
    base = mean_rate(rates["direct"]) or 1.0
    print(f"\n{'':<20} {'msg/s (mean)':>12} {'vs direct':>10}  rounds")
    for system in SYSTEMS:
        mean = mean_rate(rates[system]) or 0.0
        each = ", ".join(f"{r:.0f}" for r in rates[system] if r is not None)
        print(f"{system:<20} {mean:12.0f} {mean / base:9.2f}x  {each}")


if __name__ == "__main__":
    main()
