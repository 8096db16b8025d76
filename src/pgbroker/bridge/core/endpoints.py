"""Which connector a URL's scheme chooses, loaded only when it is used.

Each connector module imports its broker's client library at its top, so the core and
``pip install pgbroker`` without the bridge extra never need them; a missing one is a
ModuleNotFoundError that names the library and the extra to install.
"""

from __future__ import annotations

from types import ModuleType

from pgbroker.bridge.connector import Endpoint, Publisher, Receiver
from pgbroker.bridge.settings import InboundSettings, OutboundSettings
from pgbroker.errors import InvalidArgument

# scheme -> (connector module, the client library it needs)
CONNECTORS: dict[str, tuple[str, str]] = {
    "amqp": ("rabbitmq", "pika"),
    "amqps": ("rabbitmq", "pika"),
    "redis": ("redis_streams", "redis"),
    "rediss": ("redis_streams", "redis"),
    "nats": ("nats_jetstream", "nats-py"),
    "tls": ("nats_jetstream", "nats-py"),
    "mqtt": ("mqtt", "paho-mqtt"),
    "mqtts": ("mqtt", "paho-mqtt"),
    "sqs": ("sqs", "boto3"),
}


def outbound_endpoint(url: str, queue: str, settings: OutboundSettings) -> Endpoint[Publisher]:
    """Where an outbound bridge publishes the queue ``queue``."""
    connector: Endpoint[Publisher] = _module(url).outbound(url, queue, settings)
    return connector


def inbound_endpoint(
    url: str, source: str | None, queue: str, settings: InboundSettings
) -> Endpoint[Receiver]:
    """Where an inbound bridge receives from (``source``, else the URL's name, else ``queue``)."""
    connector: Endpoint[Receiver] = _module(url).inbound(url, source, queue, settings)
    return connector


def scheme_of(url: str) -> str:
    scheme, sep, _ = url.partition("://")
    if not sep or scheme.lower() not in CONNECTORS:
        known = ", ".join(f"{s}://" for s in CONNECTORS)
        raise InvalidArgument(
            f"no bridge connector for {scheme + '://' if sep else repr(url)}",
            hint=f"A broker URL starts with one of {known}.",
        )
    return scheme.lower()


def _module(url: str) -> ModuleType:
    scheme = scheme_of(url)
    name, library = CONNECTORS[scheme]
    try:
        return _load(name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "pgbroker":
            raise  # pgbroker's own module missing: a broken install, not a missing extra
        raise ModuleNotFoundError(
            f"the {scheme}:// bridge needs {library} ({exc.name} is not installed):"
            " pip install 'pgbroker[bridge]'",
            name=exc.name,
        ) from exc


def _load(name: str) -> ModuleType:
    # Written out (not importlib) so that the import contracts see every connector.
    if name == "rabbitmq":
        from pgbroker.bridge.connectors import rabbitmq

        return rabbitmq
    if name == "redis_streams":
        from pgbroker.bridge.connectors import redis_streams

        return redis_streams
    if name == "nats_jetstream":
        from pgbroker.bridge.connectors import nats_jetstream

        return nats_jetstream
    if name == "mqtt":
        from pgbroker.bridge.connectors import mqtt

        return mqtt
    from pgbroker.bridge.connectors import sqs

    return sqs
