"""PgQ (Debian's ``postgresql-15-pgq3``, ticked by its daemon ``pgqd``) for the keyed stream shape
of scenario (h): one queue, one registered consumer, W handlers, events of one key in order.

How PgQ delivers: a producer calls ``pgq.insert_event``; a ticker (``pgqd``) cuts the event
stream into batches by inserting ticks; a consumer asks ``pgq.next_batch`` for the batch after
its last one, reads it with ``pgq.get_batch_events`` (ordered by event id) and ends it with
``pgq.finish_batch``. One consumer has one batch open at a time, and the next batch only exists
once the ticker has ticked past it.

How W handlers share that here, and why: one consumer, and the open batch's events grouped by
key, each key's events handled one after another, up to W keys at once; the batch is finished
once every key in it is done. PgQ's other ways to consume in parallel lose per-key order:
several consumers of one queue each get every event (a fan-out, not a split), and cooperative
sub-consumers (pgq_coop, which Debian does not package) take whole batches side by side, so two
batches holding one key's events could run at the same time. Splitting one batch by key keeps
PgQ's own order guarantee (event id order) for every key and lets W handlers run.

Ticks: ``pgqd`` with ``ticker_period`` ``TICK_PERIOD`` against the bench's cluster (a config in a
temporary directory), or a loop in this process calling ``pgq.ticker()`` as often when the
``pgqd`` binary is missing or exits at once (unable to connect); ``Ticker.how`` says which ran.
The queue ticks as soon as it holds an event and the ticker passes (``ticker_max_lag`` = the tick
period; PgQ's default is 3 s, tuned for batches, not latency); ``ticker_max_count`` keeps PgQ's
default (500).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.peers.keyed import KeyedHandle, KeyedSend

#: seconds between the ticker's passes (pgqd's default is 1 s)
TICK_PERIOD = 0.1
#: seconds a consumer waits before asking again when no batch is ready
IDLE_POLL = 0.02
CONSUMER = "bench"


def unavailable(dsn: str) -> str | None:
    """Why PgQ cannot run on this server (None: it can)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version_num')::int / 10000,"
            " EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pgq')"
        ).fetchone()
    major, available = (row[0], row[1]) if row else (0, False)
    if available:
        return None
    if major != 15:
        return (
            f"the bench's server is PostgreSQL {major}; Debian packages PgQ for 15 "
            "(postgresql-15-pgq3), so PgQ is skipped"
        )
    return "the pgq extension is not installed (`make pgq` installs postgresql-15-pgq3 and pgqd as root)"


class Ticker:
    """``pgqd`` ticking the databases given, or a ``pgq.ticker()`` loop where pgqd is missing."""

    def __init__(self, admin_dsn: str, databases: list[str]) -> None:
        self._admin_dsn = admin_dsn
        self._databases = databases
        self._process: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._done = threading.Event()
        self._threads: list[threading.Thread] = []
        self.how = ""

    def __enter__(self) -> Ticker:
        binary = shutil.which("pgqd")
        if binary is None:
            self._start_loops("pgqd not found")
            return self
        self._start_pgqd(binary)
        time.sleep(1.0)  # pgqd exits at once when it cannot connect
        if self._process is not None and self._process.poll() is not None:
            last = (self.log().strip().splitlines() or ["no log"])[-1]
            self._process = None
            self._start_loops(f"pgqd exited: {last}")
        return self

    def _start_loops(self, why: str) -> None:
        for database in self._databases:
            thread = threading.Thread(target=self._loop, args=(database,), daemon=True)
            thread.start()
            self._threads.append(thread)
        self.how = f"a loop calling pgq.ticker() every {TICK_PERIOD:g} s ({why})"

    def _start_pgqd(self, binary: str) -> None:
        params = {k: v for k, v in conninfo_to_dict(self._admin_dsn).items() if k != "dbname"}
        self._dir = Path(tempfile.mkdtemp(prefix="pgbroker-bench-pgqd-"))
        config = self._dir / "pgqd.ini"
        config.write_text(
            "[pgqd]\n"
            f"base_connstr = {make_conninfo('', **params)}\n"
            f"initial_database = {self._databases[0]}\n"
            f"database_list = {', '.join(self._databases)}\n"
            f"ticker_period = {TICK_PERIOD}\n"
            f"logfile = {self._dir / 'pgqd.log'}\n"
            "syslog = 0\n"
        )
        self._process = subprocess.Popen([binary, "-q", str(config)])
        self.how = f"pgqd (ticker_period {TICK_PERIOD:g} s)"

    def _loop(self, database: str) -> None:
        dsn = make_conninfo(self._admin_dsn, dbname=database)
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not self._done.wait(TICK_PERIOD):
                conn.execute("SELECT pgq.ticker()")

    def log(self) -> str:
        path = self._dir / "pgqd.log" if self._dir else None
        return path.read_text() if path and path.exists() else ""

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        for thread in self._threads:
            thread.join(10)
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


class PgQPeer:
    key = "PgQ"
    database = "pgbroker_bench_peer_pgq"

    def describe(self) -> str:
        return (
            "one consumer; each batch's events grouped by key, up to W keys handled at once; "
            f"ticks every {TICK_PERIOD:g} s, ticker_max_lag {TICK_PERIOD:g} s"
        )

    async def install(self, dsn: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pgq")

    async def create(self, dsn: str, queue: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("SELECT pgq.create_queue(%s)", [queue])
            await conn.execute(
                "SELECT pgq.set_queue_config(%s, 'ticker_max_lag', %s)", [queue, f"{TICK_PERIOD} seconds"]
            )
            await conn.execute("SELECT pgq.register_consumer(%s, %s)", [queue, CONSUMER])

    async def drop(self, dsn: str, queue: str) -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("SELECT pgq.unregister_consumer(%s, %s)", [queue, CONSUMER])
            await conn.execute("SELECT pgq.drop_queue(%s)", [queue])

    @asynccontextmanager
    async def sender(self, dsn: str, queue: str) -> AsyncIterator[KeyedSend]:
        """Events of type "job", the payload (with its key) as the data; a call's events in one
        statement (one transaction, one round trip)."""
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:

            async def send(events: list[tuple[str, dict[str, Any]]]) -> None:
                data = [json.dumps(payload) for _, payload in events]
                await conn.execute(
                    "SELECT count(pgq.insert_event(%s, 'job', d)) FROM unnest(%s::text[]) AS d", [queue, data]
                )

            yield send

    async def work(
        self, dsn: str, queue: str, handle: KeyedHandle, stop: asyncio.Event, workers: int
    ) -> None:
        """PgQ's consumer loop until ``stop``: next batch, its events, W handlers over its keys, finish."""
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                cursor = await conn.execute("SELECT pgq.next_batch(%s, %s)", [queue, CONSUMER])
                row = await cursor.fetchone()
                batch = row[0] if row else None
                if batch is None:
                    await asyncio.sleep(IDLE_POLL)
                    continue
                cursor = await conn.execute("SELECT ev_data FROM pgq.get_batch_events(%s)", [batch])
                await _by_key([json.loads(data) for (data,) in await cursor.fetchall()], handle, workers)
                await conn.execute("SELECT pgq.finish_batch(%s)", [batch])

    async def remaining(self, dsn: str, queue: str) -> int:
        """Events of finished ticks the consumer has not taken (those not yet ticked are not counted)."""
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cursor = await conn.execute(
                "SELECT coalesce(pending_events, 0) FROM pgq.get_consumer_info(%s, %s)", [queue, CONSUMER]
            )
            row = await cursor.fetchone()
            return int(row[0]) if row else 0


async def _by_key(payloads: list[dict[str, Any]], handle: KeyedHandle, workers: int) -> None:
    """Handle ``payloads`` (in event order) with up to ``workers`` keys at once, each key's in order."""
    keys: dict[str, list[dict[str, Any]]] = {}
    for payload in payloads:
        keys.setdefault(str(payload.get("k")), []).append(payload)
    pending: Iterator[list[dict[str, Any]]] = iter(keys.values())

    async def lane() -> None:
        # Each lane takes the next key not yet taken; iterating is synchronous, so no key is taken twice.
        for events in pending:
            for payload in events:
                await handle(payload)

    await asyncio.gather(*(lane() for _ in range(min(workers, len(keys)))))
