"""The demo's running order: connect ($DATABASE_URL, else the embedded PostgreSQL), then each stage
in STAGES with one shared Demo, each timed; the tour passes when every stage's checks balanced.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import TextIO

import psycopg

from pgbroker._db.dsn import database_place, resolve_dsn
from pgbroker.demo.orders import CONSUMERS, orders_stage
from pgbroker.demo.spark import spark_stage
from pgbroker.demo.stage import Demo, Stage
from pgbroker.demo.streams_jobs import streams_jobs_stage
from pgbroker.demo.workers import workers_stage
from pgbroker.embedded import ENV_HOME, EmbeddedError, EmbeddedPostgres
from pgbroker.errors import PgbrokerError
from pgbroker.queues._client import Broker

__all__ = ["STAGES", "main", "run"]

STAGES: list[Stage] = [orders_stage, workers_stage, streams_jobs_stage, spark_stage]


def _where(dsn: str, embedded: bool) -> str:
    where = database_place(dsn)
    return f"{where} (embedded; set DATABASE_URL to use another server)" if embedded else where


def _cli_command() -> str:
    """How to run pgbroker's CLI from here: the script beside this interpreter (a virtualenv's
    bin/ is rarely on PATH), relative when under the current directory; with the demo's
    $PGBROKER_HOME, so that it finds the same embedded cluster."""
    script = Path(sys.executable).parent / "pgbroker"
    if script.exists():
        command = str(script.relative_to(Path.cwd())) if script.is_relative_to(Path.cwd()) else str(script)
    else:
        command = f"{shlex.quote(sys.executable)} -m pgbroker.cli"
    home = os.environ.get(ENV_HOME)
    return f"{ENV_HOME}={shlex.quote(home)} {command}" if home else command


def _next_steps(embedded: bool) -> list[str]:
    """The closing lines: what still runs, how to stop it, and what to try next."""
    cli = _cli_command()
    lines = []
    if embedded:
        status = EmbeddedPostgres().status()
        if status.running:
            where = f"data in {status.data_dir}, pid {status.pid}"
            lines.append(f"the embedded PostgreSQL is still running ({where})")
            lines.append(f"stop it: {cli} db stop")
    lines.append(f"next: {cli} --help")
    return lines


def _name(stage: Stage) -> str:
    """A stage's name, from its function's: ``streams_jobs_stage`` is ``streams-jobs``."""
    return stage.__name__.removesuffix("_stage").replace("_", "-")


def run(out: TextIO = sys.stdout) -> bool:
    """Run every stage; True when every check balanced."""
    started = time.perf_counter()
    print("pgbroker demo: a queue inside PostgreSQL, with fenced acks\n", file=out)
    embedded = not os.environ.get("DATABASE_URL")
    dsn = resolve_dsn(None)
    # Fail fast on a wrong DATABASE_URL: the pool would retry for 30 s before giving up.
    psycopg.connect(dsn, connect_timeout=10).close()
    with Broker(dsn, max_connections=CONSUMERS + 1) as broker:
        demo = Demo(broker, out)
        demo.say("database", _where(dsn, embedded))
        for stage in STAGES:
            stage_started = time.perf_counter()
            stage(demo)
            demo.say("stage", f"{_name(stage)} done in {time.perf_counter() - stage_started:.1f} s")
    print(f"\ndone in {time.perf_counter() - started:.1f} s", file=out)
    for line in _next_steps(embedded):
        print(line, file=out)
    return demo.ok


def main() -> int:
    try:
        return 0 if run() else 1
    except (PgbrokerError, EmbeddedError, psycopg.Error) as exc:
        print(f"pgbroker demo: error: {exc}", file=sys.stderr)
        return 1
