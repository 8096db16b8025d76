"""The RabbitMQ connector (amqp://, amqps://): publisher confirms out, manual acks in (pika).

URL: ``amqp://user:password@host:5672/vhost`` with, besides pika's own query options,
  out  ``exchange`` (default: the settings', else the default exchange "") and ``routing_key``
       (default: the settings', else the queue's name); a message's x-amqp-* headers override
       both per message (pgbroker.bridge.connectors.rabbitmq_mapping);
  in   ``queue``: the RabbitMQ queue to consume (default: the bridge's source, else the
       pgbroker queue's name).

Out, every publish is mandatory and persistent on a confirm channel, message_id = the message
identity (msg_id@enqueued_at); a returned (unroutable), nacked, unconfirmed or lost publish is
Refused, an unconfirmed one as a lost connection (RabbitMQ or the network to it hangs). Heartbeats
every half connect timeout find a hung connection while the bridge waits for deliveries. Exchanges
are checked (passive declare on a probe channel of their own, since a missing exchange closes the
channel it is used on) before their first publish and every 30 s after, or declared with declare.
In, deliveries are consumed with manual acks and a prefetch, and acked with one basic.ack
(``multiple``) per batch; a rejected delivery is rejected without requeue (RabbitMQ dead-letters it
if the queue has a dead-letter exchange)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pgbroker.bridge.connector import (
    Confirmed,
    Outcome,
    OutMessage,
    Publisher,
    Received,
    Receiver,
    Refused,
    gather_more,
)
from pgbroker.bridge.connectors import rabbitmq_pika as amqp
from pgbroker.bridge.connectors.rabbitmq_mapping import Outgoing, Route, incoming, outgoing
from pgbroker.bridge.errors import AmqpConnectionLost, AmqpNotFound, Unpublishable
from pgbroker.bridge.settings import InboundSettings, OutboundSettings

# An exchange found to exist is checked again after this many seconds (it may be deleted).
_EXCHANGE_RECHECK = 30.0
_OUR_OPTIONS = ("exchange", "routing_key", "queue")
_LOST = "not published: the RabbitMQ connection was lost"
_EXCHANGE_HINT = "Declare it in RabbitMQ, or run the bridge with --declare (declare=True) to declare it."


def _split(url: str) -> tuple[str, dict[str, str]]:
    """The URL for pika (our options taken out) and our options."""
    amqp.where(url)  # a malformed URL fails here, not at the first connect
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in pairs if k in _OUR_OPTIONS}
    rest = urlencode([(k, v) for k, v in pairs if k not in _OUR_OPTIONS])
    return urlunsplit(parts._replace(query=rest)), ours


def outbound(url: str, queue: str, settings: OutboundSettings) -> _OutEndpoint:
    return _OutEndpoint(url, queue, settings)


def inbound(url: str, source: str | None, queue: str, settings: InboundSettings) -> _InEndpoint:
    return _InEndpoint(url, source, queue, settings)


class _OutEndpoint:
    def __init__(self, url: str, queue: str, settings: OutboundSettings) -> None:
        self._url, options = _split(url)
        self._settings = settings
        exchange = options.get("exchange", settings.exchange)
        self._default = Route(exchange, options.get("routing_key") or settings.routing_key or queue)
        self.where = f"{amqp.where(url)} exchange {exchange!r}"

    async def open(self) -> Publisher:
        connection = await amqp.Connection.open(self._url, timeout=self._settings.connect_timeout)
        try:
            try:
                channel = await connection.channel(confirms=True)
            except amqp.ChannelClosed as exc:
                raise amqp.lost(exc, "opening a channel") from exc
            exchanges = _Exchanges(connection, self._settings.declare, self._settings.exchange_type)
            missing = await exchanges.check([self._default.exchange])
            if missing:
                raise AmqpNotFound(missing[self._default.exchange], hint=_EXCHANGE_HINT)
        except BaseException:
            await connection.close()
            raise
        return _Publisher(connection, channel, exchanges, self._default)


class _Publisher:
    def __init__(
        self, connection: amqp.Connection, channel: amqp.Channel, exchanges: _Exchanges, default: Route
    ) -> None:
        self._connection = connection
        self._channel = channel
        self._exchanges = exchanges
        self._default = default

    async def close(self) -> None:
        await self._connection.close()

    async def publish(self, messages: Sequence[OutMessage], timeout: float) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(messages)
        ready: list[tuple[int, Outgoing]] = []
        for n, message in enumerate(messages):
            try:
                ready.append((n, outgoing(message, self._default)))
            except Unpublishable as exc:
                outcomes[n] = Refused(f"unpublishable: {exc.message}")
        try:
            missing = await self._exchanges.check({o.route.exchange for _, o in ready})
        except AmqpConnectionLost:
            missing = {o.route.exchange: _LOST for _, o in ready}
        for n, o in ready:
            if o.route.exchange in missing:
                why = missing[o.route.exchange]
                outcomes[n] = Refused(why, lost=why is _LOST)
        ready = [(n, o) for n, o in ready if outcomes[n] is None]

        futures: list[asyncio.Future[None]] = []
        for _, o in ready:
            try:
                futures.append(
                    self._channel.publish(o.route.exchange, o.route.routing_key, o.body, o.properties)
                )
            except Exception as exc:  # pika refuses to encode it (a header value, say)
                refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                refused.set_exception(exc)
                futures.append(refused)
        if futures:
            await asyncio.wait(futures, timeout=timeout)
        for (n, o), future in zip(ready, futures, strict=True):
            result = _result(future)
            if result is None:
                outcomes[n] = Confirmed({"exchange": o.route.exchange, "routing_key": o.route.routing_key})
                continue
            if isinstance(result, amqp.ChannelClosed) and result.not_found:
                self._exchanges.forget(o.route.exchange)
            # A publish not confirmed in time is a lost connection too: RabbitMQ (or the network
            # to it) hangs, and every window sent on meanwhile would be taken again once it woke.
            lost = isinstance(result, amqp.ChannelClosed | TimeoutError)
            outcomes[n] = Refused(_failure_text(o, result), lost=lost)
        return [o if o is not None else Refused(_LOST, lost=True) for o in outcomes]


def _result(future: asyncio.Future[None]) -> BaseException | None:
    if not future.done():
        future.cancel()  # a late confirm finds nothing waiting
        return TimeoutError()
    return future.exception()


def _failure_text(o: Outgoing, exc: BaseException) -> str:
    where = f"exchange {o.route.exchange!r} routing key {o.route.routing_key!r}"
    if isinstance(exc, amqp.Returned):
        return f"unroutable: no queue bound to {where} (returned as mandatory: {exc})"
    if isinstance(exc, amqp.Nacked):
        return f"RabbitMQ refused the message (basic.nack) for {where}"
    if isinstance(exc, TimeoutError):
        return f"not confirmed by RabbitMQ within the confirm timeout, for {where}"
    if isinstance(exc, amqp.ChannelClosed):
        if exc.not_found:
            return f"RabbitMQ has no exchange {o.route.exchange!r} (it was deleted while in use)"
        return _LOST
    return f"publish failed for {where}: {type(exc).__name__}: {exc}"


class _Exchanges:
    """Which exchanges exist (or were declared), checked on a probe channel of their own."""

    def __init__(self, connection: amqp.Connection, declare: bool, exchange_type: str) -> None:
        self._connection = connection
        self._declare = declare
        self._type = exchange_type
        self._checked: dict[str, float] = {"": float("inf")}  # the default exchange always exists
        self._probe: amqp.Channel | None = None
        self._lock = asyncio.Lock()

    def forget(self, name: str) -> None:
        self._checked.pop(name, None)

    async def check(self, names: Iterable[str]) -> dict[str, str]:
        """{name: why it cannot be used} for those of ``names`` that do not exist (or cannot be declared)."""
        now = asyncio.get_running_loop().time()
        wanted = [n for n in names if now - self._checked.get(n, -_EXCHANGE_RECHECK) >= _EXCHANGE_RECHECK]
        if not wanted:
            return {}
        missing: dict[str, str] = {}
        async with self._lock:
            for name in wanted:
                why = await self._check_one(name)
                if why is None:
                    self._checked[name] = now
                else:
                    missing[name] = why
        return missing

    async def _check_one(self, name: str) -> str | None:
        # amq.* names are RabbitMQ's own: they exist, and declaring them is refused.
        passive = not self._declare or name.startswith("amq.")
        try:
            if self._probe is None or self._probe.is_closed:
                self._probe = await self._connection.channel()
            await self._probe.exchange_declare(name, self._type, passive=passive)
        except amqp.ChannelClosed as exc:
            if exc.not_found:
                return f"RabbitMQ has no exchange {name!r}; declare it, or run the bridge with --declare"
            if exc.reply_code:
                return f"exchange {name!r} cannot be declared as a durable {self._type} exchange: {exc}"
            raise amqp.lost(exc, f"checking exchange {name!r}") from exc
        return None


# -- inbound -----------------------------------------------------------------------------------------


class _InEndpoint:
    def __init__(self, url: str, source: str | None, queue: str, settings: InboundSettings) -> None:
        self._url, options = _split(url)
        self._source = source or options.get("queue") or queue
        self._settings = settings
        self.where = f"{amqp.where(url)} queue {self._source!r}"

    async def open(self) -> Receiver:
        connection = await amqp.Connection.open(self._url, timeout=self._settings.connect_timeout)
        try:
            channel = await connection.channel()
            await self._check_source(channel)
            inbox: asyncio.Queue[amqp.Delivery] = asyncio.Queue()
            prefetch = max(self._settings.prefetch, self._settings.batch_size)
            await channel.consume(self._source, prefetch, inbox.put_nowait)
        except amqp.ChannelClosed as exc:
            await connection.close()
            raise amqp.lost(exc, f"starting to consume {self._source!r}") from exc
        except BaseException:
            await connection.close()
            raise
        return _Receiver(connection, channel, inbox, self._source, self._settings.linger)

    async def _check_source(self, channel: amqp.Channel) -> None:
        try:
            await channel.queue_declare(self._source, passive=not self._settings.declare)
        except amqp.ChannelClosed as exc:
            if not exc.not_found:
                raise
            raise AmqpNotFound(
                f"RabbitMQ has no queue {self._source!r} at {amqp.where(self._url)}",
                hint="Declare it in RabbitMQ, or run the bridge with --declare (declare=True).",
            ) from None


class _Receiver:
    header_prefix = "x-amqp-"

    def __init__(
        self,
        connection: amqp.Connection,
        channel: amqp.Channel,
        inbox: asyncio.Queue[amqp.Delivery],
        source: str,
        linger: float,
    ) -> None:
        self._connection = connection
        self._channel = channel
        self._inbox = inbox
        self._source = source
        self._linger = linger

    async def close(self) -> None:
        await self._connection.close()

    async def receive(self, limit: int, wait: float) -> list[Received]:
        """Wait for a first delivery (or the channel closing), then take what else arrives
        within ``linger``, up to ``limit``."""
        first = asyncio.ensure_future(self._inbox.get())
        # channel.closed is shared: waited on, never cancelled.
        await asyncio.wait((first, self._channel.closed), timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        if not first.done():
            first.cancel()
            if self._channel.is_closed:
                raise amqp.lost(self._channel.closed.result(), "waiting for deliveries")
            return []
        batch = await gather_more(self._inbox, first.result(), limit, self._linger)
        return [incoming(d, self._source) for d in batch]

    async def ack(self, messages: Sequence[Received]) -> None:
        last = max(m.token.delivery_tag for m in messages)
        try:
            self._channel.ack(last, multiple=True)
        except amqp.ChannelClosed as exc:
            raise amqp.lost(exc, "acking deliveries written to Postgres") from exc

    async def reject(self, message: Received) -> None:
        try:
            self._channel.reject(message.token.delivery_tag)
        except amqp.ChannelClosed as exc:
            raise amqp.lost(exc, "rejecting a delivery") from exc
