"""Codecs through the clients and the worker: every codec round trips per send and as a queue's
default, sync and asyncio; bad values, unknown codecs and damaged stored bodies give typed errors
and change nothing (docs/codecs.md)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from pgbroker import Broker, InvalidArgument, Message, Worker
from pgbroker.codecs import CorruptBody, EncodeError, UnknownCodec, envelope_codec
from pgbroker.queues._client_async import AsyncBroker
from tests.support.codec_types import AVRO, PROTOBUF, samples
from tests.support.tables import Conn, a_rows, q_rows
from tests.support.worker import run_until

CODECS = list(samples())
DEAD = "x-pgbroker-dead-letter"


def stored_codecs(conn: Conn, queue: str) -> list[str]:
    """The codec of each stored body, read from the table (json for a body without envelope)."""
    return [envelope_codec(row[3]) if "$pgbroker" in row[3] else "json" for row in q_rows(conn, queue)]


def test_the_sync_client_round_trips_every_codec_per_send(broker: Broker, conn: Conn) -> None:
    queue = broker.create_queue("orders")
    for name in CODECS:
        queue.send_many([samples(1)[name], samples(2)[name]], codec=name)
    assert stored_codecs(conn, "orders") == [name for name in CODECS for _ in (1, 2)]
    stored = [row[3] for row in q_rows(conn, "orders")]
    peeked = queue.peek(100)
    read = queue.read_many(100, vt=30)
    popped = queue.pop_many(100)
    assert popped == []  # all leased
    for found in (peeked, read):
        assert [(m.codec, m.message) for m in found] == [
            (name, samples(n)[name]) for name in CODECS for n in (1, 2)
        ]
        assert all(m.codec_error is None for m in found)
    queue.ack_many(read)
    assert [row[2] for row in a_rows(conn, "orders")] == stored  # the archive keeps the stored form


def test_the_async_client_round_trips_every_codec_per_send(dsn: str) -> None:
    async def scenario() -> list[tuple[str, Any]]:
        async with AsyncBroker(dsn) as broker:
            queue = await broker.create_queue("orders")
            for name in CODECS:
                await queue.send(samples(5)[name], codec=name)
            popped = await queue.pop_many(10)
            return [(m.codec, m.message) for m in popped]

    assert asyncio.run(scenario()) == [(name, samples(5)[name]) for name in CODECS]


def test_a_queues_policy_codec_is_the_default_of_its_sends(broker: Broker, dsn: str, conn: Conn) -> None:
    queue = broker.create_queue("orders")
    assert queue.policy().codec == "json"
    queue.send({"plain": 1})
    assert queue.set_policy(codec="msgpack").codec == "msgpack"
    queue.send(samples()["msgpack"])  # the same broker knows at once
    queue.send({"plain": 2}, codec="json")  # a send may choose another
    with Broker(dsn) as other:  # another process asks the database
        other.queue("orders").send(samples(1)["msgpack"])
        other.queue("ORDERS").set_policy(codec=AVRO)
        other.queue("orders").send(samples()[AVRO])
    with broker.transaction() as tx:
        tx.queue("orders").send(samples(2)["msgpack"], codec="msgpack")
    assert stored_codecs(conn, "orders") == ["json", "msgpack", "json", "msgpack", AVRO, "msgpack"]
    assert [m.codec for m in queue.read_many(10)] == ["json", "msgpack", "json", "msgpack", AVRO, "msgpack"]
    assert [p.codec for p in broker.policies()] == [AVRO]


def test_an_async_send_takes_the_queues_default_codec(broker: Broker, dsn: str, conn: Conn) -> None:
    broker.create_queue("orders").set_policy(codec=PROTOBUF)

    async def scenario() -> None:
        async with AsyncBroker(dsn) as abroker:
            await abroker.queue("orders").send({"id": 4, "item": "pen"})  # a dict in the type's JSON form

    asyncio.run(scenario())
    [message] = broker.queue("orders").read_many(10)
    assert (message.codec, message.message) == (PROTOBUF, samples(4)[PROTOBUF].__class__(id=4, item="pen"))


def test_dead_letters_keep_their_codec(broker: Broker) -> None:
    queue = broker.create_queue("orders")
    queue.set_policy(max_deliveries=1)
    queue.send(samples(3)[AVRO], codec=AVRO)
    [message] = queue.read_many(1)
    assert queue.fail(message, error="no stock") == "dead_lettered"
    [letter] = queue.dead_letters()
    assert (letter.codec, letter.message) == (AVRO, samples(3)[AVRO])


@pytest.mark.parametrize(
    ("codec", "error"),
    [
        ("cbor", UnknownCodec),
        ("avro:not.Registered", UnknownCodec),
        (PROTOBUF, EncodeError),
        (AVRO, EncodeError),
    ],
)
def test_a_send_the_codec_cannot_take_raises_and_sends_nothing(
    broker: Broker, conn: Conn, codec: str, error: type[Exception]
) -> None:
    queue = broker.create_queue("orders")
    # The second value does not fit the schema or type: the whole batch is refused.
    good = samples()[AVRO] if codec == AVRO else {"id": 1}
    with pytest.raises(error):
        queue.send_many([good, {"id": "x", "no such field": True}], codec=codec)
    assert q_rows(conn, "orders") == []


def test_a_bad_codec_setting_is_refused_and_changes_nothing(broker: Broker, conn: Conn) -> None:
    queue = broker.create_queue("orders")
    queue.set_policy(codec="msgpack")
    for bad in ("MessagePack", "avro:", "protobuf:bad name", "json;drop"):
        with pytest.raises(InvalidArgument, match="codec must be"):
            queue.set_policy(codec=bad)
    assert queue.policy().codec == "msgpack"
    queue.set_policy(codec="avro:not.Registered")  # the server cannot know a process's schemas
    with pytest.raises(UnknownCodec, match="register"):
        queue.send({"id": 1})
    assert q_rows(conn, "orders") == []


def damaged_bodies() -> list[Any]:
    """Stored bodies no codec can read: a damaged envelope, damaged bytes, an unknown codec."""
    return [
        {"$pgbroker": {"codec": "msgpack", "content_type": "application/msgpack"}},
        {"$pgbroker": {"codec": "msgpack", "content_type": "application/msgpack", "data": "wQ=="}},
        {
            "$pgbroker": {
                "codec": "avro:other.Type",
                "content_type": "application/avro; type=other.Type",
                "data": "wwE=",
            }
        },
    ]


def test_a_damaged_stored_body_is_read_with_a_typed_error_and_nothing_else_changes(
    broker: Broker, conn: Conn
) -> None:
    queue = broker.create_queue("orders")
    queue.send(samples()["msgpack"], codec="msgpack")
    for body in damaged_bodies():  # as a pgmq client (or a bug) could store them
        conn.execute("SELECT pgmq.send('orders', %s)", [Jsonb(body)])
    queue.send({"after": 1})
    read = queue.read_many(10)
    assert [(m.codec, type(m.codec_error)) for m in read] == [
        ("msgpack", type(None)),
        ("msgpack", CorruptBody),
        ("msgpack", CorruptBody),
        ("avro:other.Type", UnknownCodec),
        ("json", type(None)),
    ]
    assert [m.message for m in read[1:4]] == damaged_bodies()  # as stored, for the caller to look at
    assert all(m.receipt is not None for m in read)  # leased like any other: ack, nack, fail work
    queue.nack_many(read[1:4])
    assert [row[3] for row in q_rows(conn, "orders")][1:4] == damaged_bodies()


def test_worker_handlers_get_decoded_values_and_an_undecodable_body_is_dead_lettered(
    broker: Broker, dsn: str, conn: Conn
) -> None:
    queue = broker.create_queue("orders")
    queue.set_policy(max_deliveries=2, backoff="fixed", backoff_base_seconds=0)
    for name in CODECS:
        queue.send_many([samples(1)[name], samples(2)[name]], codec=name)
    conn.execute("SELECT pgmq.send('orders', %s)", [Jsonb(damaged_bodies()[1])])
    handled: list[tuple[str, Any]] = []

    async def handle(message: Message) -> None:
        handled.append((message.codec, message.message))

    worker = Worker("orders", handle, concurrency=4)
    asyncio.run(
        run_until(dsn, [worker], lambda: worker.stats.completed == 8 and worker.stats.dead_lettered == 1)
    )
    assert sorted(handled, key=repr) == sorted(
        [(name, samples(n)[name]) for name in CODECS for n in (1, 2)], key=repr
    )
    assert q_rows(conn, "orders") == []
    [letter] = queue.dead_letters()
    assert letter.message == damaged_bodies()[1]
    assert letter.headers is not None
    assert letter.headers[DEAD]["error"].startswith("CorruptBody: body is not MessagePack")
