"""How a bridge runs: the settings of the core (both directions), and the few of a connector that
are also command-line options. The CLI's options of the same names set them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OutboundSettings:
    """How an outbound bridge publishes."""

    batch_size: int = 500  # messages per window
    windows: int = 2  # windows in flight at once
    lease: int = 30  # seconds a window's messages stay invisible to other bridges (extended as needed)
    idle_wait: float = 1.0  # an idle bridge reads again after this long without a notification
    # A publish not confirmed within this fails (retried later); the connection counts as lost.
    confirm_timeout: float = 30.0
    connect_timeout: float = 10.0
    declare: bool = False  # create what is missing on the broker (exchange, stream, queue)
    enable_notify: bool = True  # enable NOTIFY on the queue if it is off
    # RabbitMQ only (the URL's ?exchange= and ?routing_key= say the same):
    exchange: str = ""  # for messages without x-amqp-exchange; "" is RabbitMQ's default exchange
    routing_key: str | None = None  # for messages without x-amqp-routing-key; None: the queue's name
    exchange_type: str = "topic"  # with declare


@dataclass(frozen=True, slots=True)
class InboundSettings:
    """How an inbound bridge receives."""

    batch_size: int = 500  # messages per transaction
    prefetch: int = 1000  # unacked messages the broker may send ahead (>= batch_size)
    linger: float = 0.005  # seconds to wait for more messages before writing a partial batch
    seen_within: float = 86_400.0  # seconds a message id is remembered for de-duplication
    prune_every: float = 60.0  # seconds between prunings of older message ids
    connect_timeout: float = 10.0
    declare: bool = False  # create what is missing on the broker (queue, stream, consumer group)
    # Seconds a received but unacked message stays with this bridge before the broker gives it
    # to another consumer (NATS ack wait, SQS visibility timeout, Redis claim of idle entries).
    ack_wait: float = 30.0


def liveness_interval(connect_timeout: float) -> int:
    """Seconds between the checks a connector's client makes that the broker still answers an
    open connection (an AMQP heartbeat, an MQTT keepalive, a NATS ping): half the connect
    timeout, in whole seconds as the protocols count them, one at least. A broker that hangs (or
    a network that drops packets without a word) is then found lost within a few connect
    timeouts, also by a bridge that is idle, which otherwise waited as long as the hang lasted."""
    return max(1, round(connect_timeout / 2))
