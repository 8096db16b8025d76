"""The NATS JetStream connector (nats://, tls://): publish acks out, a durable pull consumer in
(nats-py).

URL: ``nats://[user:password@]host:4222`` with options
  subject   the subject to publish to, or to consume (default: the bridge's source, else the
            pgbroker queue's name);
  stream    the stream (default: the one whose subjects capture the subject; with declare, one
            named after the subject is created, file storage, when none does);
  durable   in: the durable consumer's name (default pgbroker-<queue>; with declare it is
            created, ack_wait and max_ack_pending from the settings, when it does not exist).

Out, every message of a window is published at once and the stream's publish acks awaited together;
an ack is the confirm (the stream stored it), and none within the confirm timeout a lost
connection. Nats-Msg-Id is the message identity (msg_id@enqueued_at), so a message published again
within the stream's duplicate window (2 minutes by default) is acknowledged as a duplicate and not
stored twice: the copy a killed bridge's window makes is usually dropped by the stream itself.
Content-Type, Pgbroker-Key (the FIFO group) and the message's other headers (text, or JSON text)
travel as NATS headers.

In, batches are fetched from the durable consumer and acked after the commit; a message not
acked within ack_wait is delivered again (to this bridge or another bound to the same consumer).
The de-duplication key is Nats-Msg-Id, else stream:sequence. A message pgbroker refuses is
terminated (+TERM: never delivered again) and logged.

Both ways the client pings the server every half connect timeout and gives the connection up
after two pings unanswered: a server that hangs is found while the bridge waits for messages.
A publish is bounded by the confirm timeout, and a close, an ack or a termination by the connect
timeout, their writes included: a server that hangs reads nothing, and a write waits for good
once the socket's buffers are full.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, StorageType

from pgbroker.bridge.connector import (
    Confirmed,
    Outcome,
    OutMessage,
    Publisher,
    Received,
    Receiver,
    Refused,
    carried_headers,
    trace_context,
)
from pgbroker.bridge.errors import (
    BrokerAccessRefused,
    BrokerConnectionLost,
    BrokerNotFound,
    BrokerUnreachable,
)
from pgbroker.bridge.settings import InboundSettings, OutboundSettings, liveness_interval
from pgbroker.bridge.urls import BrokerUrl, parse

PREFIX = "x-nats-"
_HINT = "Write it as nats://[user:password@]host:4222?subject=NAME (stream=, durable=)."
_OPTIONS = ("subject", "stream", "durable")
_LOST = "not published: the NATS connection was lost"
_GONE = (
    nats.errors.ConnectionClosedError,
    nats.errors.StaleConnectionError,
    nats.errors.UnexpectedEOF,
    nats.errors.OutboundBufferLimitError,
    OSError,
)


def outbound(url: str, queue: str, settings: OutboundSettings) -> _OutEndpoint:
    return _OutEndpoint(_parse(url), queue, settings)


def inbound(url: str, source: str | None, queue: str, settings: InboundSettings) -> _InEndpoint:
    return _InEndpoint(_parse(url), source, queue, settings)


def _parse(url: str) -> BrokerUrl:
    return parse(url, schemes=("nats", "tls"), default_port=4222, options=_OPTIONS, hint=_HINT)


def _name(text: str) -> str:
    """A stream or consumer name made of a subject or queue name (no dots, wildcards or spaces)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)


async def _connect(url: BrokerUrl, timeout: float) -> Client:
    """A connection, or BrokerUnreachable / BrokerAccessRefused. nats-py keeps trying a server
    that refuses the first connection, so the attempt is cut off after ``timeout``."""
    errors: list[BaseException] = []

    async def on_error(exc: Exception) -> None:  # instead of nats-py's traceback on stderr
        errors[:] = [exc]  # the last is enough, for the whole life of the connection

    try:
        async with asyncio.timeout(timeout):
            return await nats.connect(
                f"{url.scheme}://{url.hostport()}",
                user=url.username,
                password=url.password,
                connect_timeout=timeout,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                # A server that leaves two pings unanswered is lost: one that hangs (or a network
                # that drops packets without a word), where an idle bridge waited for it for good.
                ping_interval=liveness_interval(timeout),
                max_outstanding_pings=2,
                error_cb=on_error,
            )
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        last = errors[-1] if errors else exc
        reason = f"{type(last).__name__} {last}".strip()
        if "authorization" in reason.lower():
            raise BrokerAccessRefused(
                f"NATS at {url.hostport()} refused the login: {reason}",
                hint="Check the user and password in the URL.",
            ) from None
        raise BrokerUnreachable(
            f"cannot reach NATS at {url.hostport()}: {reason}",
            hint="Is nats-server running there (with -js)? Check the host and port of the URL.",
        ) from None


async def _close(nc: Client, within: float) -> None:
    """Close ``nc`` within ``within`` seconds. nats-py's close first writes what it still has
    pending and waits for the socket to close, for good when the server hangs (it reads nothing)
    and the socket's buffers are full; past the bound the socket is aborted, what was not written
    lost with it, as with any lost connection."""
    if nc.is_closed:
        return
    try:
        async with asyncio.timeout(within):
            await nc.close()
    except TimeoutError:
        # nats-py has no abort: the asyncio transport under its writer (else left open, with
        # what it could not write, for the life of the process).
        writer = getattr(getattr(nc, "_transport", None), "_io_writer", None)
        if isinstance(writer, asyncio.StreamWriter):
            writer.transport.abort()


async def _stream_for(nc: Client, url: BrokerUrl, subject: str, declare: bool) -> str:
    """The stream that captures ``subject``: the URL's, else found, else (declare) created."""
    js = nc.jetstream()
    given = url.options.get("stream")
    try:
        if given:
            await js.stream_info(given)
            return given
        return await js.find_stream_name_by_subject(subject)
    except nats.js.errors.NotFoundError:
        if not declare:
            raise BrokerNotFound(
                f"NATS at {url.hostport()} has no stream "
                + (repr(given) if given else f"capturing subject {subject!r}"),
                hint="Add one (nats stream add), or run the bridge with --declare (declare=True).",
            ) from None
    except nats.errors.NoRespondersError:
        raise BrokerNotFound(
            f"NATS at {url.hostport()} has no JetStream", hint="Start nats-server with -js."
        ) from None
    name = given or _name(subject)
    await js.add_stream(name=name, subjects=[subject], storage=StorageType.FILE)
    return name


class _OutEndpoint:
    def __init__(self, url: BrokerUrl, queue: str, settings: OutboundSettings) -> None:
        self._url = url
        self._subject = url.options.get("subject") or queue
        self._settings = settings
        self.where = f"{url.hostport()} subject {self._subject!r}"

    async def open(self) -> Publisher:
        nc = await _connect(self._url, self._settings.connect_timeout)
        try:
            await _stream_for(nc, self._url, self._subject, self._settings.declare)
        except BaseException:
            await _close(nc, self._settings.connect_timeout)
            raise
        return _Publisher(nc, self._subject, self._settings.connect_timeout)


class _Publisher:
    def __init__(self, nc: Client, subject: str, close_within: float) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._subject = subject
        self._close_within = close_within

    async def close(self) -> None:
        await _close(self._nc, self._close_within)

    async def publish(self, messages: Sequence[OutMessage], timeout: float) -> list[Outcome]:
        # nats-py's timeout counts from the write's end, and a write to a server that reads
        # nothing (it hangs) waits for good once the socket's buffers are full: bounded whole.
        results = await asyncio.gather(
            *(
                asyncio.wait_for(
                    self._js.publish(self._subject, m.body, timeout=timeout, headers=_headers(m)), timeout
                )
                for m in messages
            ),
            return_exceptions=True,
        )
        lost = not self._nc.is_connected
        outcomes: list[Outcome] = []
        for result in results:
            if isinstance(result, BaseException):
                if isinstance(result, TimeoutError) and not lost:  # nats-py's TimeoutError is one
                    # A lost connection too: the server (or the network to it) hangs.
                    why = f"no publish ack from NATS within {timeout} s, subject {self._subject!r}"
                    outcomes.append(Refused(why, lost=True))
                elif lost or isinstance(result, _GONE):
                    outcomes.append(Refused(_LOST, lost=True))
                elif isinstance(result, nats.js.errors.NoStreamResponseError | nats.errors.NoRespondersError):
                    outcomes.append(Refused(f"no NATS stream captures subject {self._subject!r} (deleted?)"))
                else:
                    outcomes.append(Refused(f"NATS refused the publish: {type(result).__name__}: {result}"))
            else:
                record = {"subject": self._subject, "stream": result.stream, "seq": result.seq}
                if result.duplicate:
                    record["duplicate"] = True
                outcomes.append(Confirmed(record))
        return outcomes


def _headers(message: OutMessage) -> dict[str, str]:
    headers = {
        k: v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
        for k, v in carried_headers(message.headers, PREFIX).items()
    }
    headers["Nats-Msg-Id"] = message.message_id
    headers["Content-Type"] = message.content_type
    if message.key is not None:
        headers["Pgbroker-Key"] = message.key
    return headers


class _InEndpoint:
    def __init__(self, url: BrokerUrl, source: str | None, queue: str, settings: InboundSettings) -> None:
        self._url = url
        self._subject = source or url.options.get("subject") or queue
        self._durable = url.options.get("durable") or _name(f"pgbroker-{queue}")
        self._settings = settings
        self.where = f"{url.hostport()} subject {self._subject!r} consumer {self._durable!r}"

    async def open(self) -> Receiver:
        nc = await _connect(self._url, self._settings.connect_timeout)
        try:
            stream = await _stream_for(nc, self._url, self._subject, self._settings.declare)
            js = nc.jetstream()
            if not self._settings.declare:
                try:
                    await js.consumer_info(stream, self._durable)
                except nats.js.errors.NotFoundError:
                    raise BrokerNotFound(
                        f"NATS stream {stream!r} has no consumer {self._durable!r}",
                        hint="Add it (nats consumer add), or run the bridge with --declare (declare=True).",
                    ) from None
            config = ConsumerConfig(
                ack_wait=self._settings.ack_wait,
                max_ack_pending=max(self._settings.prefetch, self._settings.batch_size),
                filter_subject=self._subject,
            )
            subscription = await js.pull_subscribe(
                self._subject, durable=self._durable, stream=stream, config=config
            )
        except BaseException:
            await _close(nc, self._settings.connect_timeout)
            raise
        return _Receiver(nc, subscription, stream, self._settings.connect_timeout)


class _Receiver:
    header_prefix = PREFIX

    def __init__(self, nc: Client, subscription: Any, stream: str, within: float) -> None:
        self._nc = nc
        self._subscription = subscription
        self._stream = stream
        self._within = within  # the bound of a close, an ack or a termination

    async def close(self) -> None:
        await _close(self._nc, self._within)

    async def receive(self, limit: int, wait: float) -> list[Received]:
        try:
            messages: list[Msg] = await self._subscription.fetch(batch=limit, timeout=wait)
        except (TimeoutError, nats.errors.TimeoutError):
            if not self._nc.is_connected:
                raise BrokerConnectionLost("NATS connection lost while fetching") from None
            return []
        except _GONE as exc:
            raise BrokerConnectionLost(f"NATS connection lost while fetching: {type(exc).__name__}") from exc
        return [self._received(m) for m in messages]

    def _received(self, msg: Msg) -> Received:
        headers = dict(msg.headers or {})
        meta = msg.metadata
        message_id = headers.pop("Nats-Msg-Id", None) or f"{self._stream}:{meta.sequence.stream}"
        content_type = headers.pop("Content-Type", None)
        key = headers.get("Pgbroker-Key")
        carried: dict[str, Any] = {
            f"{PREFIX}received": {
                "subject": msg.subject,
                "stream": self._stream,
                "seq": meta.sequence.stream,
                "delivered": meta.num_delivered,
            }
        }
        if headers:
            carried[f"{PREFIX}headers"] = headers
            carried.update(trace_context(headers))
        return Received(message_id, msg.data or b"", content_type, carried, msg, key)

    async def ack(self, messages: Sequence[Received]) -> None:
        try:
            # A write waits for good on a server that hangs once the socket's buffers are full.
            async with asyncio.timeout(self._within):
                for m in messages:
                    await m.token.ack()
                await self._nc.flush()
        except (*_GONE, nats.errors.FlushTimeoutError) as exc:
            raise BrokerConnectionLost(f"NATS connection lost while acking: {type(exc).__name__}") from exc

    async def reject(self, message: Received) -> None:
        try:
            async with asyncio.timeout(self._within):
                await message.token.term()
        except _GONE as exc:
            raise BrokerConnectionLost(
                f"NATS connection lost while terminating: {type(exc).__name__}"
            ) from exc
