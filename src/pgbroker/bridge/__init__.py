"""Bridges between pgbroker queues and other brokers: one core, a connector per broker.

OutboundBridge is a transactional outbox (pgbroker.bridge.core.outbound): a queue's messages are
published to a broker and acked in Postgres only after the broker confirmed them. InboundBridge
receives from a broker into a queue and acks there only after the commit, de-duplicating
redeliveries by message id (pgbroker.bridge.core.inbound). Both run on an AsyncBroker until stop(),
and so do their twins on a stream, StreamOutboundBridge and StreamInboundBridge.
The URL's scheme chooses the connector (pgbroker.bridge.core.endpoints): amqp:// RabbitMQ (pika),
redis:// Redis Streams (redis-py), nats:// NATS JetStream (nats-py), mqtt:// MQTT (paho-mqtt),
sqs:// Amazon SQS (boto3), each needing the ``bridge`` extra; the interface a connector
implements is pgbroker.bridge.connector.
"""

from pgbroker.bridge.core.inbound import InboundBridge, InboundStats, StreamInboundBridge
from pgbroker.bridge.core.outbound import OutboundBridge, OutboundStats
from pgbroker.bridge.core.stream_outbound import StreamOutboundBridge
from pgbroker.bridge.errors import (
    AmqpAccessRefused,
    AmqpConnectionLost,
    AmqpNotFound,
    AmqpUnreachable,
    BridgeError,
    BrokerAccessRefused,
    BrokerConnectionLost,
    BrokerNotFound,
    BrokerUnreachable,
    Unpublishable,
)
from pgbroker.bridge.settings import InboundSettings, OutboundSettings

__all__ = [
    "AmqpAccessRefused",
    "AmqpConnectionLost",
    "AmqpNotFound",
    "AmqpUnreachable",
    "BridgeError",
    "BrokerAccessRefused",
    "BrokerConnectionLost",
    "BrokerNotFound",
    "BrokerUnreachable",
    "InboundBridge",
    "InboundSettings",
    "InboundStats",
    "OutboundBridge",
    "OutboundSettings",
    "OutboundStats",
    "StreamInboundBridge",
    "StreamOutboundBridge",
    "Unpublishable",
]
