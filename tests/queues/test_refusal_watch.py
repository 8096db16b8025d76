"""The refusal watch (queues/_refusal_watch.py) and the background tasks (_background.py): a task
that meets a failure it does not expect says it at ERROR at once and runs again (it ended without
a word: a task's exception is kept until someone awaits it, here the stop), and the watch says its
refusal in a process whose sockets are numbered above select's 1024."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from pgbroker._background import restarting
from pgbroker._db.liveness import ready_within, server_has_written
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.queues._refusal_watch import LOOK_EVERY, RefusalWatch

# Above select.select's FD_SETSIZE (1024): a socket opened now is numbered above it.
HIGH_DESCRIPTOR = 1100


@contextmanager
def descriptors_below_taken(ceiling: int) -> Iterator[None]:
    """Every file descriptor below ``ceiling`` in use while inside, as in a busy server (its client
    sockets) whose limit was raised: the process's next socket is numbered above it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2 * ceiling:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2 * ceiling, hard), hard))
    taken: list[int] = []
    try:
        while not taken or taken[-1] < ceiling:
            taken.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_process_whose_sockets_are_numbered_above_1024_still_says_its_refusal(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A pool refused by the server (its database does not exist) in a process whose sockets are
    numbered above 1024, as a busy server's with a raised limit: the refusal is said. The watch's
    second try of the refused connection waited for the server with select.select, which refuses
    such a descriptor (ValueError): the watch failed instead, and every checkout of a pooled
    connection too (_db.liveness.server_has_written)."""
    refused = make_conninfo(dsn, dbname="pgbroker_no_such_database")
    logger = logging.getLogger("pgbroker.tests.refusals")
    caplog.set_level(logging.ERROR, logger=logger.name)

    def said() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("test.refused")]

    async def scenario() -> None:
        pool = AsyncConnectionPool(refused, kwargs={}, min_size=1, open=False, reconnect_timeout=3600)
        await pool.open()  # connections made in the background: each attempt refused
        try:
            async with RefusalWatch(logger, "test.refused", "test").watching(AsyncBroker(pool=pool)):
                deadline = asyncio.get_running_loop().time() + 6 * LOOK_EVERY
                while not said():
                    assert asyncio.get_running_loop().time() < deadline, "nothing said by the watch"
                    await asyncio.sleep(0.2)
        finally:
            await pool.close()

    with descriptors_below_taken(HIGH_DESCRIPTOR):
        asyncio.run(scenario())
    record = said()[0]
    assert record.getMessage().startswith("test.refused "), record.getMessage()
    assert 'database \\"pgbroker_no_such_database\\" does not exist' in record.getMessage()


def test_an_idle_connection_numbered_above_1024_is_checked_without_error(dsn: str) -> None:
    """The check of a pooled connection before each call (whether the server closed it) works on a
    socket numbered above 1024; select.select raised ValueError there."""
    with descriptors_below_taken(HIGH_DESCRIPTOR), psycopg.connect(dsn) as conn:
        assert conn.fileno() >= HIGH_DESCRIPTOR
        assert not server_has_written(conn)
        assert ready_within(conn.fileno(), 0, for_writing=True)


def test_a_background_task_that_fails_is_said_at_error_and_run_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """_background.restarting: each failure said at ERROR with its traceback and the pause before the
    next run, which doubles; the task runs again until it returns."""
    logger = logging.getLogger("pgbroker.tests.background")
    caplog.set_level(logging.ERROR, logger=logger.name)
    runs: list[int] = []

    async def run() -> None:
        runs.append(len(runs))
        if len(runs) < 3:
            raise RuntimeError(f"unexpected {len(runs)}")

    asyncio.run(restarting(run, logger, "test.task_failed", 0.01, queue="q"))
    assert runs == [0, 1, 2]
    said = [r for r in caplog.records if r.getMessage().startswith("test.task_failed ")]
    assert [r.levelno for r in said] == [logging.ERROR, logging.ERROR]
    assert all(r.exc_info is not None and r.exc_info[0] is RuntimeError for r in said)
    assert "restart_in=0.01" in said[0].getMessage()
    assert "restart_in=0.02" in said[1].getMessage()


def test_the_watch_of_a_pool_made_without_kwargs_says_its_refusal(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker on the caller's own pool, made with no kwargs (psycopg_pool keeps None): its refusal
    (a database that does not exist) is said at ERROR. The watch asserted a dict, and died on the
    first refused connection without a word."""
    refused = make_conninfo(dsn, dbname="pgbroker_no_such_database")
    logger = logging.getLogger("pgbroker.tests.refusals")
    caplog.set_level(logging.ERROR, logger=logger.name)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("test.refused ")]

    async def scenario() -> None:
        pool = AsyncConnectionPool(refused, min_size=1, open=False, reconnect_timeout=3600)
        await pool.open()
        try:
            async with RefusalWatch(logger, "test.refused", "test").watching(AsyncBroker(pool=pool)):
                deadline = asyncio.get_running_loop().time() + 6 * LOOK_EVERY
                while not said():
                    assert asyncio.get_running_loop().time() < deadline, "the refusal was never said"
                    await asyncio.sleep(0.2)
        finally:
            await pool.close()

    asyncio.run(scenario())
    assert 'database \\"pgbroker_no_such_database\\" does not exist' in said()[0], said()
