"""Workers across an upgrade: `pgbroker install` drops or re-signatures functions, and a call that
was running when it committed goes on with the functions it started with, so it may fail once with
"function ... does not exist" (42883, NotInstalled) or "column ... does not exist" (42703);
tests/system/test_upgrade_under_load.py met both. A Worker, a StreamWorker and the scheduler that
have worked on the database wait that out as they wait out a lost connection, and go on; before
they have, a database without pgbroker still stops them with what to do
(tests/system/test_scheduler_processes.py). Only an upgrade is waited out
(pgbroker._db.schema_watch): the same errors without one (a bug, a damaged install), or still
there once the upgrade has settled, stop them with a hint that says so.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
import pytest

from pgbroker import AsyncBroker, AsyncStream, Message, StreamMessage
from pgbroker import _sql as sql
from pgbroker._db import schema_watch
from pgbroker.errors import DatabaseError, NotInstalled
from pgbroker.runtime._app import serve
from pgbroker.runtime._stream_worker import StreamWorker
from pgbroker.runtime._worker import Worker
from pgbroker.schedules._scheduler import Scheduler
from tests.support.worker import while_serving

# The calls each of them makes while idle: the Worker's read, the StreamWorker's read, the
# scheduler's look-up of its next tick; the Worker's read also meets a column gone.
GONE = ("read", "stream_read", "stream_consume", "schedule_next_wake")


def _rename(
    conn: psycopg.Connection[Any], suffix_from: str, suffix_to: str, names: tuple[str, ...] = GONE
) -> None:
    for (statement,) in conn.execute(
        "SELECT format('ALTER FUNCTION %%s RENAME TO %%I', p.oid::regprocedure,"
        "              left(p.proname, length(p.proname) - length(%s)) || %s)"
        " FROM pg_proc p WHERE p.pronamespace = 'pgbroker'::regnamespace AND p.proname = ANY(%s)",
        [suffix_from, suffix_to, [name + suffix_from for name in names]],
    ).fetchall():
        conn.execute(statement)


def _upgrade(conn: psycopg.Connection[Any], change: Callable[[], object]) -> None:
    """``change`` committed as an upgrade commits it: with the function files run again, as
    `pgbroker install` runs them whenever it changes the schema."""
    with conn.transaction():
        for function_file in sql.functions():
            conn.execute(function_file.sql)
        change()


def _rename_column(conn: psycopg.Connection[Any], old: str, new: str) -> None:
    conn.execute(f"ALTER TABLE pgbroker.queue_head RENAME COLUMN {old} TO {new}")


@contextmanager
def _column_gone(conn: psycopg.Connection[Any], *, upgrade: bool) -> Iterator[None]:
    """A column every read of a queue looks at renamed (as an upgrade moves one, or as a bug would
    miss one), and back on the way out."""
    if upgrade:
        _upgrade(conn, lambda: _rename_column(conn, "ready_from", "ready_from_gone"))
    else:
        _rename_column(conn, "ready_from", "ready_from_gone")
    try:
        yield
    finally:
        _rename_column(conn, "ready_from_gone", "ready_from")


def test_workers_and_the_scheduler_ride_out_functions_gone_for_a_moment(dsn: str) -> None:
    handled: list[Any] = []
    streamed: list[Any] = []

    def handle(message: Message) -> None:
        handled.append(message.message)

    def handle_stream(message: StreamMessage) -> None:
        streamed.append(message.message)

    worker = Worker("jobs", handle, poll_max=0.2)
    stream_worker = StreamWorker("events", "g", handle_stream)

    async def scenario() -> None:
        async with AsyncBroker(dsn) as broker:
            await broker.create_queue("jobs")
            await broker.create_queue("ticks")
            stream = AsyncStream(broker, "events")
            await stream.create(partitions=1)
            await stream.create_group("g", start="start")
            await broker.queue("jobs").send(1)
            await stream.send(1)
            serving = asyncio.create_task(
                serve([worker, stream_worker], dsn=dsn, handle_signals=False), name="serving"
            )
            try:
                await while_serving(serving, lambda: handled == [1] and streamed == [1], "the first messages")
                with psycopg.connect(dsn, autocommit=True) as conn:
                    with _column_gone(conn, upgrade=True):
                        await asyncio.sleep(1.5)
                        assert not serving.done(), serving.exception()
                    _upgrade(conn, lambda: _rename(conn, "", "_gone"))
                    try:
                        # Every idle call fails meanwhile; the scheduler is woken to make one.
                        conn.execute("SELECT pg_notify(pgbroker.schedules_channel(), '')")
                        await asyncio.sleep(1.5)
                        assert not serving.done(), serving.exception()
                    finally:
                        _rename(conn, "_gone", "")
                await broker.queue("jobs").send(2)
                await stream.send(2)
                await broker.add_schedule("now", "ticks", "* * * * *", {"tick": True})
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("UPDATE pgbroker.schedules SET next_run = now() - interval '1 second'")
                    conn.execute("SELECT pg_notify(pgbroker.schedules_channel(), '')")

                async def ticked() -> bool:
                    return bool(await broker.queue("ticks").peek())

                await while_serving(
                    serving, lambda: handled == [1, 2] and streamed == [1, 2], "messages after"
                )
                for _ in range(200):
                    if await ticked():
                        break
                    assert not serving.done(), serving.exception()
                    await asyncio.sleep(0.05)
                assert await ticked(), "the scheduler sent no tick after the functions came back"
            finally:
                worker.stop()
                stream_worker.stop()
                await serving

    asyncio.run(scenario())


def _serving_stops(dsn: str, *, upgrade: bool) -> tuple[BaseException, float]:
    """A Worker serving; the column its reads need renamed (committed as an upgrade, or not):
    what stopped serve, and how long after the rename."""
    handled: list[Any] = []
    worker = Worker("jobs", lambda m: handled.append(m.message), poll_max=0.2)

    async def scenario() -> tuple[BaseException, float]:
        async with AsyncBroker(dsn) as broker:
            await broker.create_queue("jobs")
            await broker.queue("jobs").send(1)
            serving = asyncio.create_task(serve([worker], dsn=dsn, handle_signals=False), name="serving")
            try:
                await while_serving(serving, lambda: handled == [1], "the first message")
                with psycopg.connect(dsn, autocommit=True) as conn, _column_gone(conn, upgrade=upgrade):
                    renamed = time.monotonic()
                    done, _ = await asyncio.wait([serving], timeout=STOPS_WITHIN)
                    assert done, f"the worker still waits it out after {STOPS_WITHIN} s"
                    stopped = time.monotonic() - renamed
                failure = serving.exception()
                assert failure is not None
                return failure, stopped
            finally:
                worker.stop()
                await asyncio.wait([serving])

    return asyncio.run(scenario())


# A worker stops within this once it meets a schema wanting without an upgrade: at its next read
# (the poll is 0.2 s), however loaded the machine.
STOPS_WITHIN = 30.0


def test_a_column_gone_without_an_upgrade_stops_the_worker_saying_so(dsn: str) -> None:
    """The column its reads need renamed without an upgrade (the marker of the installed schema
    unchanged: a bug, a damaged install): the worker stops at once with the error and a hint that
    this is no upgrade. It waited it out for good, a worker.schema_changed warning at a time."""
    failure, _ = _serving_stops(dsn, upgrade=False)
    assert isinstance(failure, DatabaseError), repr(failure)
    assert failure.sqlstate == "42703", repr(failure)
    assert "no upgrade" in (failure.hint or ""), failure.hint


def test_a_column_still_gone_once_an_upgrade_has_settled_stops_the_worker(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade that leaves the column its reads need missing (a bug of the new release): the
    worker waits it out while the upgrade settles (UPGRADE_SETTLES, 2 s here), then stops with the
    error. It waited it out for good."""
    monkeypatch.setattr(schema_watch, "UPGRADE_SETTLES", 2.0)
    failure, stopped = _serving_stops(dsn, upgrade=True)
    assert isinstance(failure, DatabaseError), repr(failure)
    assert failure.sqlstate == "42703", repr(failure)
    assert stopped >= 2.0, f"stopped {stopped:.1f} s after the upgrade: not waited out"


def test_the_scheduler_gives_up_on_a_function_gone_without_an_upgrade(dsn: str) -> None:
    """The scheduler's idle call renamed away without an upgrade, once it has worked: it stops
    (gave_up: NotInstalled, with the hint that this is no upgrade), where it retried for good."""
    scheduler = Scheduler()

    async def scenario() -> None:
        async with AsyncBroker(dsn) as broker:
            await broker.create_queue("ticks")
            await broker.add_schedule("now", "ticks", "* * * * *", {"tick": True})
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("UPDATE pgbroker.schedules SET next_run = now() - interval '1 second'")
            running = asyncio.create_task(scheduler.run(broker))
            deadline = time.monotonic() + 60
            while scheduler.stats.sent == 0:  # it has worked
                assert not running.done(), scheduler.gave_up
                assert time.monotonic() < deadline, "no tick sent"
                await asyncio.sleep(0.05)
            with psycopg.connect(dsn, autocommit=True) as conn:
                _rename(conn, "", "_gone")
                try:
                    conn.execute("SELECT pg_notify(pgbroker.schedules_channel(), '')")
                    done, _ = await asyncio.wait([running], timeout=STOPS_WITHIN)
                finally:
                    _rename(conn, "_gone", "")
            scheduler.stop()
            await asyncio.wait([running])
            assert done, f"the scheduler still retries after {STOPS_WITHIN} s"

    asyncio.run(scenario())
    assert isinstance(scheduler.gave_up, NotInstalled), repr(scheduler.gave_up)
    assert "no upgrade" in (scheduler.gave_up.hint or ""), scheduler.gave_up.hint


# The lease of the workers whose handler outlives an upgrade: short, for the message to come back
# within the test when its lease is lost.
_VT = 4


class _SlowHandler:
    """Records each message, and returns only once ``finish`` is set."""

    def __init__(self) -> None:
        self.handled: list[Any] = []
        self.finish = threading.Event()

    def __call__(self, message: Message) -> None:
        self.handled.append(message.message)
        self.finish.wait(60)


@asynccontextmanager
async def _one_message_in_hand(
    dsn: str, worker: Worker, handler: _SlowHandler
) -> AsyncIterator[tuple[AsyncBroker, asyncio.Task[None]]]:
    """``worker`` serving, its handler running on the one message sent (1); the broker, and the
    serving task."""
    async with AsyncBroker(dsn) as broker:
        await broker.create_queue("jobs")
        await broker.queue("jobs").send(1)
        serving = asyncio.create_task(serve([worker], dsn=dsn, handle_signals=False), name="serving")
        try:
            await while_serving(serving, lambda: handler.handled == [1], "the message")
            yield broker, serving
        finally:
            handler.finish.set()
            worker.stop()
            await asyncio.wait([serving])


@contextmanager
def _upgraded_away(dsn: str, function: str) -> Iterator[None]:
    """An upgrade committed that re-made pgbroker's ``function`` under another name (as an upgrade
    re-signatures a function), undone on the way out."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _upgrade(conn, lambda: _rename(conn, "", "_gone", (function,)))
        try:
            yield
        finally:
            _rename(conn, "_gone", "", (function,))


def test_an_ack_that_meets_an_upgrade_is_sent_again_within_its_lease(dsn: str) -> None:
    """A handler finishes just after an upgrade committed that re-made the ack's function: the ack
    meets "function ... does not exist" once (SchemaChanged). The Worker's sender of lingering
    acks tries it again while the lease holds, as the reads do, and the message is handled once.
    It gave the ack up at once (worker.ack_refused, "the ack failed: function pgbroker.complete
    ... does not exist"): the message came back after its lease and was handled a second time."""
    handler = _SlowHandler()
    worker = Worker("jobs", handler, vt=_VT, poll_max=0.2)

    async def scenario() -> None:
        async with _one_message_in_hand(dsn, worker, handler) as (broker, _):
            with _upgraded_away(dsn, "complete"):
                handler.finish.set()  # the ack goes out and meets the upgrade
                await asyncio.sleep(1.5)
            await asyncio.sleep(_VT + 2)  # a message whose ack was given up is read again by now
            assert handler.handled == [1]
            assert (worker.stats.completed, worker.stats.stale) == (1, 0)
            assert (await broker.queue("jobs").metrics()).queue_length == 0

    asyncio.run(scenario())


def test_a_heartbeat_that_meets_an_upgrade_keeps_the_lease(dsn: str) -> None:
    """A handler runs past a third of its lease while an upgrade re-makes the extend function:
    the heartbeat's extend meets "function ... does not exist" once. It is tried again while the
    lease holds, as the reads and acks are, and the message is handled once. The heartbeat called
    outside the worker's SchemaWatch, so the error was no SchemaChanged and the lease was given up
    at once (worker.lease_lost): the message came back after its lease and was handled again."""
    handler = _SlowHandler()
    worker = Worker("jobs", handler, vt=_VT, poll_max=0.2)

    async def scenario() -> None:
        async with _one_message_in_hand(dsn, worker, handler) as (_, serving):
            with _upgraded_away(dsn, "extend"):
                # The heartbeat (every vt/6) extends a lease past a third of vt: within this.
                await asyncio.sleep(_VT / 2)
            await asyncio.sleep(_VT + 2)  # a message whose lease was given up is read again by now
            handler.finish.set()
            await while_serving(serving, lambda: worker.stats.completed == 1, "the ack")
            assert handler.handled == [1]
            assert worker.stats.stale == 0

    asyncio.run(scenario())


def test_a_give_back_at_shutdown_that_meets_an_upgrade_is_tried_again(dsn: str) -> None:
    """A worker stopped without a grace period while an upgrade re-makes the nack function: its
    give-back of the message in hand meets "function ... does not exist" once, is tried again
    within the lease, and the message is visible again at once for the next consumer. It was
    given up (worker.release_failed): the message stayed leased until its vt ran out."""
    handler = _SlowHandler()
    worker = Worker("jobs", handler, vt=60, poll_max=0.2)

    async def scenario() -> None:
        async with _one_message_in_hand(dsn, worker, handler) as (broker, serving):
            with _upgraded_away(dsn, "nack"):
                worker.stop(grace_period=0)  # the give-back goes out and meets the upgrade
                await asyncio.sleep(1.5)
            await asyncio.wait([serving], timeout=30)
            assert worker.stats.released == 1
            again = await broker.queue("jobs").read(vt=1)
            assert again is not None, "the message is still leased"
            assert again.message == 1

    asyncio.run(scenario())
