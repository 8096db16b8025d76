"""How the outbound bridge turns a message and its headers into an AMQP publish, and what it refuses
(the core's OutMessage of a message, then the RabbitMQ connector's mapping)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from pgbroker.bridge.connector import OutMessage
from pgbroker.bridge.connectors.rabbitmq_mapping import Route, jsonable, outgoing
from pgbroker.bridge.core.outbound import out_message
from pgbroker.bridge.errors import Unpublishable
from pgbroker.queues._records import Message, message_identity

DEFAULT = Route("events", "orders")
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def message(payload: Any = None, headers: dict[str, Any] | None = None, msg_id: int = 7) -> OutMessage:
    return out_message(Message(msg_id, 1, NOW, NOW, NOW, payload, headers))


def test_defaults_route_a_message_without_routing_headers_and_the_bridge_sets_its_guarantees() -> None:
    o = outgoing(message({"a": 1}), DEFAULT)
    assert o.route == DEFAULT
    assert json.loads(o.body) == {"a": 1}
    assert (o.properties.message_id, o.properties.delivery_mode) == (message_identity("7", NOW), 2)
    assert o.properties.content_type == "application/json"
    assert o.properties.headers is None


def test_headers_choose_the_route_and_the_properties() -> None:
    headers = {
        "x-amqp-exchange": "billing",
        "x-amqp-routing-key": "invoice.paid",
        "x-amqp-properties": {
            "content_type": "application/vnd.invoice+json",
            "type": "invoice",
            "expiration": 60000,
            "timestamp": "2026-01-02T03:04:05+00:00",
            "headers": {"tenant": "t2", "x-amqp-ignored": 1, "weight": 1.5},
        },
        "tenant": "t1",
        "trace": "abc",
        "x-pgbroker-dead-letter": {"old": True},
    }
    o = outgoing(message("x", headers), DEFAULT)
    assert o.route == Route("billing", "invoice.paid")
    assert o.properties.content_type == "application/vnd.invoice+json"
    assert o.properties.type == "invoice"
    assert o.properties.expiration == "60000"
    assert o.properties.timestamp == int(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp())
    # Plain headers travel as AMQP headers; the properties' headers win; reserved ones stay home;
    # AMQP tables have no floats.
    assert o.properties.headers == {"tenant": "t2", "trace": "abc", "x-amqp-ignored": 1, "weight": "1.5"}


@pytest.mark.parametrize(
    ("headers", "complaint"),
    [
        ({"x-amqp-exchange": 5}, "x-amqp-exchange must be a string"),
        ({"x-amqp-routing-key": "k" * 256}, "longer than AMQP's 255 bytes"),
        ({"x-amqp-properties": []}, "must be an object"),
        ({"x-amqp-properties": {"message_id": "mine"}}, "cannot set: message_id"),
        ({"x-amqp-properties": {"delivery_mode": 1}}, "cannot set: delivery_mode"),
        ({"x-amqp-properties": {"priority": 300}}, "priority must be an integer from 0 to 255"),
        ({"x-amqp-properties": {"expiration": "soon"}}, "expiration must be milliseconds"),
        ({"x-amqp-properties": {"timestamp": "yesterday"}}, "timestamp must be epoch seconds or ISO 8601"),
        ({"x-amqp-properties": {"headers": "h"}}, "headers must be an object"),
    ],
)
def test_headers_that_cannot_be_published_name_the_problem(headers: dict[str, Any], complaint: str) -> None:
    with pytest.raises(Unpublishable) as refused:
        outgoing(message("x", headers), DEFAULT)
    assert complaint in str(refused.value)


def test_amqp_field_values_become_json() -> None:
    value = {"when": datetime(2026, 1, 1), "raw": b"\xff", "text": b"ok", "list": (1, float("nan"))}
    assert jsonable(value) == {
        "when": "2026-01-01T00:00:00+00:00",
        "raw": "/w==",
        "text": "ok",
        "list": [1, None],
    }
