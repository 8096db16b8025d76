"""Workers across an upgrade: `pgbroker install` drops or re-signatures functions, and a call that
was running when it committed goes on with the functions it started with, so it may fail once with
"function ... does not exist" (42883, NotInstalled) or "column ... does not exist" (42703);
tests/system/test_upgrade_under_load.py met both. A Worker, a StreamWorker and the scheduler that
have worked on the database wait that out as they wait out a lost connection, and go on; before
they have, a database without pgbroker still stops them with what to do
(tests/system/test_scheduler_processes.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from pgbroker import AsyncBroker, AsyncStream, Message, StreamMessage
from pgbroker.runtime._app import serve
from pgbroker.runtime._stream_worker import StreamWorker
from pgbroker.runtime._worker import Worker
from tests.support.worker import while_serving

# The calls each of them makes while idle: the Worker's read, the StreamWorker's read, the
# scheduler's look-up of its next tick; the Worker's read also meets a column gone.
GONE = ("read", "stream_read", "stream_consume", "schedule_next_wake")


def _rename(conn: psycopg.Connection[Any], suffix_from: str, suffix_to: str) -> None:
    for (statement,) in conn.execute(
        "SELECT format('ALTER FUNCTION %%s RENAME TO %%I', p.oid::regprocedure,"
        "              left(p.proname, length(p.proname) - length(%s)) || %s)"
        " FROM pg_proc p WHERE p.pronamespace = 'pgbroker'::regnamespace AND p.proname = ANY(%s)",
        [suffix_from, suffix_to, [name + suffix_from for name in GONE]],
    ).fetchall():
        conn.execute(statement)


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
                    # A column every read of the queue looks at, as an upgrade moves one.
                    conn.execute(
                        "ALTER TABLE pgbroker.queue_head RENAME COLUMN ready_from TO ready_from_gone"
                    )
                    try:
                        await asyncio.sleep(1.5)
                        assert not serving.done(), serving.exception()
                    finally:
                        conn.execute(
                            "ALTER TABLE pgbroker.queue_head RENAME COLUMN ready_from_gone TO ready_from"
                        )
                    _rename(conn, "", "_gone")
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
