"""A small RabbitMQ test client: unique names, declared for one test and deleted afterwards, and
draining queues to see what the bridge published. It talks AMQP (aiormq) directly, never through
the bridge, so a test checks what RabbitMQ really holds."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiormq
from aiormq.abc import AbstractChannel, AbstractConnection, DeliveredMessage
from pamqp.commands import Basic

DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def amqp_url() -> str:
    """The RabbitMQ the tests use: $PGBROKER_TEST_AMQP, else the local default."""
    return os.environ.get("PGBROKER_TEST_AMQP", DEFAULT_AMQP)


def unique(kind: str) -> str:
    return f"pgbroker-test-{kind}-{uuid.uuid4().hex[:10]}"


class Rabbit:
    """``async with Rabbit(url) as rabbit``: declares what a test needs, deletes it on exit."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._queues: list[str] = []
        self._exchanges: list[str] = []
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None

    async def __aenter__(self) -> Rabbit:
        self._connection = await aiormq.connect(self.url)
        self._channel = await self._connection.channel()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._connection is not None
        channel = await self._connection.channel()  # the test's one may have been closed by an error
        for queue in self._queues:
            await channel.queue_delete(queue)
        for exchange in self._exchanges:
            await channel.exchange_delete(exchange)
        await self._connection.close()

    @property
    def channel(self) -> AbstractChannel:
        assert self._channel is not None
        if self._channel.is_closed:
            raise RuntimeError("the test channel was closed by an error")
        return self._channel

    def forget_later(self, *, queue: str | None = None, exchange: str | None = None) -> None:
        """Delete this queue or exchange (made by someone else, e.g. a bridge with --declare) on exit."""
        if queue:
            self._queues.append(queue)
        if exchange:
            self._exchanges.append(exchange)

    async def exchange(self, exchange_type: str = "topic") -> str:
        name = unique("x")
        await self.channel.exchange_declare(name, exchange_type=exchange_type, durable=True)
        self._exchanges.append(name)
        return name

    async def exchange_exists(self, name: str) -> bool:
        return await self._exists(lambda probe: probe.exchange_declare(name, passive=True))

    async def queue_exists(self, name: str) -> bool:
        return await self._exists(lambda probe: probe.queue_declare(name, passive=True))

    async def _exists(self, declare: Callable[[AbstractChannel], Awaitable[object]]) -> bool:
        """Whether a passive declare on a channel of its own succeeds."""
        assert self._connection is not None
        probe = await self._connection.channel()  # a missing entity closes the channel asked
        try:
            await declare(probe)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
        await probe.close()
        return True

    async def queue(
        self,
        *,
        bind: tuple[str, str] | None = None,
        durable: bool = True,
        arguments: dict[str, Any] | None = None,
    ) -> str:
        name = unique("q")
        await self.channel.queue_declare(name, durable=durable, arguments=arguments)
        self._queues.append(name)
        if bind is not None:
            await self.channel.queue_bind(name, bind[0], routing_key=bind[1])
        return name

    async def publish(
        self,
        queue: str,
        body: bytes,
        *,
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        **properties: Any,
    ) -> bool:
        """Publish to a queue through the default exchange, persistent; whether RabbitMQ
        confirmed it (its channel asks for publisher confirms)."""
        props = Basic.Properties(
            message_id=message_id, headers=dict(headers) if headers else None, delivery_mode=2, **properties
        )
        confirmation = await self.channel.basic_publish(
            body, exchange="", routing_key=queue, properties=props
        )
        return isinstance(confirmation, Basic.Ack)

    async def count(self, queue: str) -> int:
        declared = await self.channel.queue_declare(queue, passive=True)
        assert declared.message_count is not None
        return declared.message_count

    async def drain(self, queue: str, *, expect: int, timeout: float = 30.0) -> list[DeliveredMessage]:
        """Consume (and ack) until ``expect`` messages came, then a little longer to catch extras."""
        got: list[DeliveredMessage] = []
        arrived = asyncio.Event()

        async def on_message(message: DeliveredMessage) -> None:
            got.append(message)
            assert message.delivery_tag is not None
            await self.channel.basic_ack(message.delivery_tag)
            if len(got) >= expect:
                arrived.set()

        await self.channel.basic_qos(prefetch_count=1000)
        consumer = await self.channel.basic_consume(queue, on_message)
        try:
            async with asyncio.timeout(timeout):
                await arrived.wait()
            await asyncio.sleep(0.3)  # duplicates would arrive right behind
        except TimeoutError:
            pass
        finally:
            assert consumer.consumer_tag is not None
            await self.channel.basic_cancel(consumer.consumer_tag)
        return got
