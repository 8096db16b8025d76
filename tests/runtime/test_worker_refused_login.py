"""A running worker whose login the server starts refusing (its password changed by ALTER ROLE,
as a rotation does): it goes on trying, says why at ERROR (worker.database_refused, the server's
words), and takes the new password from its passfile at the next connection, with no restart.

Its pool used to find no connection in time and the worker to warn only "no answer from the
server within 30 s": the refusal was in psycopg_pool's warnings alone, among those of any outage.
The cluster is a private one whose pg_hba.conf asks every role but the superuser for a password
(scram-sha-256).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from pgbroker import Broker, Message, Stream, StreamWorker, Worker
from pgbroker.embedded import EmbeddedPostgres
from pgbroker.queues._refusal_watch import LOOK_EVERY
from pgbroker.runtime._app import serve
from tests.support.passwords import refuse_login, with_passwords, write_passfile
from tests.support.worker import while_serving

ROLE = "rotated"


def test_a_worker_says_at_error_that_its_login_is_refused_and_takes_the_new_password(
    cluster: EmbeddedPostgres,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    passfile = tmp_path / "pgpass"
    write_passfile(passfile, ROLE, "first")
    monkeypatch.setenv("PGPASSFILE", str(passfile))  # libpq reads it at every connection
    dsn = with_passwords(cluster, ROLE, "first")
    with Broker(dsn) as broker:  # ROLE, with the passfile's password
        broker.create_queue("jobs")
    handled: list[int] = []

    def handle(message: Message) -> None:
        handled.append(message.msg_id)

    worker = Worker("jobs", handle, poll_max=1.0)

    def refused() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.ERROR and r.getMessage().startswith("worker.database_refused ")
        ]

    async def scenario() -> None:
        task = asyncio.create_task(serve([worker], dsn=dsn, handle_signals=False))
        with Broker(cluster.dsn()) as admin:  # the superuser: trusted
            admin.queue("jobs").send({"n": 1})
            await while_serving(task, lambda: len(handled) == 1, "the first message handled")
            refuse_login(cluster, ROLE, "second")  # the worker's connections: made again, refused
            await while_serving(task, lambda: bool(refused()), "an ERROR naming the refusal", seconds=120)
            write_passfile(passfile, ROLE, "second")  # the rotation reaches the passfile
            admin.queue("jobs").send({"n": 2})
            await while_serving(task, lambda: len(handled) == 2, "a message handled after it", seconds=120)
        worker.stop()
        await task

    asyncio.run(scenario())
    assert 'password authentication failed for user \\"rotated\\"' in refused()[0], refused()
    assert len(refused()) == 1  # said once the outage began; again only every minute while it lasts


def test_a_refused_login_is_said_once_per_process_whatever_it_consumes(
    cluster: EmbeddedPostgres,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three queues and a stream group on one pool: one worker.database_refused at ERROR, not one
    per queue (each queue worker had its own watch on the shared pool: three ERRORs at each
    refusal, every minute), and a stream worker's process says it too (one without retries had
    none: only the worker of its retry queue watched)."""
    caplog.set_level(logging.WARNING)
    passfile = tmp_path / "pgpass"
    write_passfile(passfile, ROLE, "first")
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    dsn = with_passwords(cluster, ROLE, "first")
    queues = ["a", "b", "c"]
    with Broker(cluster.dsn()) as admin:
        for name in queues:
            admin.create_queue(name)
        clicks = Stream(admin, "clicks")
        clicks.create(partitions=1)
        clicks.create_group("g", start="start")

    def refused() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.ERROR and r.getMessage().startswith("worker.database_refused ")
        ]

    async def refusals_of(workers: list[Worker | StreamWorker]) -> list[str]:
        caplog.clear()
        task = asyncio.create_task(serve(workers, dsn=dsn, handle_signals=False, schedules=False))
        await while_serving(task, lambda: all(w.stats.reads for w in workers), "every worker reading")
        refuse_login(cluster, ROLE, "second")
        try:
            await while_serving(task, lambda: bool(refused()), "an ERROR naming the refusal", seconds=60)
            await asyncio.sleep(3 * LOOK_EVERY)  # every watch of the pool has looked since
        finally:
            refuse_login(cluster, ROLE, "first")  # the passfile's password again: the next phase logs in
            for worker in workers:
                worker.stop()
            await task
        return refused()

    queue_workers: list[Worker | StreamWorker] = [Worker(name, print, poll_max=1.0) for name in queues]
    assert len(asyncio.run(refusals_of(queue_workers))) == 1, refused()
    stream_worker = StreamWorker("clicks", "g", print, poll_max=1.0, retries=False)  # no retry queue's worker
    assert len(asyncio.run(refusals_of([stream_worker]))) == 1, refused()
