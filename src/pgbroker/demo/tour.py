"""The demo's running order: connect ($DATABASE_URL, else the embedded PostgreSQL), then each stage
in STAGES with one shared Demo; the tour passes when every stage's checks balanced.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgbroker._db.dsn import resolve_dsn
from pgbroker.demo.orders import CONSUMERS, orders_stage
from pgbroker.demo.spark import spark_stage
from pgbroker.demo.stage import Demo, Stage
from pgbroker.demo.streams_jobs import streams_jobs_stage
from pgbroker.demo.workers import workers_stage
from pgbroker.embedded import EmbeddedError
from pgbroker.errors import PgbrokerError
from pgbroker.queues._client import Broker

__all__ = ["STAGES", "main", "run"]

STAGES: list[Stage] = [orders_stage, workers_stage, streams_jobs_stage, spark_stage]


def _where(dsn: str, embedded: bool) -> str:
    params = conninfo_to_dict(dsn)
    host = params.get("host") or "localhost"
    place = f"{host}" if str(host).startswith("/") else f"{host}:{params.get('port') or 5432}"
    where = f"{params.get('dbname', 'postgres')} at {place}"
    return f"{where} (embedded; set DATABASE_URL to use another server)" if embedded else where


def run(out: TextIO = sys.stdout) -> bool:
    """Run every stage; True when every check balanced."""
    started = time.perf_counter()
    print("pgbroker demo: a queue inside PostgreSQL, with fenced acks\n", file=out)
    dsn = resolve_dsn(None)
    # Fail fast on a wrong DATABASE_URL: the pool would retry for 30 s before giving up.
    psycopg.connect(dsn, connect_timeout=10).close()
    with Broker(dsn, max_connections=CONSUMERS + 1) as broker:
        demo = Demo(broker, out)
        demo.say("database", _where(dsn, embedded=not os.environ.get("DATABASE_URL")))
        for stage in STAGES:
            stage(demo)
    print(f"\ndone in {time.perf_counter() - started:.1f} s; next: pgbroker --help", file=out)
    return demo.ok


def main() -> int:
    try:
        return 0 if run() else 1
    except (PgbrokerError, EmbeddedError, psycopg.Error) as exc:
        print(f"pgbroker demo: error: {exc}", file=sys.stderr)
        return 1
