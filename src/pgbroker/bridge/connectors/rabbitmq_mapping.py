"""How a pgbroker message becomes an AMQP publish, and an AMQP delivery a pgbroker message.

Outbound, a message's headers may say where and how to publish it:

  x-amqp-exchange     the exchange (default: the bridge's --exchange, else the default exchange "")
  x-amqp-routing-key  the routing key (default: the bridge's --routing-key, else the queue's name)
  x-amqp-properties   AMQP properties: content_type, content_encoding, correlation_id, reply_to,
                      expiration, priority, type, app_id, user_id, timestamp, headers

Every other header that does not start with ``x-amqp-`` or ``x-pgbroker-`` is copied into the
AMQP headers table (x-amqp-properties.headers wins on a clash; AMQP tables have no floating
point type, so a float header travels as its text). The body and its content type are the core's
(pgbroker.bridge.body; x-amqp-properties.content_type may override application/json, never a
binary codec's type, which says how to read the bytes); message_id is the message identity
(msg_id@enqueued_at) and delivery is persistent, always: those are the bridge's guarantees, so
the properties may not set them.

Inbound, the body goes to the core as it came (pgbroker.bridge.body makes it a payload, and the
core adds x-amqp-body when it is not JSON). The AMQP properties are kept in x-amqp-properties
(the shape above, plus message_id) and where the message came from in
x-amqp-received {exchange, routing_key, queue, redelivered}; a traceparent and tracestate of
the AMQP headers table are also copied to the top of the headers (pgbroker.tracing).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pika

from pgbroker.bridge.body import JSON
from pgbroker.bridge.connector import OutMessage, Received, trace_context
from pgbroker.bridge.connectors.rabbitmq_pika import Delivery
from pgbroker.bridge.errors import Unpublishable

EXCHANGE_HEADER = "x-amqp-exchange"
ROUTING_KEY_HEADER = "x-amqp-routing-key"
PROPERTIES_HEADER = "x-amqp-properties"
# A message's key (a stream's key, a queue's FIFO group) travels as this AMQP header.
KEY_HEADER = "x-pgmq-group"
RECEIVED_HEADER = "x-amqp-received"
_RESERVED_PREFIXES = ("x-amqp-", "x-pgbroker-")

_TEXT_PROPERTIES = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "type",
    "app_id",
    "user_id",
)
_SHORTSTR_MAX = 255  # AMQP short strings: exchange, routing key and most properties
_PERSISTENT = 2


@dataclass(frozen=True, slots=True)
class Route:
    exchange: str
    routing_key: str


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message ready for basic.publish."""

    msg_id: int
    route: Route
    body: bytes
    properties: pika.BasicProperties


def outgoing(message: OutMessage, default: Route) -> Outgoing:
    """The publish for a message, or Unpublishable naming the header that is wrong."""
    headers = message.headers or {}
    route = Route(
        _short_text(headers.get(EXCHANGE_HEADER, default.exchange), EXCHANGE_HEADER),
        _short_text(headers.get(ROUTING_KEY_HEADER, default.routing_key), ROUTING_KEY_HEADER),
    )
    given = headers.get(PROPERTIES_HEADER)
    given = {} if given is None else given
    if not isinstance(given, Mapping):
        raise Unpublishable(f"header {PROPERTIES_HEADER} must be an object, got {type(given).__name__}")
    unknown = sorted(set(given) - {*_TEXT_PROPERTIES, "expiration", "priority", "timestamp", "headers"})
    if unknown:
        raise Unpublishable(
            f"{PROPERTIES_HEADER} has properties the bridge cannot set: {', '.join(unknown)}",
            hint="message_id (the message identity) and delivery_mode (persistent) are set by the bridge.",
        )
    texts = {
        name: _short_text(given[name], f"{PROPERTIES_HEADER}.{name}")
        for name in _TEXT_PROPERTIES
        if name in given
    }
    table = {k: v for k, v in headers.items() if not k.startswith(_RESERVED_PREFIXES)}
    extra = given.get("headers")
    extra = {} if extra is None else extra
    if not isinstance(extra, Mapping):
        raise Unpublishable(f"{PROPERTIES_HEADER}.headers must be an object, got {type(extra).__name__}")
    table.update(extra)
    properties = pika.BasicProperties(
        content_type=_content_type(texts.pop("content_type", None), message.content_type),
        delivery_mode=_PERSISTENT,
        message_id=message.message_id,
        headers={k: _amqp_value(v) for k, v in table.items()} or None,
        priority=_priority(given.get("priority")),
        expiration=_expiration(given.get("expiration")),
        timestamp=_timestamp(given.get("timestamp")),
        **texts,
    )
    return Outgoing(message.msg_id, route, message.body, properties)


def _content_type(given: str | None, body_type: str) -> str:
    """The content_type property: the one a JSON message's header gives, else the body's own
    (a binary body's content type names its codec, and the receiver needs it to read the bytes)."""
    return given if given is not None and body_type == JSON else body_type


def _short_text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise Unpublishable(f"{what} must be a string, got {type(value).__name__}")
    if len(value.encode()) > _SHORTSTR_MAX:
        raise Unpublishable(f"{what} is longer than AMQP's {_SHORTSTR_MAX} bytes")
    return value


def _priority(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
        raise Unpublishable(f"{PROPERTIES_HEADER}.priority must be an integer from 0 to 255, got {value!r}")
    return value


def _expiration(value: Any) -> str | None:
    # AMQP carries the per-message TTL as text: milliseconds.
    if value is None:
        return None
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not text.isdigit():
        raise Unpublishable(
            f"{PROPERTIES_HEADER}.expiration must be milliseconds (a whole number), got {value!r}"
        )
    return text


def _timestamp(value: Any) -> int | None:
    """AMQP timestamps are whole seconds since the epoch."""
    if value is None:
        return None
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
        if isinstance(value, str):
            stamp = datetime.fromisoformat(value)
            return int((stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp())
    except (ValueError, OverflowError, OSError):
        pass
    raise Unpublishable(
        f"{PROPERTIES_HEADER}.timestamp must be epoch seconds or ISO 8601 text, got {value!r}"
    )


def _amqp_value(value: Any) -> Any:
    """A JSON value as an AMQP field value: AMQP tables have no floating point type (pika), so a
    float travels as its text."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        return {k: _amqp_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_amqp_value(v) for v in value]
    return value


# -- inbound -----------------------------------------------------------------------------------------


def incoming(delivery: Delivery, queue: str) -> Received:
    """A delivery as the core receives it: the AMQP message_id is the de-duplication key."""
    properties = delivery.properties
    kept = {
        "message_id": properties.message_id,
        **{name: getattr(properties, name) for name in _TEXT_PROPERTIES},
        "expiration": properties.expiration,
        "priority": properties.priority,
        "timestamp": None
        if properties.timestamp is None
        else datetime.fromtimestamp(properties.timestamp, UTC),
        "headers": properties.headers or None,
    }
    headers: dict[str, Any] = {
        PROPERTIES_HEADER: {k: jsonable(v) for k, v in kept.items() if v is not None},
        RECEIVED_HEADER: {
            "exchange": delivery.exchange,
            "routing_key": delivery.routing_key,
            "queue": queue,
            "redelivered": delivery.redelivered,
        },
        **trace_context(properties.headers),
    }
    key = (properties.headers or {}).get(KEY_HEADER)
    key = jsonable(key) if isinstance(key, str | bytes) else None
    return Received(
        properties.message_id or None, delivery.body, properties.content_type, headers, delivery, key
    )


def jsonable(value: Any) -> Any:
    """An AMQP field value as JSON: tables and arrays walked, timestamps as ISO text, bytes decoded."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, float) and value != value:  # NaN has no JSON form
        return None
    return value
