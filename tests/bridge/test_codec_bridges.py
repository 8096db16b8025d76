"""Codecs through the bridges, against real servers: a message stored with JSON, MessagePack,
Protobuf or Avro goes out as its codec's bytes with the codec's content type in the broker's
metadata, and comes back in stored as the same envelope (pgbroker -> broker -> pgbroker keeps
the bytes and the codec); a message from a publisher that is not pgbroker, sent as
application/msgpack, is stored as a MessagePack envelope and decodes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import msgpack

from pgbroker import Broker, codecs
from pgbroker.bridge import InboundBridge, InboundSettings, OutboundBridge, OutboundSettings
from pgbroker.queues._client_async import AsyncBroker
from tests.support.codec_types import AVRO, PROTOBUF, Order, samples, stored_codec
from tests.support.identity import msg_id_of
from tests.support.rabbit import Rabbit

CODECS = ["json", "msgpack", PROTOBUF, AVRO]
PER_CODEC = 5


def test_every_codec_survives_a_round_trip_through_the_broker(
    dsn: str, broker_urls: Callable[[], Any]
) -> None:
    with Broker(dsn) as broker:
        outbox = broker.create_queue("outbox")
        broker.create_queue("inbox")
        for n in range(PER_CODEC):
            for name, value in samples(n).items():
                outbox.send(value, codec=name)
        with broker.connection() as conn:
            sent = [m for (m,) in conn.execute("SELECT message FROM pgmq.q_outbox").fetchall()]
    assert sorted(stored_codec(m) for m in sent) == sorted(CODECS * PER_CODEC)

    async def scenario() -> None:
        async with broker_urls() as (out_url, in_url), AsyncBroker(dsn) as abroker:
            inbound = InboundBridge(abroker, None, "inbox", in_url, InboundSettings(declare=True, ack_wait=5))
            outbound = OutboundBridge(abroker, "outbox", out_url, OutboundSettings(declare=True))
            tasks = [asyncio.create_task(inbound.run())]
            try:
                async with asyncio.timeout(20):
                    await inbound.receiving.wait()  # MQTT and a new Redis group keep only what follows
                tasks.append(asyncio.create_task(outbound.run()))
                async with asyncio.timeout(60):
                    while inbound.stats.received < len(sent):
                        for task in tasks:
                            if task.done():
                                task.result()
                        await asyncio.sleep(0.05)
            finally:
                outbound.stop()
                inbound.stop()
                await asyncio.gather(*tasks)
            assert (outbound.stats.published, inbound.stats.received) == (len(sent), len(sent))

    asyncio.run(scenario())
    with Broker(dsn) as broker, broker.connection() as conn:
        got = [m for (m,) in conn.execute("SELECT message FROM pgmq.q_inbox").fetchall()]
    # The same stored bodies: the envelopes byte for byte (codec, content type, data).
    assert sorted(json.dumps(m, sort_keys=True) for m in got) == sorted(
        json.dumps(m, sort_keys=True) for m in sent
    )
    decoded = [codecs.from_stored(m) for m in got]
    orders = sorted((d.value.id, d.value.item) for d in decoded if d.codec == PROTOBUF)
    assert orders == [(n, "book") for n in range(PER_CODEC)]
    assert all(isinstance(d.value, Order) for d in decoded if d.codec == PROTOBUF)
    avros = sorted(d.value["id"] for d in decoded if d.codec == AVRO)
    assert avros == list(range(PER_CODEC))


def test_rabbitmq_carries_the_codec_content_type_in_the_amqp_property(dsn: str, amqp: str) -> None:
    with Broker(dsn) as broker:
        outbox = broker.create_queue("outbox")
        ids = {outbox.send(value, codec=name): name for name, value in samples(7).items()}

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            target = await rabbit.queue()
            bridge = OutboundBridge(abroker, "outbox", f"{amqp}?routing_key={target}")
            task = asyncio.create_task(bridge.run())
            try:
                got = await rabbit.drain(target, expect=len(ids))
            finally:
                bridge.stop()
                await task
            by_codec = {ids[msg_id_of(m.header.properties.message_id)]: m for m in got}
            assert set(by_codec) == set(CODECS)
            for name, message in by_codec.items():
                content_type = message.header.properties.content_type or ""
                assert codecs.codec_name(content_type) == name
                assert codecs.decode(message.body, content_type) == codecs.decode(
                    *codecs.encode(samples(7)[name], name)[:1], content_type
                )
            assert msgpack.unpackb(by_codec["msgpack"].body)["blob"] == bytes([0, 255, 7])

    asyncio.run(scenario())


def test_a_foreign_msgpack_message_is_stored_as_a_msgpack_envelope_and_decodes(dsn: str, amqp: str) -> None:
    value = {"order": 42, "lines": [1, 2, 3], "raw": b"\x00\xff"}

    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            source = await rabbit.queue()
            # Another service's publish: no message id, only a body and its content type.
            await rabbit.publish(source, msgpack.packb(value), content_type="application/msgpack")
            await abroker.create_queue("inbox")
            bridge = InboundBridge(abroker, None, "inbox", f"{amqp}?queue={source}")
            task = asyncio.create_task(bridge.run())
            try:
                async with asyncio.timeout(20):
                    while bridge.stats.received < 1:
                        await asyncio.sleep(0.05)
            finally:
                bridge.stop()
                await task

    asyncio.run(scenario())
    with Broker(dsn) as broker, broker.connection() as conn:
        row = conn.execute("SELECT message, headers FROM pgmq.q_inbox").fetchone()
        assert row is not None
        stored, headers = row
        message = broker.queue("inbox").read()
    assert stored_codec(stored) == "msgpack"
    assert stored["$pgbroker"]["content_type"] == "application/msgpack"
    assert "x-amqp-body" not in headers  # the envelope says what it is
    assert codecs.from_stored(stored) == codecs.Decoded(value, "msgpack")
    assert message is not None
    assert message.codec == "msgpack"
    assert message.message == value


def test_an_unknown_content_type_is_stored_as_before(dsn: str, amqp: str) -> None:
    async def scenario() -> None:
        async with Rabbit(amqp) as rabbit, AsyncBroker(dsn) as abroker:
            source = await rabbit.queue()
            await rabbit.publish(source, b"\x00\x01binary", message_id="b1", content_type="image/x-mine")
            await rabbit.publish(source, b"plain words", message_id="t1", content_type="text/plain")
            await abroker.create_queue("inbox")
            bridge = InboundBridge(abroker, None, "inbox", f"{amqp}?queue={source}")
            task = asyncio.create_task(bridge.run())
            try:
                async with asyncio.timeout(20):
                    while bridge.stats.received < 2:
                        await asyncio.sleep(0.05)
            finally:
                bridge.stop()
                await task

    asyncio.run(scenario())
    with Broker(dsn) as broker, broker.connection() as conn:
        query = "SELECT message, headers->>'x-amqp-body' FROM pgmq.q_inbox ORDER BY msg_id"
        rows = conn.execute(query).fetchall()
    assert rows == [("AAFiaW5hcnk=", "base64"), ("plain words", "text")]
