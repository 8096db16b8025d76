"""Behind pgbouncer in transaction pooling mode (Debian's 1.18: no protocol-level prepared
statements): with ``PGBROKER_POOLER=transaction``, or with the ``pooler="transaction"`` argument
(the CLI's ``--pooler transaction``) and no variable, the clients, the CLI, the worker runtime and
the HTTP server lose nothing and raise nothing; without either, psycopg's server-side prepared
statements break, which shows the pooler really moves sessions between server connections.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest

from pgbroker import Broker
from pgbroker._db.api_keys import create_key
from pgbroker._db.dsn import POOLER_ENV
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.queues._records import Message
from tests.http.live import pgbroker_serve
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

THREADS = 8
PER_THREAD = 300


def _send_read_ack(broker: Broker, queue: str, worker: int, errors: list[BaseException]) -> None:
    try:
        jobs = broker.queue(queue)
        for i in range(PER_THREAD):
            jobs.send({"worker": worker, "i": i})
            for message in jobs.read_many(2, vt=30):
                jobs.ack(message)
    except BaseException as exc:  # the test reports what each thread met
        errors.append(exc)


def _run_threads(broker: Broker, queue: str) -> list[BaseException]:
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_send_read_ack, args=(broker, queue, n, errors)) for n in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return errors


@pytest.mark.usefixtures("pooler_mode")
def test_eight_threads_send_read_and_ack_through_the_pooler(pooled_dsn: str, dsn: str) -> None:
    with Broker(pooled_dsn, max_connections=THREADS) as broker:
        jobs = broker.create_queue("jobs")
        assert _run_threads(broker, "jobs") == []
        for message in jobs.read_many(THREADS * PER_THREAD, vt=30):  # what the threads left behind
            jobs.ack(message)
    with psycopg.connect(dsn) as direct:
        sent, archived, left = direct.execute(
            "SELECT (SELECT count(*) FROM pgmq.a_jobs) + (SELECT count(*) FROM pgmq.q_jobs),"
            " (SELECT count(DISTINCT message) FROM pgmq.a_jobs), (SELECT count(*) FROM pgmq.q_jobs)"
        ).fetchone() or (0, 0, 0)
    assert (sent, archived, left) == (THREADS * PER_THREAD, THREADS * PER_THREAD, 0)


def test_without_the_pooler_mode_prepared_statements_break(
    pooled_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the same load with psycopg's defaults fails behind this pooler."""
    monkeypatch.delenv(POOLER_ENV, raising=False)
    with Broker(pooled_dsn, max_connections=THREADS) as broker:
        broker.create_queue("jobs")
        errors = _run_threads(broker, "jobs")
    assert errors, "the pooler let prepared statements through: the other tests prove nothing"
    assert any("prepared statement" in str(exc) for exc in errors), errors


@pytest.mark.usefixtures("pooler_mode")
def test_the_asyncio_client_through_the_pooler(pooled_dsn: str) -> None:
    async def main() -> list[Any]:
        async with AsyncBroker(pooled_dsn, max_connections=THREADS) as broker:
            jobs = await broker.create_queue("jobs")

            async def one(worker: int) -> int:
                done = 0
                for i in range(PER_THREAD // 3):
                    await jobs.send({"worker": worker, "i": i})
                    for message in await jobs.read_many(2, vt=30):
                        await jobs.ack(message)
                        done += 1
                return done

            acked = await asyncio.gather(*(one(n) for n in range(THREADS)))
            rest = await jobs.read_many(THREADS * PER_THREAD, vt=30, wait=0.5)  # polls: no LISTEN here
            return [sum(acked) + len(rest)]

    assert asyncio.run(main()) == [THREADS * (PER_THREAD // 3)]


@pytest.mark.usefixtures("pooler_mode")
def test_the_cli_through_the_pooler(pooled_dsn: str) -> None:
    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pgbroker.cli", "--dsn", pooled_dsn, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    assert cli("create", "jobs").returncode == 0
    lines = "".join(json.dumps({"i": i}) + "\n" for i in range(50))  # one statement, fifty times
    sent = cli("send", "jobs", stdin=lines)
    assert sent.returncode == 0, sent.stderr
    read = cli("read", "jobs", "--qty", "50")
    assert read.returncode == 0, read.stderr
    receipts = [json.loads(line)["receipt"] for line in read.stdout.splitlines()]
    assert len(receipts) == 50
    acked = cli("ack", "jobs", *receipts)
    assert acked.returncode == 0, acked.stderr


WORKER_ARGS = ("--queue", "jobs", "--processes", "2")


def noop(message: Message) -> None:
    """The worker test's handler, run inside the worker processes."""


@pytest.mark.usefixtures("pooler_mode")
def test_two_worker_processes_drain_ten_thousand_messages_through_the_pooler(
    pooled_dsn: str, dsn: str
) -> None:
    _drain_with_worker_processes(pooled_dsn, dsn, 10_000)


def _drain_with_worker_processes(pooled_dsn: str, dsn: str, total: int, *cli_options: str) -> None:
    with Broker(dsn) as direct:
        jobs = direct.create_queue("jobs")
        for start in range(0, total, 1000):
            jobs.send_many([{"n": n} for n in range(start, min(start + 1000, total))])
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgbroker.cli",
            "--dsn",
            pooled_dsn,
            *cli_options,
            "worker",
            f"{__name__}:noop",
            *WORKER_ARGS,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 180
        with psycopg.connect(dsn, autocommit=True) as conn:
            while _count(conn, "pgmq.q_jobs") and worker.poll() is None:
                assert time.monotonic() < deadline, "the workers did not drain the queue in 180 s"
                time.sleep(0.2)
            worker.send_signal(signal.SIGTERM)
            _, stderr = worker.communicate(timeout=60)
            assert worker.returncode == 0, stderr
            assert "Traceback" not in stderr, stderr
            assert "prepared statement" not in stderr, stderr
            archived = conn.execute("SELECT count(DISTINCT message) FROM pgmq.a_jobs").fetchone()
            assert (_count(conn, "pgmq.q_jobs"), archived) == (0, (total,))
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()


def _count(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # noqa: S608 (a test's own constant)
    return int(row[0]) if row else 0


@pytest.mark.usefixtures("pooler_mode")
def test_the_http_api_through_the_pooler(pooled_dsn: str, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgmq.create('jobs')")
        _, token = create_key(conn, "pooled", scopes=["send", "read"])
    with (
        pgbroker_serve(pooled_dsn, "--connections", "4") as server,
        httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {token}"}, timeout=10) as http,
    ):
        for i in range(100):
            assert http.post("/v1/queues/jobs/messages", json={"message": {"i": i}}).status_code == 201
        got: list[int] = []
        while len(got) < 100:
            read = http.post("/v1/queues/jobs/read", json={"qty": 10, "vt": 30})
            assert read.status_code == 200, read.text
            messages = read.json()["messages"]
            assert messages, "messages went missing"
            acked = http.post("/v1/queues/jobs/ack", json={"receipts": [m["receipt"] for m in messages]})
            assert acked.status_code == 200, acked.text
            got += [m["message"]["i"] for m in messages]
        assert sorted(got) == list(range(100))


# -- the pooler as an argument, with no PGBROKER_POOLER -------------------------------------------


@pytest.fixture
def no_pooler_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POOLER_ENV, raising=False)  # also for the processes the tests start


@pytest.mark.usefixtures("no_pooler_env")
def test_the_clients_pooler_argument(pooled_dsn: str) -> None:
    with Broker(pooled_dsn, max_connections=THREADS, pooler="transaction") as broker:
        broker.create_queue("jobs")
        assert _run_threads(broker, "jobs") == []

    async def main() -> list[BaseException | None]:
        async with AsyncBroker(pooled_dsn, max_connections=THREADS, pooler="transaction") as broker:
            jobs = await broker.create_queue("jobs")

            async def one(worker: int) -> None:
                for i in range(PER_THREAD // 3):
                    await jobs.send({"worker": worker, "i": i})
                    await jobs.ack_many(await jobs.read_many(2, vt=30))

            results = await asyncio.gather(*(one(n) for n in range(THREADS)), return_exceptions=True)
            await jobs.read_many(1, vt=30, wait=0.3)  # a waiting read polls: no LISTEN through the pooler
            return list(results)

    assert asyncio.run(main()) == [None] * THREADS


@pytest.mark.usefixtures("no_pooler_env")
def test_the_cli_pooler_option(pooled_dsn: str) -> None:
    def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pgbroker.cli", "--dsn", pooled_dsn, "--pooler", "transaction", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    assert cli("create", "jobs").returncode == 0
    sent = cli("send", "jobs", stdin="".join(json.dumps({"i": i}) + "\n" for i in range(50)))
    assert sent.returncode == 0, sent.stderr
    read = cli("read", "jobs", "--qty", "50")
    assert read.returncode == 0, read.stderr
    receipts = [json.loads(line)["receipt"] for line in read.stdout.splitlines()]
    assert len(receipts) == 50
    acked = cli("ack", "jobs", *receipts)
    assert acked.returncode == 0, acked.stderr


@pytest.mark.usefixtures("no_pooler_env")
def test_worker_processes_with_the_cli_pooler_option(pooled_dsn: str, dsn: str) -> None:
    _drain_with_worker_processes(pooled_dsn, dsn, 2_000, "--pooler", "transaction")


@pytest.mark.usefixtures("no_pooler_env")
def test_the_http_api_with_the_serve_pooler_option(pooled_dsn: str, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgmq.create('jobs')")
        _, token = create_key(conn, "pooled", scopes=["send", "read"])
    with (
        pgbroker_serve(pooled_dsn, "--connections", "4", "--pooler", "transaction") as server,
        httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {token}"}, timeout=10) as http,
    ):

        def send(i: int) -> int:
            return http.post("/v1/queues/jobs/messages", json={"message": {"i": i}}).status_code

        with ThreadPoolExecutor(THREADS) as pool:  # concurrent requests, on the server's 4 connections
            assert set(pool.map(send, range(200))) == {201}
        read = http.post("/v1/queues/jobs/read", json={"qty": 200, "vt": 30})
        assert read.status_code == 200, read.text
        assert len(read.json()["messages"]) == 200
