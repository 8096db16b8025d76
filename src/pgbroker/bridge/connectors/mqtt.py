"""The MQTT connector (mqtt://, mqtts://): QoS 1 with PUBACK out, a persistent session in
(paho-mqtt 2, MQTT 5).

URL: ``mqtt://[user:password@]host:1883`` with options
  topic           out: the topic (default: the bridge's source, else the pgbroker queue's name;
                  a message's header x-mqtt-topic overrides it); in: the topic filter to
                  subscribe to (+ and # allowed; write # as %23);
  client_id       the MQTT client id (in: default pgbroker-<queue>; it names the persistent
                  session, so a restarted bridge finds the messages that came while it was away;
                  out: default a random one);
  session_expiry  in: seconds the broker keeps the session while the bridge is away (86400).

Out, every message is published at QoS 1 and its PUBACK awaited (up to 1000 in flight); the
PUBACK is the confirm; none within the confirm timeout is a lost connection (the broker, or the
network to it, hangs). The message id (the message identity, msg_id@enqueued_at) travels as the
user property message-id, the content type as MQTT 5's Content Type, the FIFO group as user
property key, other headers as user properties (text, or JSON text). A PUBACK saying "no
matching subscribers" means the broker dropped the message: it counts as a failure (retried,
then dead-lettered), as an unroutable RabbitMQ publish does; create the subscribers' persistent
sessions before publishing.

In, the bridge connects with clean start off and a session expiry, so the broker keeps its
subscription and every QoS 1 message for it while the bridge is away (Mosquitto: up to
max_queued_messages, 1000 by default: raise it). Messages are acked (PUBACK) only after the
commit: one not acked when the connection drops is sent again on the next connection. The
de-duplication key is the user property message-id; a message without one (MQTT itself has no
message id) is received at-least-once. A message pgbroker refuses is acked (MQTT has no
dead-letter) and logged. How many messages may wait unacked is the broker's limit
(Receive Maximum; Mosquitto's max_inflight_messages, 20 by default): it caps the batch size.

Both ways the keepalive is half the connect timeout: the client pings a broker that has sent
nothing for that long and gives the connection up without an answer as long after, so a broker
that hangs is found while the bridge waits for messages.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from pgbroker.bridge.connector import (
    Confirmed,
    Outcome,
    OutMessage,
    Publisher,
    Received,
    Receiver,
    Refused,
    carried_headers,
    gather_more,
    trace_context,
)
from pgbroker.bridge.errors import BrokerAccessRefused, BrokerConnectionLost, BrokerUnreachable
from pgbroker.bridge.settings import InboundSettings, OutboundSettings, liveness_interval
from pgbroker.bridge.urls import BrokerUrl, number, parse

PREFIX = "x-mqtt-"
TOPIC_HEADER = "x-mqtt-topic"
_HINT = "Write it as mqtt://[user:password@]host:1883?topic=NAME (client_id=, session_expiry=); # as %23."
_OPTIONS = ("topic", "client_id", "session_expiry")
_LOST = "not published: the MQTT connection was lost"
_NO_SUBSCRIBERS = 16  # PUBACK reason code "No matching subscribers" (MQTT 5)
_IN_FLIGHT = 1000


def outbound(url: str, queue: str, settings: OutboundSettings) -> _OutEndpoint:
    return _OutEndpoint(_parse(url), queue, settings)


def inbound(url: str, source: str | None, queue: str, settings: InboundSettings) -> _InEndpoint:
    return _InEndpoint(_parse(url), source, queue, settings)


def _parse(url: str) -> BrokerUrl:
    return parse(url, schemes=("mqtt", "mqtts"), default_port=1883, options=_OPTIONS, hint=_HINT)


class _Session:
    """A paho client on its own network thread; its callbacks are handed to the asyncio loop."""

    def __init__(self, url: BrokerUrl, client_id: str, *, manual_ack: bool) -> None:
        self.url = url
        self.loop = asyncio.get_running_loop()
        self.lost: asyncio.Future[str] = self.loop.create_future()
        self.client = paho.Client(
            paho.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=paho.MQTTv5,
            reconnect_on_failure=False,  # the bridge reconnects itself (and knows it did)
            manual_ack=manual_ack,
        )
        if url.username is not None:
            self.client.username_pw_set(url.username, url.password)
        if url.scheme == "mqtts":
            self.client.tls_set()
        self.client.max_inflight_messages_set(_IN_FLIGHT)
        self.client.max_queued_messages_set(0)
        self._connected: asyncio.Future[Any] = self.loop.create_future()
        self.client.on_connect = self._thread_cb(self._on_connect)
        self.client.on_disconnect = self._thread_cb(self._on_disconnect)

    def _thread_cb(self, handler: Any) -> Any:
        def callback(*args: Any) -> None:
            self.loop.call_soon_threadsafe(handler, *args)

        return callback

    def _on_connect(self, _c: Any, _u: Any, _flags: Any, reason: Any, _p: Any) -> None:
        if not self._connected.done():
            self._connected.set_result(reason)

    def _on_disconnect(self, _c: Any, _u: Any, _flags: Any, reason: Any, _p: Any) -> None:
        if not self.lost.done():
            self.lost.set_result(f"disconnected ({reason})")
        if not self._connected.done():
            # Gone before its CONNACK (a broker that hangs lets the keepalive run out): not a refusal.
            self._connected.set_exception(ConnectionError(f"disconnected before the CONNACK ({reason})"))

    async def connect(self, timeout: float, *, clean_start: bool, properties: Properties | None) -> None:
        where = self.url.hostport()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.to_thread(
                    self.client.connect,
                    self.url.host,
                    self.url.port,
                    # Pinged after this long without traffic, lost without an answer as long after
                    # it: a broker that hangs, where an idle bridge waited for it for good.
                    liveness_interval(timeout),
                    clean_start=clean_start,
                    properties=properties,
                )
                self.client.loop_start()
                reason = await self._connected
        except (OSError, TimeoutError) as exc:
            self.close()
            raise BrokerUnreachable(
                f"cannot reach the MQTT broker at {where}: {exc or 'no CONNACK in time'}",
                hint="Is the broker (Mosquitto, say) running there? Check the host and port of the URL.",
            ) from None
        if reason.is_failure:
            self.close()
            if reason.value in (0x86, 0x87, 0x8C):  # bad user name or password, not authorized, bad auth
                raise BrokerAccessRefused(
                    f"the MQTT broker at {where} refused the connection: {reason}",
                    hint="Check the user and password in the URL.",
                )
            raise BrokerUnreachable(f"the MQTT broker at {where} refused the connection: {reason}")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def check(self, doing: str) -> None:
        if self.lost.done():
            raise BrokerConnectionLost(f"MQTT connection lost while {doing}: {self.lost.result()}")


class _OutEndpoint:
    def __init__(self, url: BrokerUrl, queue: str, settings: OutboundSettings) -> None:
        self._url = url
        self._topic = url.options.get("topic") or queue
        self._client_id = url.options.get("client_id")
        self._settings = settings
        self.where = f"{url.hostport()} topic {self._topic!r}"

    async def open(self) -> Publisher:
        session = _Session(
            self._url, self._client_id or f"pgbroker-out-{uuid.uuid4().hex[:12]}", manual_ack=False
        )
        await session.connect(self._settings.connect_timeout, clean_start=True, properties=None)
        return _Publisher(session, self._topic)


class _Publisher:
    def __init__(self, session: _Session, topic: str) -> None:
        self._session = session
        self._topic = topic
        self._pending: dict[int, asyncio.Future[Any]] = {}
        session.client.on_publish = session._thread_cb(self._on_puback)
        session.lost.add_done_callback(self._fail_pending)

    def _on_puback(self, _c: Any, _u: Any, mid: int, reason: Any, _p: Any) -> None:
        future = self._pending.pop(mid, None)
        if future is not None and not future.done():
            future.set_result(reason)

    def _fail_pending(self, _: Any) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(BrokerConnectionLost(_LOST))

    async def close(self) -> None:
        self._session.close()

    async def publish(self, messages: Sequence[OutMessage], timeout: float) -> list[Outcome]:
        if self._session.lost.done():
            return [Refused(_LOST, lost=True) for _ in messages]
        sent: list[tuple[str, asyncio.Future[Any]]] = []
        for message in messages:
            topic = message.headers.get(TOPIC_HEADER)
            topic = topic if isinstance(topic, str) and topic else self._topic
            future = self._session.loop.create_future()
            info = self._session.client.publish(topic, message.body, qos=1, properties=_properties(message))
            if info.rc != paho.MQTT_ERR_SUCCESS:
                future.set_exception(BrokerConnectionLost(f"{_LOST} ({paho.error_string(info.rc)})"))
            else:
                self._pending[info.mid] = future
            sent.append((topic, future))
        if sent:
            await asyncio.wait([f for _, f in sent], timeout=timeout)
        return [self._outcome(topic, future) for topic, future in sent]

    def _outcome(self, topic: str, future: asyncio.Future[Any]) -> Outcome:
        if not future.done():
            future.cancel()
            # The broker (or the network to it) hangs: a lost connection, or every window sent on
            # meanwhile would be taken again once it woke.
            return Refused(
                f"no PUBACK from the MQTT broker within the confirm timeout, topic {topic!r}", lost=True
            )
        error = future.exception()
        if error is not None:
            return Refused(str(error), lost=True)
        reason = future.result()
        if reason.value == _NO_SUBSCRIBERS:
            return Refused(f"no MQTT subscriber matched topic {topic!r}: the broker dropped the message")
        if reason.is_failure:
            return Refused(f"the MQTT broker refused the publish to topic {topic!r}: {reason}")
        return Confirmed({"topic": topic})


def _properties(message: OutMessage) -> Properties:
    properties = Properties(PacketTypes.PUBLISH)
    properties.ContentType = message.content_type
    user = [("message-id", message.message_id)]
    if message.key is not None:
        user.append(("key", message.key))
    for name, value in carried_headers(message.headers, PREFIX).items():
        user.append((name, value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))))
    properties.UserProperty = user
    return properties


class _InEndpoint:
    def __init__(self, url: BrokerUrl, source: str | None, queue: str, settings: InboundSettings) -> None:
        self._url = url
        self._topic = source or url.options.get("topic") or queue
        self._client_id = url.options.get("client_id") or f"pgbroker-{queue}"
        self._expiry = number(url.options.get("session_expiry"), "session_expiry", _HINT, default=86_400)
        self._settings = settings
        self.where = f"{url.hostport()} topic {self._topic!r} session {self._client_id!r}"

    async def open(self) -> Receiver:
        session = _Session(self._url, self._client_id, manual_ack=True)
        receiver = _Receiver(session, self._settings.linger)
        properties = Properties(PacketTypes.CONNECT)
        properties.SessionExpiryInterval = self._expiry
        properties.ReceiveMaximum = min(65535, max(self._settings.prefetch, self._settings.batch_size))
        await session.connect(self._settings.connect_timeout, clean_start=False, properties=properties)
        try:
            await receiver.subscribe(self._topic, self._settings.connect_timeout)
        except BaseException:
            session.close()
            raise
        return receiver


class _Receiver:
    header_prefix = PREFIX

    def __init__(self, session: _Session, linger: float) -> None:
        self._session = session
        self._linger = linger
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._subscribed: asyncio.Future[Any] = session.loop.create_future()
        # Set before connecting: a persistent session's messages may come right after CONNACK.
        session.client.on_message = session._thread_cb(self._on_message)
        session.client.on_subscribe = session._thread_cb(self._on_subscribe)

    def _on_message(self, _c: Any, _u: Any, message: Any) -> None:
        self._inbox.put_nowait(message)

    def _on_subscribe(self, _c: Any, _u: Any, _mid: int, reasons: Any, _p: Any) -> None:
        if not self._subscribed.done():
            self._subscribed.set_result(reasons)

    async def subscribe(self, topic: str, timeout: float) -> None:
        self._session.client.subscribe(topic, qos=1)
        async with asyncio.timeout(timeout):
            reasons = await self._subscribed
        if not reasons or reasons[0].is_failure or reasons[0].value < 1:
            raise BrokerUnreachable(
                f"the MQTT broker at {self._session.url.hostport()} did not grant a QoS 1 subscription"
                f" to {topic!r}: {reasons}",
                hint="Check the topic filter and the broker's access rules.",
            )

    async def close(self) -> None:
        self._session.close()

    async def receive(self, limit: int, wait: float) -> list[Received]:
        self._session.check("waiting for messages")
        first = asyncio.ensure_future(self._inbox.get())
        await asyncio.wait((first, self._session.lost), timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        if not first.done():
            first.cancel()
            self._session.check("waiting for messages")
            return []
        batch = await gather_more(self._inbox, first.result(), limit, self._linger)
        return [_received(m) for m in batch]

    async def ack(self, messages: Sequence[Received]) -> None:
        self._session.check("acking messages written to Postgres")
        for m in messages:
            self._session.client.ack(m.token.mid, m.token.qos)

    async def reject(self, message: Received) -> None:
        await self.ack([message])  # MQTT has no dead-letter: acked, so it is not sent again


def _received(message: Any) -> Received:
    properties = message.properties
    user = dict(getattr(properties, "UserProperty", None) or [])
    message_id = user.pop("message-id", None)
    key = user.get("key")
    headers: dict[str, Any] = {
        f"{PREFIX}received": {
            "topic": message.topic,
            "qos": message.qos,
            "retain": bool(message.retain),
            "dup": bool(message.dup),
        }
    }
    if user:
        headers[f"{PREFIX}properties"] = user
        headers.update(trace_context(user))
    content_type = getattr(properties, "ContentType", None)
    return Received(message_id, message.payload, content_type, headers, message, key)
