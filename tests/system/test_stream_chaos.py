"""Chaos for streams: two producers, two consumer groups of two `pgbroker worker` processes each,
two SIGKILLs and a Postgres restart. At the end, per group: every message sent was handled or
(the poison ones) dead-lettered, and a message was handled twice only if a killed worker had
handled it first (its batch was in flight, unacknowledged, when it died).

Handlers record each handling (group, id, pid) in table ``handled``; the poison messages always
fail and go through the group's retry queue to its dead-letter queue.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgbroker import App, Broker
from pgbroker.embedded import EmbeddedPostgres
from pgbroker.streams._client import Stream
from pgbroker.streams._records import StreamMessage

# A query that waits out a restart; the private cluster is unstarted_cluster (tests/plugins/postgres.py).
from tests.support.postgres import _rows

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PRODUCERS = 2
PER_PRODUCER = 3000
POISON_EVERY = 500
GROUPS = ("audit", "billing")
LEASE_SECONDS = 4
DEADLINE_SECONDS = 150

# -- the handler, run inside the worker processes -------------------------------------------------

_local = threading.local()


def _record(group: str, message: StreamMessage) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = getattr(_local, "conn", None) or psycopg.connect(os.environ["CHAOS_DSN"], autocommit=True)
            _local.conn = conn
            conn.execute("INSERT INTO handled VALUES (%s, %s, %s)", (group, message.id, os.getpid()))
            return
        except psycopg.OperationalError:
            _local.conn = None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


app = App()
_group = os.environ.get("CHAOS_GROUP", "audit")


@app.stream_handler("chaos", _group, batch_size=50, lease=LEASE_SECONDS, poll_max=0.5)
def handle(message: StreamMessage) -> None:
    if message.message["poison"]:
        raise ValueError(f"poison {message.id}")
    _record(_group, message)


# -- the test -------------------------------------------------------------------------------------


def _produce(dsn: str, producer: int, sent: list[int]) -> None:
    rng = random.Random(producer)
    n = 0
    while n < PER_PRODUCER:
        try:
            with psycopg.connect(dsn) as conn, conn.transaction():
                size = min(50, PER_PRODUCER - n)
                msgs = [
                    Jsonb({"p": producer, "n": i, "poison": (i % POISON_EVERY == 0)})
                    for i in range(n, n + size)
                ]
                rows = conn.execute(
                    "SELECT pgbroker.stream_send_many('chaos', %s::jsonb[], NULL, %s)",
                    (msgs, [f"k{producer}-{i % 5}" for i in range(n, n + size)]),
                ).fetchall()
                if rng.random() < 0.1:
                    time.sleep(rng.uniform(0.1, 1.0))
            sent.extend(r[0] for r in rows)
            n += size
        except psycopg.OperationalError:
            time.sleep(0.3)  # the restart: that transaction did not commit, send it again
        time.sleep(0.005)


def test_sent_equals_handled_per_group_plus_dead_letters(
    unstarted_cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    dsn = unstarted_cluster.start()
    with Broker(dsn, max_connections=2) as broker:
        broker.install()
        stream = Stream(broker, "chaos")
        stream.create(partitions=4)
        for group in GROUPS:
            retry = stream.create_group(group, start="start")
            broker.create_queue(f"{group}_dlq")
            broker.queue(retry).set_policy(
                max_deliveries=2, backoff="fixed", backoff_base_seconds=0, dead_letter_queue=f"{group}_dlq"
            )
        with broker.connection() as conn:
            conn.execute("CREATE TABLE handled (group_name text, id bigint, pid int)")

    env = {**os.environ, "CHAOS_DSN": dsn, "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/nothing"}
    logs: list[Path] = []
    workers: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}

    def start_worker(group: str) -> None:
        log = tmp_path / f"worker-{len(logs)}.log"
        logs.append(log)
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "pgbroker.cli", "--dsn", dsn, "worker", f"{__name__}:app"],
                stdout=out,
                stderr=out,
                env={**env, "CHAOS_GROUP": group},
                cwd=ROOT,
            )
        workers[process.pid] = (group, process)

    sent: list[int] = []
    producers = [threading.Thread(target=_produce, args=(dsn, p, sent)) for p in range(PRODUCERS)]
    total = PRODUCERS * PER_PRODUCER
    killed: set[int] = set()
    started = time.monotonic()

    def handled_count() -> int:
        return int(_rows(dsn, "SELECT count(*) FROM handled")[0][0])

    def all_workers_reading() -> bool:
        """Whether every live worker has made its first read (its consumer, host:pid:random, is
        registered), which comes after its start-up calls. (Not whether each has handled a
        message, as in test_worker_chaos: a worker started late may find its group's messages
        all handled.)"""
        names = [r[0] for r in _rows(dsn, "SELECT consumer FROM pgbroker.stream_consumer")]
        reading = {int(name.rsplit(":", 2)[1]) for name in names}
        return set(workers) <= reading

    try:
        for group in GROUPS:
            for _ in range(2):
                start_worker(group)
        for p in producers:
            p.start()
        rng = random.Random(7)
        kills_at = [total * 0.25, total * 0.8]
        restart_at = total * 0.5
        while kills_at or restart_at:
            assert time.monotonic() - started < DEADLINE_SECONDS, f"{handled_count()} handled so far"
            done = handled_count()
            if kills_at and done >= kills_at[0]:
                kills_at.pop(0)
                victim = rng.choice(sorted(workers))
                group, process = workers.pop(victim)
                process.send_signal(signal.SIGKILL)
                killed.add(victim)
                start_worker(group)
            # Not while a new worker is still starting: `pgbroker worker` that cannot connect at its
            # start exits (5), which is not what this test is about, and a loaded machine can take
            # seconds to start one (waiting 3 s after the last start failed in CI).
            elif restart_at and done >= restart_at and all_workers_reading():
                restart_at = 0
                unstarted_cluster.restart()
            time.sleep(0.05)
        for p in producers:
            p.join()
        poison_count = len([1 for i in range(PER_PRODUCER) if i % POISON_EVERY == 0]) * PRODUCERS
        wanted = len(sent) - poison_count
        while True:
            assert time.monotonic() - started < DEADLINE_SECONDS, f"{handled_count()} handled so far"
            per_group = dict(_rows(dsn, "SELECT group_name, count(DISTINCT id) FROM handled GROUP BY 1"))
            dead = [_rows(dsn, f"SELECT count(*) FROM pgmq.q_{g}_dlq")[0][0] for g in GROUPS]  # noqa: S608
            if all(per_group.get(g, 0) >= wanted for g in GROUPS) and all(d >= poison_count for d in dead):
                break
            time.sleep(0.3)
        for _, process in workers.values():
            process.send_signal(signal.SIGTERM)
        for pid, (_, process) in workers.items():
            assert process.wait(30) == 0, f"worker {pid} failed:\n" + "\n".join(p.read_text() for p in logs)
    finally:
        for _, process in workers.values():
            if process.poll() is None:
                process.kill()

    assert len(sent) == total
    log_ids = {r[0] for r in _rows(dsn, "SELECT id FROM pgbroker.s_chaos")}
    assert set(sent) == log_ids
    poison = {
        r[0] for r in _rows(dsn, "SELECT id FROM pgbroker.s_chaos WHERE (message ->> 'poison')::boolean")
    }
    for group in GROUPS:
        handled_rows = _rows(dsn, f"SELECT id, pid FROM handled WHERE group_name = '{group}'")  # noqa: S608
        counts = Counter(i for i, _ in handled_rows)
        assert set(counts) == set(sent) - poison, group
        dlq = f"SELECT (headers -> 'x-pgbroker-stream' ->> 'id')::bigint FROM pgmq.q_{group}_dlq"  # noqa: S608
        dead_letters = {r[0] for r in _rows(dsn, dlq)}
        assert dead_letters == poison, group
        # A second handling only where a killed worker handled it first (its batch was in flight).
        twice = {i for i, n in counts.items() if n > 1}
        by_killed = {i for i, pid in handled_rows if pid in killed}
        assert twice <= by_killed, (group, sorted(twice - by_killed)[:10])
