"""A waiting read whose look-up of its channel (the LISTEN's set-up, once per queue or stream and
broker) meets a hung server: it raises ConnectionLost once the server has left the look-up
unanswered for the broker's connect_timeout, where it waited for good.

The read's own first read must be answered, and the look-up after it not: the broker's pool has
two sessions, and the one the look-up takes (psycopg_pool hands out its idle connections in the
order they came back) is frozen with SIGSTOP, as a hung server or a stuck pooler leaves it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgbroker import Broker, ConnectionLost, Stream
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.streams._client_async import AsyncStream
from tests.support.faults import freezable, pids_frozen

# The broker's connect_timeout, which bounds the look-up: ample for a healthy server's answer.
ANSWER_WITHIN = 3.0
# The read's own wait: the look-up, unanswered, outlasts it (and the bound) on the old code.
WAIT = 1.0
# The read raises within this, however loaded the machine (it waited for good).
RAISES_WITHIN = 60.0
STILL_WAITS = f"the waiting read still waits after {RAISES_WITHIN:g} s"


@contextmanager
def look_up_frozen(pool: ConnectionPool[Any]) -> Iterator[None]:
    """The pool's next-but-one connection (the look-up's, the read's being the next) frozen."""
    with pool.connection() as looks_up, pool.connection() as reads:
        frozen = looks_up.info.backend_pid
        del reads  # given back first: the next to be handed out
    with pids_frozen([frozen]):
        yield


def raises_within(read: Callable[[], object]) -> tuple[BaseException | None, float]:
    """What ``read`` raised, and after how long; fails if it did not end within RAISES_WITHIN."""
    outcome: list[BaseException | None] = []
    started = time.monotonic()

    def run() -> None:
        try:
            read()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    reader.join(RAISES_WITHIN)
    assert outcome, STILL_WAITS
    return outcome[0], time.monotonic() - started


def made(dsn: str) -> None:
    with Broker(dsn) as admin:
        admin.create_queue("jobs").enable_notify(0)
        Stream(admin, "clicks").create(partitions=1, notify=True)
        Stream(admin, "clicks").create_group("g", start="start")


@pytest.mark.parametrize("reader", ["queue", "stream consumer"])
def test_a_sync_waiting_read_whose_channel_look_up_is_unanswered_raises_connection_lost(
    dsn: str, reader: str
) -> None:
    made(dsn)
    with ConnectionPool(freezable(dsn), min_size=2, max_size=2, kwargs={"autocommit": True}) as pool:
        pool.wait()
        with Broker(pool=pool, connect_timeout=ANSWER_WITHIN) as broker:
            read: Callable[[], object] = (
                (lambda: broker.queue("jobs").read_many(1, wait=WAIT))
                if reader == "queue"
                else (lambda: Stream(broker, "clicks").consumer("g", name="c").read(1, wait=WAIT))
            )
            with look_up_frozen(pool):
                raised, after = raises_within(read)
            assert isinstance(raised, ConnectionLost), raised
            assert f"no answer from the server within {ANSWER_WITHIN:g} s" in str(raised)
            assert after >= ANSWER_WITHIN
            read()  # and again once the hang is over, on a new session


@pytest.mark.parametrize("reader", ["queue", "queue consume()", "stream consumer"])
def test_an_async_waiting_read_whose_channel_look_up_is_unanswered_raises_connection_lost(
    dsn: str, reader: str
) -> None:
    made(dsn)

    async def read(broker: AsyncBroker) -> object:
        if reader == "queue":
            return await broker.queue("jobs").read_many(1, wait=WAIT)
        if reader == "queue consume()":
            async for message in broker.queue("jobs").consume(idle_wait=WAIT):
                return message
        return await AsyncStream(broker, "clicks").consumer("g", name="c").read(1, wait=WAIT)

    async def scenario() -> tuple[BaseException | None, float]:
        pool = AsyncConnectionPool(
            freezable(dsn), min_size=2, max_size=2, kwargs={"autocommit": True}, open=False
        )
        async with pool:
            await pool.wait()
            async with AsyncBroker(pool=pool, connect_timeout=ANSWER_WITHIN) as broker:
                async with pool.connection() as looks_up, pool.connection() as reads:
                    frozen = looks_up.info.backend_pid
                    del reads  # given back first: the next to be handed out
                with pids_frozen([frozen]):
                    started = time.monotonic()
                    try:
                        async with asyncio.timeout(RAISES_WITHIN):
                            await read(broker)
                    except TimeoutError:
                        raise AssertionError(STILL_WAITS) from None
                    except ConnectionLost as exc:
                        return exc, time.monotonic() - started
                    return None, time.monotonic() - started

    raised, after = asyncio.run(scenario())
    assert isinstance(raised, ConnectionLost), raised
    assert f"no answer from the server within {ANSWER_WITHIN:g} s" in str(raised)
    assert after >= ANSWER_WITHIN
