"""Queues: the clients and the records they return.

AsyncBroker, AsyncQueue and AsyncTransaction (_client_async.py) are the one written copy; Broker,
Queue and Transaction (_client.py) are generated from them by scripts/async_to_sync.py. The query
layer both run (_queries.py) and the records (_records.py) are private modules: import from here.
"""

from pgbroker.queues._client import Broker, Queue, Transaction
from pgbroker.queues._client_async import AsyncBroker, AsyncQueue, AsyncTransaction
from pgbroker.queues._records import (
    Message,
    Metrics,
    PeekedMessage,
    Policy,
    PolicyChanges,
    QueueInfo,
    Receipt,
    Schedule,
    ScheduleTick,
)

__all__ = [
    "AsyncBroker",
    "AsyncQueue",
    "AsyncTransaction",
    "Broker",
    "Message",
    "Metrics",
    "PeekedMessage",
    "Policy",
    "PolicyChanges",
    "Queue",
    "QueueInfo",
    "Receipt",
    "Schedule",
    "ScheduleTick",
    "Transaction",
]
