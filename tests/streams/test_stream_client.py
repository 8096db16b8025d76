"""The stream clients (pgbroker.streams, generated from pgbroker.streams._client_async): the same calls
through the sync and asyncio twins, typed errors, batch acks with failures, and a waiting read
woken by a notification."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime

import psycopg
import pytest

from pgbroker import Broker
from pgbroker.errors import InvalidArgument, QueueNameConflict, StreamGroupNotFound, StreamNotFound
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.streams._client import Stream, list_streams
from pgbroker.streams._client_async import AsyncStream


def test_send_read_ack_with_failures(broker: Broker) -> None:
    clicks = Stream(broker, "clicks")
    info = clicks.create(partitions=2)
    assert (info.name, info.partitions) == ("clicks", 2)
    assert clicks.create_group("billing", start="start") == "clicks_billing_retry"
    ids = clicks.send_many([{"n": i} for i in range(10)], keys=[f"user-{i % 3}" for i in range(10)])
    clicks.send({"n": 10}, key="user-0", headers={"trace": "t1"})
    consumer = clicks.consumer("billing")
    batch = consumer.read(100)
    assert sorted(m.id for m in batch) == [*ids, ids[-1] + 1]
    assert next(m for m in batch if m.message == {"n": 10}).headers == {"trace": "t1"}
    batch.fail(batch.messages[0], "no such customer")
    assert set(consumer.ack(batch).values()) == {True}
    retry = broker.queue("clicks_billing_retry").peek()
    assert [m.message for m in retry] == [batch.messages[0].message]
    (group,) = clicks.groups()
    assert (group.name, group.lag, group.consumers) == ("billing", 0, 1)
    assert {lag.owner for lag in clicks.lag()} == {consumer.name}
    assert [s.name for s in list_streams(broker)] == ["clicks"]
    assert consumer.release() == 2


def test_ack_and_read_is_one_call_a_batch(broker: Broker) -> None:
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    ids = clicks.send_many([{"n": i} for i in range(25)])
    consumer = clicks.consumer("g")
    seen: list[int] = []
    batch = consumer.read(10)
    while batch:
        seen.extend(m.id for m in batch)
        batch = consumer.ack_and_read(batch, 10)
    assert seen == ids
    assert clicks.groups()[0].lag == 0


def test_a_group_from_a_time(broker: Broker) -> None:
    clicks = Stream(broker, "clicks")
    clicks.create()
    clicks.send({"n": "before"})
    time.sleep(0.05)
    middle = datetime.now(UTC)
    time.sleep(0.05)
    clicks.send({"n": "after"})
    clicks.create_group("late", start=middle)
    assert [m.message for m in clicks.consumer("late").read()] == [{"n": "after"}]


def test_errors_are_typed_and_name_the_fix(broker: Broker) -> None:
    with pytest.raises(StreamNotFound, match="does not exist") as err:
        Stream(broker, "nope").send({})
    assert err.value.hint is not None
    assert "create" in err.value.hint
    Stream(broker, "clicks").create()
    with pytest.raises(StreamGroupNotFound):
        Stream(broker, "clicks").consumer("nope").read()
    with pytest.raises(InvalidArgument, match="start"):
        Stream(broker, "clicks").create_group("g", start="middle")
    # Two groups never share a retry queue (tests/engine/test_stream_engine.py).
    Stream(broker, "clicks").create_group("g")
    with pytest.raises(QueueNameConflict, match="clicks_G_retry") as conflict:
        Stream(broker, "clicks").create_group("G")
    assert "retry_queue" in str(conflict.value.hint)
    with pytest.raises(InvalidArgument, match="partitions"):
        Stream(broker, "other").create(partitions=0)


def test_a_send_in_a_transaction_commits_with_it(broker: Broker) -> None:
    clicks = Stream(broker, "clicks")
    clicks.create()
    clicks.create_group("g", start="start")
    with broker.transaction() as tx:
        Stream(tx, "clicks").send({"n": "rolled back"})
        raise psycopg.Rollback
    with broker.transaction() as tx:
        Stream(tx, "clicks").send({"n": "kept"})
    assert [m.message for m in clicks.consumer("g").read()] == [{"n": "kept"}]


def test_a_waiting_read_is_woken_by_a_send(broker: Broker) -> None:
    clicks = Stream(broker, "clicks")
    clicks.create(notify=True)
    clicks.create_group("g")
    consumer = clicks.consumer("g")
    consumer.read()  # takes the partitions
    timer = threading.Timer(0.3, lambda: clicks.send({"n": 1}))
    started = time.monotonic()
    timer.start()
    batch = consumer.read(wait=10)
    assert [m.message for m in batch] == [{"n": 1}]
    assert time.monotonic() - started < 5


def test_the_asyncio_twin(dsn: str) -> None:
    async def main() -> None:
        async with AsyncBroker(dsn) as broker:
            clicks = AsyncStream(broker, "clicks")
            await clicks.create(partitions=3)
            await clicks.create_group("g", start="start")
            ids = await clicks.send_many([{"n": i} for i in range(7)])
            consumer = clicks.consumer("g")
            batch = await consumer.read(100)
            assert sorted(m.id for m in batch) == ids
            assert set((await consumer.ack(batch)).values()) == {True}
            assert (await clicks.groups())[0].lag == 0

    asyncio.run(main())
