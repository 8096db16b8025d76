"""An upgrade under load (docs/operations.md, "Upgrading"): a database at the oldest schema this
package upgrades (a development database mapped onto the 0.1.0 baseline, tests/support/dev_schema)
serves a producer of a queue and a stream, a queue Worker and a stream consumer of pgmq's and
pgbroker's SQL API (the calls both versions answer), while `pgbroker install` upgrades it to the
current version. Nothing is lost, nothing is handled twice but what the at-least-once guarantee
allows (a fenced ack), and every client goes on after the upgrade without a restart.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import psycopg

from pgbroker import Message, Worker
from pgbroker._db.install_rules import latest_version
from pgbroker._sql import BASELINE, DEV_MINIMUM
from tests.support.dev_schema import install_dev
from tests.support.worker import while_serving

AFTER_UPGRADE = 150  # messages of each kind sent once the upgrade is done
TIMEOUT = 120


class Producer(threading.Thread):
    """Sends numbered messages to the queue and the stream, each retried until it is sent."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.sent = 0
        self.stream_ids: list[int] = []
        self.errors: list[str] = []
        self.stop_at: int | None = None

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while self.stop_at is None or self.sent < self.stop_at:
                try:
                    conn.execute("SELECT pgmq.send('jobs', jsonb_build_object('n', %s::int))", [self.sent])
                    row = conn.execute(
                        "SELECT pgbroker.stream_send('events', jsonb_build_object('n', %s::int), NULL, %s)",
                        [self.sent, str(self.sent % 7)],
                    ).fetchone()
                except psycopg.Error as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.05)
                    continue
                assert row is not None
                self.stream_ids.append(int(row[0]))
                self.sent += 1
                time.sleep(0.002)


class StreamReader(threading.Thread):
    """A group's consumer by the SQL calls both versions answer: read a batch, ack it."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.seen: list[int] = []
        self.errors: list[str] = []
        self.stopping = False

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stopping:
                try:
                    rows = conn.execute(
                        "SELECT partition, id, epoch"
                        " FROM pgbroker.stream_read('events', 'g', 'reader', 50, 30)"
                    ).fetchall()
                    if not rows:
                        time.sleep(0.02)
                        continue
                    self.seen += [row[1] for row in rows]
                    last: dict[int, tuple[int, int]] = {}
                    for partition, msg_id, epoch in rows:
                        last[partition] = (max(msg_id, last.get(partition, (0, 0))[0]), epoch)
                    conn.execute(
                        "SELECT * FROM pgbroker.stream_ack('events', 'g', 'reader', %s, %s, %s)",
                        [list(last), [e for _, e in last.values()], [i for i, _ in last.values()]],
                    )
                except psycopg.Error as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.05)


def test_an_upgrade_under_load_loses_nothing_and_stops_no_client(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        install_dev(conn)
        conn.execute("SELECT pgmq.create('jobs')")
        conn.execute("SELECT pgbroker.create_stream('events', 4)")
        conn.execute("SELECT pgbroker.create_stream_group('events', 'g', 'start')")

    handled: Counter[int] = Counter()

    def handle(message: Message) -> None:
        handled[message.message["n"]] += 1

    worker = Worker("jobs", handle, concurrency=2, vt=30)
    producer, reader = Producer(empty_dsn), StreamReader(empty_dsn)
    upgrade: dict[str, Any] = {}

    async def scenario() -> None:
        from pgbroker.runtime._app import serve

        serving = asyncio.create_task(serve([worker], dsn=empty_dsn, handle_signals=False))
        producer.start()
        reader.start()
        try:
            await while_serving(
                serving, lambda: len(handled) >= 100 and len(reader.seen) >= 100, "load before the upgrade"
            )
            started = time.monotonic()
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "pgbroker.cli", "--dsn", empty_dsn, "install"],
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                check=False,
            )
            upgrade.update(done=done, seconds=time.monotonic() - started, sent_before=producer.sent)
            producer.stop_at = producer.sent + AFTER_UPGRADE
            await while_serving(
                serving,
                lambda: (
                    not producer.is_alive()
                    and set(handled) == set(range(producer.sent))
                    and set(reader.seen) >= set(producer.stream_ids)
                ),
                "every message handled after the upgrade",
                seconds=TIMEOUT,
            )
        finally:
            producer.stop_at = producer.stop_at or producer.sent
            reader.stopping = True
            worker.stop()
            await serving
            producer.join(10)
            reader.join(10)

    asyncio.run(scenario())

    done = upgrade["done"]
    assert done.returncode == 0, done.stderr
    assert f"installed version {latest_version()} (was {BASELINE}.dev{DEV_MINIMUM})" in done.stdout
    # Nothing lost: every message sent was handled (the wait above), and the queue is empty.
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pgmq.q_jobs").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pgmq.a_jobs").fetchone() == (producer.sent,)
    # Twice only after a fenced ack (at-least-once).
    twice = sorted(n for n, count in handled.items() if count > 1)
    assert len(twice) <= worker.stats.stale, (twice, worker.stats)
    # No send failed, and no client needed a restart to go on. A call running when the upgrade
    # committed goes on with the code it started with, on the new tables: it may fail once, on a
    # function the upgrade dropped or a column it moved (the raw reader's loop tries again, its
    # batch is delivered again; the runtime's workers wait it out, tests/runtime/test_schema_change.py).
    assert producer.errors == []
    assert len(reader.errors) <= 1, reader.errors
    assert all(e.startswith(("UndefinedFunction:", "UndefinedColumn:")) for e in reader.errors), reader.errors
    assert set(reader.seen) == set(producer.stream_ids)
    if not reader.errors:
        assert len(reader.seen) == len(set(reader.seen))
    assert worker.stats.connection_errors == 0
