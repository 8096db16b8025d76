"""What pgbroker sets up on the connections it opens (pgbroker._db.session): a session whose time
zone is UTC under another name is named UTC, so that psycopg reads timestamps through its fast
path; a session in any other zone, and a connection the application passes in, are left alone."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgbroker import AsyncBroker, Broker


def in_zone(dsn: str, zone: str) -> str:
    return make_conninfo(dsn, options=f"-c TimeZone={zone}")


@pytest.mark.parametrize("zone", ["Etc/UTC", "UCT", "Zulu"])
def test_a_session_in_utc_under_another_name_reads_timestamps_in_plain_utc(dsn: str, zone: str) -> None:
    before = datetime.now(UTC) - timedelta(minutes=1)
    with Broker(in_zone(dsn, zone), max_connections=1) as broker:
        queue = broker.create_queue("jobs")
        queue.send({"n": 1})
        message = queue.read()
        assert message is not None
        with broker.connection() as conn:
            assert conn.info.parameter_status("TimeZone") == "UTC"
    for stamp in (message.enqueued_at, message.last_read_at, message.vt):
        assert stamp is not None
        assert stamp.tzinfo is UTC  # psycopg's fast path: zoneinfo's Etc/UTC took 0.35 us more a value
        assert stamp > before


def test_an_async_broker_does_the_same(dsn: str) -> None:
    async def read_back() -> datetime:
        async with AsyncBroker(in_zone(dsn, "Etc/UTC"), max_connections=1) as broker:
            queue = await broker.create_queue("jobs")
            await queue.send({"n": 1})
            message = await queue.read()
            assert message is not None
            return message.enqueued_at

    assert asyncio.run(read_back()).tzinfo is UTC


def test_another_zone_and_a_connection_passed_in_are_left_as_they_are(dsn: str) -> None:
    with Broker(in_zone(dsn, "Europe/Paris"), max_connections=1) as broker:
        queue = broker.create_queue("jobs")
        queue.send({"n": 1})
        message = queue.read()
        assert message is not None
        assert message.enqueued_at.tzinfo == ZoneInfo("Europe/Paris")
    with psycopg.connect(in_zone(dsn, "Etc/UTC"), autocommit=True) as conn:
        queue = Broker(connection=conn).queue("jobs")
        queue.send({"n": 2})
        message = queue.read()
        assert message is not None
        assert message.enqueued_at.tzinfo == ZoneInfo("Etc/UTC")
        assert conn.info.parameter_status("TimeZone") == "Etc/UTC"
