"""The RabbitMQ bridge: pgbroker queues published to RabbitMQ, and RabbitMQ queues received.

OutboundBridge is a transactional outbox (pgbroker.bridge.outbound), InboundBridge a consumer
that writes into a pgbroker queue and acks RabbitMQ only after the commit, de-duplicating
redeliveries by message_id (pgbroker.bridge.inbound). Both run on an AsyncBroker until stop().
Needs the ``bridge`` extra (pika).
"""

from pgbroker.bridge.errors import (
    AmqpAccessRefused,
    AmqpConnectionLost,
    AmqpNotFound,
    AmqpUnreachable,
    BridgeError,
    Unpublishable,
)
from pgbroker.bridge.inbound import InboundBridge, InboundSettings, InboundStats
from pgbroker.bridge.outbound import OutboundBridge, OutboundSettings, OutboundStats

__all__ = [
    "AmqpAccessRefused",
    "AmqpConnectionLost",
    "AmqpNotFound",
    "AmqpUnreachable",
    "BridgeError",
    "InboundBridge",
    "InboundSettings",
    "InboundStats",
    "OutboundBridge",
    "OutboundSettings",
    "OutboundStats",
    "Unpublishable",
]
