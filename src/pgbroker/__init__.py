"""pgbroker: a message broker inside PostgreSQL, call-compatible with pgmq.

The public surface is small: Broker and Queue (sync; pgbroker.aio has the
asyncio twins), the records Message, Receipt, QueueInfo and Metrics, and the
exceptions in pgbroker.errors.
"""

from pgbroker.client import Broker, Queue, Transaction
from pgbroker.errors import (
    InvalidArgument,
    InvalidMessage,
    InvalidQueueName,
    MessageTooLarge,
    NotInstalled,
    PgbrokerError,
    QueueFull,
    QueueNameConflict,
    QueueNotFound,
    StaleReceipt,
)
from pgbroker.models import Message, Metrics, QueueInfo, Receipt

__all__ = [
    "Broker",
    "InvalidArgument",
    "InvalidMessage",
    "InvalidQueueName",
    "Message",
    "MessageTooLarge",
    "Metrics",
    "NotInstalled",
    "PgbrokerError",
    "Queue",
    "QueueFull",
    "QueueInfo",
    "QueueNameConflict",
    "QueueNotFound",
    "Receipt",
    "StaleReceipt",
    "Transaction",
]
__version__ = "0.1.0"
