"""The tests' own view of each broker: publishing into it and reading what a bridge published,
through the broker's client library directly, never through the bridge, so a test checks what
the broker really holds. One Probe per kind of broker, all with the same few calls."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

# (message id, body) as a test publishes or reads it.
Item = tuple[str | None, bytes]

AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def unique(kind: str) -> str:
    return f"pgbt-{kind}-{uuid.uuid4().hex[:8]}"


class Probe(Protocol):
    kind: str
    env: dict[str, str]  # what a bridge process needs in its environment (SQS: credentials)

    def url(self, name: str) -> str:
        """The bridge URL for ``name`` (a stream, subject, topic or queue) on this server."""
        ...

    async def prepare_out(self, name: str) -> None:
        """Make sure what a bridge publishes to ``name`` is kept until read."""
        ...

    async def prepare_in(self, name: str) -> None:
        """Make sure what is published to ``name`` is kept for an inbound bridge."""
        ...

    async def published(self, name: str, expect: int, timeout: float = 30) -> list[Item]:
        """Everything published to ``name``: waits for ``expect`` items, then a little for extras."""
        ...

    async def publish(self, name: str, items: Sequence[Item]) -> None:
        """Publish with confirms (each item's message id where the broker carries one)."""
        ...


class RedisProbe:
    kind = "redis"
    env: dict[str, str] = {}

    def __init__(self, port: int) -> None:
        self.port = port

    def url(self, name: str) -> str:
        return f"redis://127.0.0.1:{self.port}?stream={name}"

    def _client(self) -> Any:
        import redis.asyncio

        return redis.asyncio.Redis(host="127.0.0.1", port=self.port)

    async def prepare_out(self, name: str) -> None:
        pass

    async def prepare_in(self, name: str) -> None:
        pass

    async def published(self, name: str, expect: int, timeout: float = 30) -> list[Item]:
        client = self._client()
        try:
            entries: list[Any] = []
            deadline = asyncio.get_running_loop().time() + timeout
            while asyncio.get_running_loop().time() < deadline:
                entries = await client.xrange(name, "-", "+")
                if len(entries) >= expect:
                    break
                await asyncio.sleep(0.2)
            return [(fields[b"message_id"].decode(), fields[b"body"]) for _, fields in entries]
        finally:
            await client.aclose()

    async def publish(self, name: str, items: Sequence[Item]) -> None:
        client = self._client()
        try:
            pipe = client.pipeline(transaction=False)
            for message_id, body in items:
                fields = {"body": body, "content_type": "application/json"}
                if message_id is not None:
                    fields["message_id"] = message_id
                pipe.xadd(name, fields)
            await pipe.execute()
        finally:
            await client.aclose()


class NatsProbe:
    kind = "nats"
    env: dict[str, str] = {}

    def __init__(self, port: int) -> None:
        self.port = port

    def url(self, name: str) -> str:
        return f"nats://127.0.0.1:{self.port}?subject={name}"

    async def _connect(self) -> Any:
        import nats

        return await nats.connect(f"nats://127.0.0.1:{self.port}", allow_reconnect=False)

    @staticmethod
    def stream_of(name: str) -> str:
        return "S_" + name.replace(".", "_").replace("-", "_")

    async def prepare_out(self, name: str) -> None:
        nc = await self._connect()
        try:
            await nc.jetstream().add_stream(name=self.stream_of(name), subjects=[name])
        finally:
            await nc.close()

    async def prepare_in(self, name: str) -> None:
        await self.prepare_out(name)

    async def published(self, name: str, expect: int, timeout: float = 30) -> list[Item]:
        import nats.js.errors

        nc = await self._connect()
        try:
            js = nc.jetstream()
            stream = self.stream_of(name)
            deadline = asyncio.get_running_loop().time() + timeout
            while asyncio.get_running_loop().time() < deadline:
                info = await js.stream_info(stream)
                if info.state.messages >= expect:
                    break
                await asyncio.sleep(0.2)
            got: list[Item] = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                try:
                    msg = await js.get_msg(stream, seq)
                except nats.js.errors.NotFoundError:
                    continue
                got.append(((msg.headers or {}).get("Nats-Msg-Id"), msg.data or b""))
            return got
        finally:
            await nc.close()

    async def publish(self, name: str, items: Sequence[Item]) -> None:
        nc = await self._connect()
        try:
            js = nc.jetstream()
            await asyncio.gather(
                *(
                    js.publish(name, body, headers={"Nats-Msg-Id": mid} if mid else None)
                    for mid, body in items
                )
            )
        finally:
            await nc.close()


class MqttProbe:
    """Reads through a persistent session (made by prepare_out before the bridge publishes, since
    MQTT keeps messages only for subscriptions that exist)."""

    kind = "mqtt"
    env: dict[str, str] = {}

    def __init__(self, port: int) -> None:
        self.port = port

    def url(self, name: str) -> str:
        return f"mqtt://127.0.0.1:{self.port}?topic={name}"

    def _client(self, client_id: str) -> Any:
        import paho.mqtt.client as mqtt

        return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)

    def _session(self, name: str, on_message: Any) -> Any:
        """Connect the probe's persistent session for ``name``, subscribed to it at QoS 1."""
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        client = self._client(f"probe-{name}")
        client.on_message = on_message
        subscribed = threading.Event()
        client.on_subscribe = lambda *_: subscribed.set()
        client.on_connect = lambda c, *_: c.subscribe(name, qos=1)
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = 3600
        client.connect("127.0.0.1", self.port, clean_start=False, properties=properties)
        client.loop_start()
        if not subscribed.wait(10):
            raise TimeoutError("the MQTT probe did not get its SUBACK")
        return client

    async def prepare_out(self, name: str) -> None:
        client = await asyncio.to_thread(self._session, name, None)
        client.disconnect()
        client.loop_stop()

    async def prepare_in(self, name: str) -> None:
        pass

    async def published(self, name: str, expect: int, timeout: float = 30) -> list[Item]:
        got: list[Item] = []
        lock = threading.Lock()

        def on_message(_: Any, __: Any, message: Any) -> None:
            props = dict(getattr(message.properties, "UserProperty", None) or [])
            with lock:
                got.append((props.get("message-id"), message.payload))

        client = await asyncio.to_thread(self._session, name, on_message)
        try:
            deadline = asyncio.get_running_loop().time() + timeout
            while len(got) < expect and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)  # duplicates would arrive right behind
        finally:
            client.disconnect()
            client.loop_stop()
        return list(got)

    async def publish(self, name: str, items: Sequence[Item]) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        def run() -> None:
            client = self._client(unique("pub"))
            client.max_inflight_messages_set(200)
            client.max_queued_messages_set(0)
            client.connect("127.0.0.1", self.port)
            client.loop_start()
            try:
                infos = []
                for message_id, body in items:
                    properties = Properties(PacketTypes.PUBLISH)
                    if message_id is not None:
                        properties.UserProperty = ("message-id", message_id)
                    infos.append(client.publish(name, body, qos=1, properties=properties))
                for info in infos:
                    info.wait_for_publish(30)
            finally:
                client.disconnect()
                client.loop_stop()

        await asyncio.to_thread(run)


class RabbitProbe:
    """Publishes into and drains RabbitMQ queues on ``amqp`` (the machine's server) directly; the
    bridge's URL goes through ``port`` instead (a relay of tests/support/relay.py, say). Queues it
    declares are deleted by close()."""

    kind = "rabbitmq"
    env: dict[str, str] = {}

    def __init__(self, amqp: str, port: int) -> None:
        self.amqp = amqp
        self.port = port
        self._declared: list[str] = []

    def url(self, name: str) -> str:
        from yarl import URL

        return str(URL(self.amqp).with_port(self.port) % {"routing_key": name, "queue": name})

    async def _channel(self) -> Any:
        import aiormq

        connection = await aiormq.connect(self.amqp)
        return connection, await connection.channel()

    async def prepare_out(self, name: str) -> None:
        connection, channel = await self._channel()
        try:
            await channel.queue_declare(name, durable=True)
            self._declared.append(name)
        finally:
            await connection.close()

    async def prepare_in(self, name: str) -> None:
        await self.prepare_out(name)

    async def published(self, name: str, expect: int, timeout: float = 30) -> list[Item]:
        from pamqp.commands import Basic

        connection, channel = await self._channel()
        got: list[Item] = []
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            quiet_until = None
            while loop.time() < deadline:
                message = await channel.basic_get(name, no_ack=True)
                if isinstance(message.delivery, Basic.GetEmpty):
                    if len(got) >= expect:
                        quiet_until = quiet_until or loop.time() + 1.0  # duplicates come right behind
                        if loop.time() >= quiet_until:
                            break
                    await asyncio.sleep(0.1)
                    continue
                quiet_until = None
                got.append((message.header.properties.message_id, message.body))
            return got
        finally:
            await connection.close()

    async def publish(self, name: str, items: Sequence[Item]) -> None:
        from pamqp.commands import Basic

        connection, channel = await self._channel()
        try:
            for message_id, body in items:
                properties = Basic.Properties(message_id=message_id, delivery_mode=2)
                await channel.basic_publish(body, exchange="", routing_key=name, properties=properties)
        finally:
            await connection.close()

    async def close(self) -> None:
        connection, channel = await self._channel()
        try:
            for name in self._declared:
                await channel.queue_delete(name)
        finally:
            await connection.close()


class SqsProbe:
    kind = "sqs"
    env = AWS_ENV

    def __init__(self, port: int) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"

    def url(self, name: str) -> str:
        return f"sqs://us-east-1/{name}?endpoint={self.endpoint}"

    def _client(self) -> Any:
        import boto3

        return boto3.client(
            "sqs",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    async def prepare_out(self, name: str) -> None:
        await asyncio.to_thread(self._client().create_queue, QueueName=name)

    async def prepare_in(self, name: str) -> None:
        await self.prepare_out(name)

    async def published(self, name: str, expect: int, timeout: float = 30) -> list[Item]:
        def run() -> list[Item]:
            client = self._client()
            url = client.get_queue_url(QueueName=name)["QueueUrl"]
            got: list[Item] = []
            empty_rounds = 0
            import time

            distinct: set[str | None] = set()
            deadline = time.monotonic() + 3 * timeout  # moto is slow with a long queue
            # Until every message came (duplicates do not count) and the queue stays empty, or
            # it stays empty for long.
            while time.monotonic() < deadline and empty_rounds < (2 if len(distinct) >= expect else 5):
                reply = client.receive_message(
                    QueueUrl=url,
                    MaxNumberOfMessages=10,
                    VisibilityTimeout=600,
                    WaitTimeSeconds=1,
                    MessageAttributeNames=["All"],
                )
                messages = reply.get("Messages", [])
                empty_rounds = 0 if messages else empty_rounds + 1
                for m in messages:
                    attrs = m.get("MessageAttributes", {})
                    mid = attrs.get("pgbroker-message-id", {}).get("StringValue")
                    got.append((mid, m["Body"].encode()))
                    distinct.add(mid)
                if not messages:
                    time.sleep(0.2)
            return got

        return await asyncio.to_thread(run)

    async def publish(self, name: str, items: Sequence[Item]) -> None:
        def run() -> None:
            client = self._client()
            url = client.get_queue_url(QueueName=name)["QueueUrl"]
            for start in range(0, len(items), 10):
                entries = []
                for n, (mid, body) in enumerate(items[start : start + 10]):
                    entry: dict[str, Any] = {"Id": str(n), "MessageBody": body.decode()}
                    if mid is not None:
                        entry["MessageAttributes"] = {
                            "pgbroker-message-id": {"DataType": "String", "StringValue": mid}
                        }
                    entries.append(entry)
                reply = client.send_message_batch(QueueUrl=url, Entries=entries)
                assert not reply.get("Failed"), reply["Failed"]

        await asyncio.to_thread(run)


def probe(kind: str, port: int) -> Probe:
    probes: dict[str, type[Probe]] = {
        "redis": RedisProbe,
        "nats": NatsProbe,
        "mqtt": MqttProbe,
        "sqs": SqsProbe,
    }
    return probes[kind](port)  # type: ignore[call-arg]


def body_of(n: int) -> bytes:
    return json.dumps({"n": n}, separators=(",", ":")).encode()
