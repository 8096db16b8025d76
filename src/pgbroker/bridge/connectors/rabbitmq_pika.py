"""AMQP for the bridge: pika's asyncio connection behind a few awaitable calls, with typed errors.

pika is callback-based; here every call the bridge makes is a future on the running loop, and a
channel or connection that closes fails everything still pending on it with the reason. Why
pika: publishing with confirms costs it about 30 µs of CPU per message on this machine, against
about 95 µs through aiormq and twice that through aio-pika, and a bridge process is CPU-bound.

Publisher confirms: every publish on a confirm channel gets the next delivery tag, and its
future resolves when the broker acks that tag (``multiple`` acks resolve every tag up to it).
A mandatory publish that cannot be routed comes back as basic.return just before its ack; the
return carries no tag, so it is matched by message_id, which the bridge always sets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
from pika.adapters.asyncio_connection import AsyncioConnection
from yarl import URL

from pgbroker.bridge.errors import AmqpAccessRefused, AmqpConnectionLost, AmqpUnreachable
from pgbroker.bridge.settings import liveness_interval
from pgbroker.errors import InvalidArgument

# pika logs every closed connection and channel at ERROR or WARNING; the bridge says itself what
# it does about them.
logging.getLogger("pika").setLevel(logging.CRITICAL)

_URL_HINT = "Write it as amqp://user:password@host:5672/vhost (vhost '/' is the default: leave it out)."
_NOT_FOUND = 404


class Returned(Exception):
    """A mandatory publish no queue was bound for (basic.return)."""

    def __init__(self, reply_code: int, reply_text: str) -> None:
        super().__init__(f"{reply_code} {reply_text}")
        self.reply_code = reply_code
        self.reply_text = reply_text


class Nacked(Exception):
    """The broker refused a publish (basic.nack)."""


class ChannelClosed(Exception):
    """The broker closed the channel (a 404 for a missing exchange or queue, say), or it was lost."""

    def __init__(self, reply_code: int, reply_text: str) -> None:
        super().__init__(f"{reply_code} {reply_text}")
        self.reply_code = reply_code
        self.reply_text = reply_text

    @property
    def not_found(self) -> bool:
        return self.reply_code == _NOT_FOUND


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message consumed from a queue."""

    delivery_tag: int
    exchange: str
    routing_key: str
    redelivered: bool
    properties: pika.BasicProperties
    body: bytes


def where(url: str) -> str:
    """``host:port (vhost ...)`` of an AMQP URL, for messages (never the password)."""
    parsed = _parse(url)
    vhost = parsed.path[1:] or "/"
    return f"{parsed.host or 'localhost'}:{parsed.port or 5672} (vhost {vhost!r})"


def _parse(url: str) -> URL:
    try:
        parsed = URL(url)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"malformed AMQP URL: {exc}", hint=_URL_HINT) from None
    if parsed.scheme not in ("amqp", "amqps"):
        raise InvalidArgument(f"an AMQP URL starts with amqp:// or amqps://, got {url!r}", hint=_URL_HINT)
    return parsed


def _root_cause(exc: BaseException) -> BaseException:
    """What pika's connection workflow ran into, under its wrappers (a refused socket, say)."""
    for _ in range(8):
        attempts = getattr(exc, "exceptions", None)
        inner = getattr(exc, "exception", None)
        if attempts:
            exc = attempts[-1]
        elif isinstance(inner, BaseException):
            exc = inner
        elif exc.args and isinstance(exc.args[0], BaseException):
            exc = exc.args[0]
        else:
            break
    return exc


def lost(reason: BaseException | None, doing: str) -> AmqpConnectionLost:
    text = str(reason) if reason is not None else ""
    return AmqpConnectionLost(f"RabbitMQ connection lost while {doing}: {text or type(reason).__name__}")


class Connection:
    """An open AMQP connection on the running loop; ``await Connection.open(url, timeout=...)``."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.timeout = timeout  # the connect's, also the bound of each call's answer (Channel._wait)
        self.closed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        self._pika: Any = None

    @classmethod
    async def open(cls, url: str, *, timeout: float) -> Connection:
        """An open connection, or AmqpUnreachable / AmqpAccessRefused saying what to check."""
        parsed = _parse(url)
        try:
            parameters = pika.URLParameters(url)
        except Exception as exc:
            raise InvalidArgument(f"malformed AMQP URL: {exc}", hint=_URL_HINT) from None
        parameters.connection_attempts = 1
        parameters.socket_timeout = timeout
        parameters.stack_timeout = timeout
        if "heartbeat" not in parsed.query:
            # Heartbeats both ways: a RabbitMQ that hangs (or a network that drops packets
            # without a word) closes the connection within a few timeouts (pika's check waits
            # the heartbeat and 5 s more), where a bridge waiting for deliveries waited for good.
            parameters.heartbeat = liveness_interval(timeout)
        self = cls(url, timeout)
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[None] = loop.create_future()

        def on_open(_: Any) -> None:
            if not opened.done():
                opened.set_result(None)

        def on_open_error(_: Any, exc: BaseException) -> None:
            if not opened.done():
                opened.set_exception(exc)

        def on_close(_: Any, reason: BaseException) -> None:
            if not self.closed.done():
                self.closed.set_result(reason)

        self._pika = AsyncioConnection(parameters, on_open, on_open_error, on_close, custom_ioloop=loop)
        broker, user = where(url), parsed.user or "guest"
        try:
            async with asyncio.timeout(timeout + 1):
                await opened
        except pika.exceptions.ProbableAuthenticationError as exc:
            raise AmqpAccessRefused(
                f"RabbitMQ at {broker} refused the login of user {user!r}: {exc}",
                hint="Check the user and password in the AMQP URL (rabbitmqctl list_users).",
            ) from None
        except (pika.exceptions.ProbableAccessDeniedError, pika.exceptions.ConnectionClosedByBroker) as exc:
            raise AmqpAccessRefused(
                f"RabbitMQ at {broker} refused the connection: the vhost does not exist or user {user!r} "
                f"may not use it ({exc})",
                hint="Check the vhost in the AMQP URL (rabbitmqctl list_vhosts, list_permissions -p VHOST).",
            ) from None
        except (TimeoutError, pika.exceptions.AMQPError, OSError) as exc:
            self._abort()
            root = _root_cause(exc)
            reason = str(root) or type(root).__name__
            if isinstance(exc, TimeoutError):
                reason = f"no answer within {timeout} s"
            raise AmqpUnreachable(
                f"cannot reach RabbitMQ at {broker}: {reason}",
                hint="Is RabbitMQ running there? Check the host and port of the AMQP URL "
                "(scripts/ensure-rabbitmq starts a local one).",
            ) from None
        return self

    async def channel(self, *, confirms: bool = False) -> Channel:
        if self.closed.done() or not self._pika.is_open:
            raise lost(self.closed.result() if self.closed.done() else None, "opening a channel")
        channel = Channel(self)
        opened: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        channel._pending.add(opened)
        self._pika.channel(on_open_callback=opened.set_result)
        channel._bind(await channel._wait(opened, "opening a channel"))
        if confirms:
            await channel._confirm_mode()
        return channel

    async def close(self) -> None:
        """Close, quietly: the connection may already be broken and there is nothing left to report."""
        self._abort()
        if not self.closed.done():
            with suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await asyncio.shield(self.closed)

    def _abort(self) -> None:
        if self._pika is not None and not (self._pika.is_closed or self._pika.is_closing):
            with suppress(pika.exceptions.AMQPError):
                self._pika.close()


class Channel:
    """One AMQP channel: publishing with confirms, declarations, consuming."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.closed: asyncio.Future[ChannelClosed] = asyncio.get_running_loop().create_future()
        self._pika: Any = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._confirming: dict[int, tuple[str, asyncio.Future[None]]] = {}
        self._returned: dict[str, Returned] = {}
        self._next_tag = 0
        connection.closed.add_done_callback(lambda _: self._on_close(None, None))

    @property
    def is_closed(self) -> bool:
        return self.closed.done()

    def _bind(self, channel: Any) -> None:
        self._pika = channel
        channel.add_on_close_callback(self._on_close)
        channel.add_on_return_callback(self._on_return)

    def _on_close(self, _: Any, reason: BaseException | None) -> None:
        if self.closed.done():
            return
        if isinstance(reason, pika.exceptions.ChannelClosed):
            closed = ChannelClosed(reason.reply_code, reason.reply_text)
        else:
            closed = ChannelClosed(0, f"the connection was lost ({reason or 'closed'})")
        self.closed.set_result(closed)
        failed = [*self._pending, *(future for _, future in self._confirming.values())]
        self._pending.clear()
        self._confirming.clear()
        for future in failed:
            if not future.done():
                future.set_exception(closed)

    async def _wait(self, future: asyncio.Future[Any], doing: str) -> Any:
        """The result of an RPC's future; ChannelClosed if the channel closed before it came,
        AmqpConnectionLost if it did not come within the connection's timeout: a broker that hangs
        (or a network dropping packets without a word) is found by the heartbeat only, slower
        (more than a minute with a URL's heartbeat=60, never with heartbeat=0)."""
        if self.closed.done():
            future.cancel()
            raise self.closed.result()
        self._pending.add(future)
        within = self.connection.timeout
        try:
            async with asyncio.timeout(within):
                return await future
        except TimeoutError:
            raise lost(TimeoutError(f"no answer within {within:g} s"), doing) from None
        finally:
            self._pending.discard(future)

    def _rpc(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    async def _confirm_mode(self) -> None:
        done = self._rpc()
        self._pika.confirm_delivery(self._on_confirm, callback=done.set_result)
        await self._wait(done, "enabling publisher confirms")

    def publish(
        self, exchange: str, routing_key: str, body: bytes, properties: pika.BasicProperties
    ) -> asyncio.Future[None]:
        """Publish mandatory on a confirm channel; the future resolves on the broker's ack, or
        fails with Returned, Nacked or ChannelClosed. The properties must carry a message_id."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.closed.done():
            future.set_exception(self.closed.result())
            return future
        self._pika.basic_publish(exchange, routing_key, body, properties, mandatory=True)
        self._next_tag += 1
        self._confirming[self._next_tag] = (properties.message_id, future)
        return future

    def _on_return(self, _: Any, method: Any, properties: Any, body: bytes) -> None:
        self._returned[properties.message_id] = Returned(method.reply_code, method.reply_text)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        acked = isinstance(method, pika.spec.Basic.Ack)
        if method.multiple:
            tags = [tag for tag in self._confirming if tag <= method.delivery_tag]
        else:
            tags = [method.delivery_tag] if method.delivery_tag in self._confirming else []
        for tag in tags:
            message_id, future = self._confirming.pop(tag)
            returned = self._returned.pop(message_id, None)
            if future.done():
                continue
            if returned is not None:
                future.set_exception(returned)
            elif acked:
                future.set_result(None)
            else:
                future.set_exception(Nacked("basic.nack"))

    async def exchange_declare(self, name: str, exchange_type: str, *, passive: bool) -> None:
        done = self._rpc()
        self._pika.exchange_declare(
            name, exchange_type=exchange_type, passive=passive, durable=True, callback=done.set_result
        )
        await self._wait(done, f"declaring exchange {name!r}")

    async def queue_declare(self, name: str, *, passive: bool) -> int:
        """Declare (or, passive, check) a durable queue; returns how many messages are ready in it."""
        done = self._rpc()
        self._pika.queue_declare(name, passive=passive, durable=True, callback=done.set_result)
        frame = await self._wait(done, f"declaring queue {name!r}")
        count: int = frame.method.message_count
        return count

    async def consume(self, queue: str, prefetch: int, on_delivery: Callable[[Delivery], None]) -> None:
        """Deliveries with manual acks, at most ``prefetch`` unacked."""
        done = self._rpc()
        self._pika.basic_qos(prefetch_count=prefetch, callback=done.set_result)
        await self._wait(done, "setting the prefetch")

        def on_message(_: Any, method: Any, properties: Any, body: bytes) -> None:
            on_delivery(
                Delivery(
                    method.delivery_tag,
                    method.exchange,
                    method.routing_key,
                    method.redelivered,
                    properties,
                    body,
                )
            )

        done = self._rpc()
        self._pika.basic_consume(queue, on_message, auto_ack=False, callback=done.set_result)
        await self._wait(done, f"consuming queue {queue!r}")

    def ack(self, delivery_tag: int, *, multiple: bool) -> None:
        """Ack (written to the socket at once; lost with the connection, then redelivered)."""
        if self.closed.done():
            raise self.closed.result()
        self._pika.basic_ack(delivery_tag, multiple=multiple)

    def reject(self, delivery_tag: int) -> None:
        """Reject without requeue (RabbitMQ dead-letters it if the queue has a dead-letter exchange)."""
        if self.closed.done():
            raise self.closed.result()
        self._pika.basic_reject(delivery_tag, requeue=False)
