"""What a connector is: the small typed interface between the bridge core and one broker.

The core (pgbroker.bridge.core.outbound, pgbroker.bridge.core.inbound) owns everything that is the same
for every broker: leasing batches from the queue, windows in flight, acking in Postgres only
after the broker confirmed, retries and dead letters under the queue's policy, de-duplication
by message id inbound, reconnecting, progress and metrics. A connector only talks to its broker:

  outbound  a Publisher publishes a window of OutMessages and says, per message, whether the
            broker confirmed it (Confirmed, with a record of where it went) or not (Refused,
            with the reason, and whether the connection was lost with it);
  inbound   a Receiver hands over Received messages (body bytes, message id, headers) and acks
            them when the core says so: after the Postgres commit. Or rejects one pgbroker
            refused, so that the broker does not deliver it forever.

An Endpoint is the parsed URL of one broker and one name on it (a queue, stream, subject,
topic): it opens a Publisher or a Receiver, and opens it again after the connection was lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar


@dataclass(frozen=True, slots=True)
class OutMessage:
    """One message to publish.

    ``body`` is the payload encoded by pgbroker.bridge.body as ``content_type`` says;
    ``message_id`` the message's identity, "<msg_id>@<enqueued_at>" (Message.identity: the
    broker's de-duplication key, where it has one; unique across a failover); ``headers`` the
    message's pgbroker headers (JSON values; each connector picks what it can carry); ``key``
    orders messages per key where the target can (a stream's subject, a FIFO queue's message
    group), None when the message has none."""

    msg_id: int
    message_id: str
    body: bytes
    content_type: str
    headers: Mapping[str, Any]
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Confirmed:
    """The broker has the message (its confirm, ack or PUBACK came): ``record`` says where it
    went (an exchange and routing key, a stream entry id, ...), kept with the archived message."""

    record: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Refused:
    """The broker did not confirm the message: ``reason`` is kept in its failure (retry, dead
    letter); ``lost`` says the connection went with it, so the core reconnects after the window."""

    reason: str
    lost: bool = False


Outcome = Confirmed | Refused


@dataclass(frozen=True, slots=True)
class Received:
    """One message from the broker, not yet acked there.

    ``message_id`` is the de-duplication key (None: the message cannot be recognised when it
    comes again, so it is stored each time); ``headers`` are the broker's metadata as JSON for the
    pgbroker message's headers; ``token`` is whatever the connector needs to ack it; ``key`` the
    message's key where the broker carries one (what OutMessage.key became: a Redis field, a NATS
    header, an MQTT user property, an SQS FIFO group, the AMQP header x-pgmq-group), the key of
    the message appended when the target is a pgbroker stream.
    """

    message_id: str | None
    body: bytes
    content_type: str | None
    headers: dict[str, Any]
    token: Any = field(default=None, compare=False)
    key: str | None = None


class Publisher(Protocol):
    """An open connection that publishes (several windows may call publish at once)."""

    async def publish(self, messages: Sequence[OutMessage], timeout: float) -> list[Outcome]:
        """One Outcome per message, in order; a message not confirmed within ``timeout`` seconds
        is Refused. Never raises for a single message's failure."""
        ...

    async def close(self) -> None:
        """Close quietly: the connection may already be broken."""
        ...


class Receiver(Protocol):
    """An open connection that receives, with acks under the core's control."""

    # Prefix of the headers this connector writes (x-amqp-, x-redis-, ...): the core adds
    # <prefix>body when a body is not JSON.
    header_prefix: str

    async def receive(self, limit: int, wait: float) -> list[Received]:
        """Up to ``limit`` messages: waits up to ``wait`` seconds for the first (then [] if none
        came) and returns what else is there at once. Raises BrokerConnectionLost."""
        ...

    async def ack(self, messages: Sequence[Received]) -> None:
        """Settle messages stored in Postgres (the commit is done): the broker must not deliver
        them again. Raises BrokerConnectionLost; they then come again and are recognised."""
        ...

    async def reject(self, message: Received) -> None:
        """Settle a message pgbroker refused (too large, say) so it is not delivered forever:
        dead-lettered by the broker where it can, else dropped (the core logs it)."""
        ...

    async def close(self) -> None: ...


Connection_co = TypeVar("Connection_co", covariant=True)


class Endpoint(Protocol[Connection_co]):
    """A broker and a name on it, parsed from a URL; opens connections to it."""

    # host:port and the name, for logs and errors (never a password).
    where: str

    async def open(self) -> Connection_co:
        """A connected Publisher or Receiver; BrokerUnreachable, BrokerAccessRefused or
        BrokerNotFound when that cannot be (the first open is not retried)."""
        ...


# The W3C trace context (pgbroker.tracing): carried out as any other header, and taken back in
# from among the broker's headers to the top of the message's, where a consumer looks for it.
TRACE_CONTEXT = ("traceparent", "tracestate")


def trace_context(broker_headers: Mapping[str, Any] | None) -> dict[str, str]:
    """The W3C trace context among a received message's broker headers, as pgbroker headers."""
    if not isinstance(broker_headers, Mapping):
        return {}
    found = {name: broker_headers.get(name) for name in TRACE_CONTEXT}
    return {
        name: value.decode(errors="replace") if isinstance(value, bytes) else value
        for name, value in found.items()
        if isinstance(value, str | bytes)
    }


def carried_headers(headers: Mapping[str, Any], own_prefix: str) -> dict[str, Any]:
    """The headers a connector carries to its broker: all but pgbroker's own (x-pgbroker-*, kept
    in Postgres) and those addressed to the connector itself (``own_prefix``, e.g. x-mqtt-)."""
    return {k: v for k, v in headers.items() if not k.startswith(("x-pgbroker-", own_prefix))}


Delivery = TypeVar("Delivery")


async def gather_more(
    inbox: asyncio.Queue[Delivery], first: Delivery, limit: int, linger: float
) -> list[Delivery]:
    """``first`` and whatever else reaches ``inbox`` within ``linger`` seconds, up to ``limit``: a
    push-style receiver's batch (its client library hands deliveries to a queue one by one)."""
    batch = [first]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + linger
    while len(batch) < limit:
        if not inbox.empty():
            batch.append(inbox.get_nowait())
            continue
        try:
            async with asyncio.timeout(max(0.0, deadline - loop.time())):
                batch.append(await inbox.get())
        except TimeoutError:
            break
    return batch
