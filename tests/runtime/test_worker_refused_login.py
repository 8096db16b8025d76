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

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgbroker import Broker, Message, Worker
from pgbroker.embedded import EmbeddedPostgres
from pgbroker.runtime._app import serve
from tests.support.worker import while_serving

ROLE = "rotated"


def _with_passwords(cluster: EmbeddedPostgres) -> str:
    """Ask every role but the superuser for a password; ROLE has 'first' and pgbroker's rights."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD 'first' IN ROLE postgres")
        (cluster.data_dir / "pg_hba.conf").write_text(
            "local all postgres trust\nlocal all all scram-sha-256\n"
        )  # rewritten in place: the server's user keeps owning it
        conn.execute("SELECT pg_reload_conf()")
    return make_conninfo(cluster.dsn(), user=ROLE)


def test_a_worker_says_at_error_that_its_login_is_refused_and_takes_the_new_password(
    cluster: EmbeddedPostgres,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:{ROLE}:first\n")
    passfile.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(passfile))  # libpq reads it at every connection
    dsn = _with_passwords(cluster)
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
            with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
                conn.execute(f"ALTER ROLE {ROLE} PASSWORD 'second'")
                sessions = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s"
                conn.execute(sessions, [ROLE])  # the worker's connections: made again, refused
            await while_serving(task, lambda: bool(refused()), "an ERROR naming the refusal", seconds=120)
            passfile.write_text(f"*:*:*:{ROLE}:second\n")  # the rotation reaches the passfile
            admin.queue("jobs").send({"n": 2})
            await while_serving(task, lambda: len(handled) == 2, "a message handled after it", seconds=120)
        worker.stop()
        await task

    asyncio.run(scenario())
    assert 'password authentication failed for user \\"rotated\\"' in refused()[0], refused()
    assert len(refused()) == 1  # said once the outage began; again only every minute while it lasts
