"""pgbroker: a message broker inside PostgreSQL, call-compatible with pgmq.

The public surface is small: Broker and Queue (sync; pgbroker.queues._client_async has the
asyncio twins), App and Worker (the consumer runtime), the records Message,
Receipt, QueueInfo, Metrics and Policy, and the exceptions in pgbroker.errors.
"""

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
from pgbroker.queues._client import Broker, Queue, Transaction
from pgbroker.queues._records import Message, Metrics, Policy, QueueInfo, Receipt
from pgbroker.runtime._app import App
from pgbroker.runtime._worker import Worker

__all__ = [
    "App",
    "Broker",
    "InvalidArgument",
    "InvalidMessage",
    "InvalidQueueName",
    "Message",
    "MessageTooLarge",
    "Metrics",
    "NotInstalled",
    "PgbrokerError",
    "Policy",
    "Queue",
    "QueueFull",
    "QueueInfo",
    "QueueNameConflict",
    "QueueNotFound",
    "Receipt",
    "StaleReceipt",
    "Transaction",
    "Worker",
]
__version__ = "0.1.0"
