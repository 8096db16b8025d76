"""The refusal watch (queues/_refusal_watch.py) met with a failure it does not expect: said at ERROR
at once, with the exception, and the watch starts again. It ended without a word (a task's
exception is kept until someone awaits it: here, the stop), and the command ran on with no one to
say why its connections fail."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from pgbroker.queues._client_async import AsyncBroker
from pgbroker.queues._refusal_watch import LOOK_EVERY, RefusalWatch

# Above select.select's FD_SETSIZE (1024).
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


def test_a_failure_the_watch_does_not_expect_is_said_at_error_and_it_watches_on(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A pool refused by the server (its database does not exist) in a process whose sockets are
    numbered above 1024: the watch's second try of the refused connection, which waits for the
    server with select.select, fails with ValueError. That is said at ERROR at once, with the
    traceback, and the watch runs again."""
    refused = make_conninfo(dsn, dbname="pgbroker_no_such_database")
    logger = logging.getLogger("pgbroker.tests.refusals")
    caplog.set_level(logging.ERROR, logger=logger.name)

    def failed() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("test.refused_watch_failed ")]

    async def scenario() -> bool:
        pool = AsyncConnectionPool(refused, kwargs={}, min_size=1, open=False, reconnect_timeout=3600)
        await pool.open()  # connections made in the background: each attempt refused
        broker = AsyncBroker(pool=pool)
        try:
            async with RefusalWatch(logger, "test.refused", "test").watching(broker):
                deadline = asyncio.get_running_loop().time() + 6 * LOOK_EVERY
                while not failed():
                    assert asyncio.get_running_loop().time() < deadline, "no ERROR from the watch"
                    await asyncio.sleep(0.2)
                (watch,) = [t for t in asyncio.all_tasks() if t.get_name() == "pgbroker-test.refused"]
                await asyncio.sleep(1.0)
                return not watch.done()
        finally:
            await pool.close()

    with descriptors_below_taken(HIGH_DESCRIPTOR):
        watching_on = asyncio.run(scenario())
    record = failed()[0]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
    assert record.exc_info[0] is ValueError, record.exc_info
    assert f"restart_in={LOOK_EVERY:g}" in record.getMessage(), record.getMessage()
    assert watching_on, "the watch ended after the failure"


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
