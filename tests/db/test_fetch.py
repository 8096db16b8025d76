"""A large result's rows are decoded in turns with the event loop's other work
(pgbroker._db.fetch): a read of 1,000 messages lets the other tasks of the loop run between two
slices of its rows, where one piece of decoding held them all back (a worker's handlers whose
sleep had ended waited for the end of it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg.types.json import set_json_loads

from pgbroker import AsyncBroker
from pgbroker._db.fetch import TURN, fetch_rows
from pgbroker.queues import _queries as q
from pgbroker.runtime._round_trips import run_together
from pgbroker.streams import _queries as sq

MESSAGES = 1_000


class NotingLoads:
    """json.loads, noting "row" in ``events`` each time (a class: psycopg warns of closures)."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def __call__(self, data: str | bytes) -> Any:
        self.events.append("row")
        return json.loads(data)


async def decoded_with_ticks(
    dsn: str, read: Callable[[psycopg.AsyncConnection[Any]], Awaitable[int]]
) -> list[str]:
    """What happened on the loop while ``read`` ran on a connection whose json loader notes each
    value it decodes ("row") beside a task that notes each turn it gets ("tick")."""
    events: list[str] = []

    async def ticker() -> None:
        while True:
            events.append("tick")
            await asyncio.sleep(0)

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        broker = AsyncBroker(connection=conn)
        queue = await broker.create_queue("jobs")
        await queue.send_many([{"n": n} for n in range(MESSAGES)])
        set_json_loads(NotingLoads(events), conn)
        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        try:
            assert await read(conn) == MESSAGES
        finally:
            ticking.cancel()
    return events


def ticks_among_rows(events: list[str]) -> int:
    first, last = events.index("row"), len(events) - 1 - events[::-1].index("row")
    assert events.count("row") == MESSAGES
    return events[first:last].count("tick")


def test_a_client_read_of_many_messages_lets_the_loop_run_while_its_rows_are_decoded(dsn: str) -> None:
    async def read(conn: psycopg.AsyncConnection[Any]) -> int:
        found = await AsyncBroker(connection=conn).queue("jobs").read_many(MESSAGES)
        assert [m.message["n"] for m in found] == list(range(MESSAGES))
        return len(found)

    events = asyncio.run(decoded_with_ticks(dsn, read))
    assert ticks_among_rows(events) >= MESSAGES // TURN - 1


def test_a_workers_round_trip_does_too(dsn: str) -> None:
    async def read(conn: psycopg.AsyncConnection[Any]) -> int:
        [found] = await run_together(conn, [q.message_read_many("jobs", MESSAGES)])
        assert [m.message["n"] for m in found] == list(range(MESSAGES))
        return len(found)

    events = asyncio.run(decoded_with_ticks(dsn, read))
    assert ticks_among_rows(events) >= MESSAGES // TURN - 1


def test_records_are_made_in_the_same_slices(dsn: str) -> None:
    events: list[str] = []

    def made(row: tuple[int]) -> int:
        events.append("made")
        return row[0] * 2

    async def ticker() -> None:
        while True:
            events.append("tick")
            await asyncio.sleep(0)

    async def fetched() -> list[int]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cursor = await conn.execute("SELECT g FROM generate_series(1, %s) g", [MESSAGES])
            ticking = asyncio.create_task(ticker())
            await asyncio.sleep(0)
            try:
                return await fetch_rows(cursor, made)
            finally:
                ticking.cancel()

    assert asyncio.run(fetched()) == [2 * g for g in range(1, MESSAGES + 1)]
    first, last = events.index("made"), len(events) - 1 - events[::-1].index("made")
    assert events[first:last].count("tick") >= MESSAGES // TURN - 1


def test_the_reads_of_the_hot_paths_make_their_records_as_they_fetch() -> None:
    for query in (
        q.message_read_many("jobs", 10),
        q.message_read_many("jobs", 10, decode=False),
        q.message_complete_and_read("jobs", [], 10),
        q.message_pop_many("jobs", 10),
        sq.stream_read("events", "group", "consumer", 10, 30, None),
        sq.stream_consume("events", "group", "consumer", 10, 30, None, None),
    ):
        assert query.row is not None, query.sql


def test_small_results_and_statements_without_rows(dsn: str) -> None:
    async def fetched() -> tuple[list[Any], list[Any], list[Any]]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            small = await fetch_rows(await conn.execute("SELECT g FROM generate_series(1, %s) g", [TURN]))
            large = await fetch_rows(await conn.execute("SELECT g FROM generate_series(1, 1000) g"))
            none = await fetch_rows(await conn.execute("SET application_name = 'fetch test'"))
            return small, large, none

    small, large, none = asyncio.run(fetched())
    assert small == [(g,) for g in range(1, TURN + 1)]
    assert large == [(g,) for g in range(1, 1001)]
    assert none == []
