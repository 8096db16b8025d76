"""The inbound bridges' targets (pgbroker.bridge.core.inbound_targets) on a real database: what
a bridge's pruning forgets."""

from __future__ import annotations

import asyncio

from pgbroker import Broker
from pgbroker.bridge.core.inbound_targets import QueueTarget, StreamTarget
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.streams._client import Stream
from pgbroker.streams._client_async import AsyncStream
from tests.support.tables import Conn


def test_a_bridge_forgets_only_its_own_queue_s_message_ids(broker: Broker, dsn: str, conn: Conn) -> None:
    # Each bridge prunes with its own --dedup-window. Bridge B (into "short", a window of a minute)
    # forgot the ids of every queue: those of "long", whose bridge keeps them a day, went after a
    # minute, and a redelivery of one of them was sent again.
    for name in ("long", "short"):
        broker.create_queue(name)

    async def scenario() -> None:
        async with AsyncBroker(dsn) as abroker:
            await abroker.queue("long").receive_many(["l1"], [1], [None], seen_within=86_400)
            await abroker.queue("short").receive_many(["s1"], [1], [None], seen_within=60)
            conn.execute("UPDATE pgbroker.inbound_seen SET seen_at = now() - interval '2 minutes'")
            assert await QueueTarget(abroker, "short").prune(60) == 1
            assert await abroker.queue("long").receive_many(["l1"], [2], [None], seen_within=86_400) == []

    asyncio.run(scenario())
    remembered = conn.execute("SELECT queue_name, message_id FROM pgbroker.inbound_seen").fetchall()
    assert remembered == [("long", "l1")]


def test_a_stream_bridge_forgets_only_its_own_stream_s_message_ids(
    broker: Broker, dsn: str, conn: Conn
) -> None:
    # As for queues: the bridge into "short" forgot the ids of every stream, with its own window.
    for name in ("long", "short"):
        Stream(broker, name).create(partitions=1)

    async def scenario() -> None:
        async with AsyncBroker(dsn) as abroker:
            await AsyncStream(abroker, "long").receive_many(["l1"], [1], [None], [None], seen_within=86_400)
            await AsyncStream(abroker, "short").receive_many(["s1"], [1], [None], [None], seen_within=60)
            conn.execute("UPDATE pgbroker.stream_inbound_seen SET seen_at = now() - interval '2 minutes'")
            assert await StreamTarget(abroker, "short").prune(60) == 1

    asyncio.run(scenario())
    remembered = conn.execute("SELECT stream_name, message_id FROM pgbroker.stream_inbound_seen").fetchall()
    assert remembered == [("long", "l1")]
