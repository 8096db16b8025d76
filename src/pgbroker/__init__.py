"""pgbroker: a message broker inside PostgreSQL, call-compatible with pgmq.

This module is the public API, sync and asyncio alike: the clients (Broker, Queue, Transaction,
Stream and their Async twins), the consumer runtime (App, Worker, StreamWorker, Scheduler), the
records they return and the errors they raise. A module or package whose name starts with an
underscore is private; a package's API is its __init__ (docs/adr/0001-layout.md).

Each name is imported where it lives the first time it is used (PEP 562): ``import pgbroker`` costs
nothing until then, so that the ``pgbroker`` command holds its stop signals before the imports it
needs (pgbroker.cli.entry); importing pgbroker's modules eagerly took most of its start, during
which a SIGTERM killed it (exit 143).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgbroker.errors import (
        ConnectionLost,
        DatabaseError,
        IdempotencyKeyReused,
        InstallError,
        InvalidArgument,
        InvalidMessage,
        InvalidQueueName,
        MessageTooLarge,
        MissingExtension,
        NotInstalled,
        OutcomeUnknown,
        PgbrokerError,
        QueueFull,
        QueueNameConflict,
        QueueNotFound,
        StaleReceipt,
        StreamConsumerSuperseded,
        StreamGroupNotFound,
        StreamNotFound,
    )
    from pgbroker.queues import (
        AsyncBroker,
        AsyncQueue,
        AsyncTransaction,
        Broker,
        Message,
        Metrics,
        PeekedMessage,
        Policy,
        PolicyChanges,
        Queue,
        QueueInfo,
        Receipt,
        Schedule,
        ScheduleTick,
        Transaction,
    )
    from pgbroker.runtime import (
        App,
        Handler,
        StreamHandler,
        StreamWorker,
        Worker,
        WorkerOptions,
        WorkerStats,
    )
    from pgbroker.schedules import (
        Scheduler,
        SchedulerStats,
    )
    from pgbroker.streams import (
        AsyncStream,
        AsyncStreamConsumer,
        PartitionLag,
        Stream,
        StreamBatch,
        StreamConsumer,
        StreamGroupInfo,
        StreamInfo,
        StreamMessage,
    )

__all__ = [
    "App",
    "AsyncBroker",
    "AsyncQueue",
    "AsyncStream",
    "AsyncStreamConsumer",
    "AsyncTransaction",
    "Broker",
    "ConnectionLost",
    "DatabaseError",
    "Handler",
    "IdempotencyKeyReused",
    "InstallError",
    "InvalidArgument",
    "InvalidMessage",
    "InvalidQueueName",
    "Message",
    "MessageTooLarge",
    "Metrics",
    "MissingExtension",
    "NotInstalled",
    "OutcomeUnknown",
    "PartitionLag",
    "PeekedMessage",
    "PgbrokerError",
    "Policy",
    "PolicyChanges",
    "Queue",
    "QueueFull",
    "QueueInfo",
    "QueueNameConflict",
    "QueueNotFound",
    "Receipt",
    "Schedule",
    "ScheduleTick",
    "Scheduler",
    "SchedulerStats",
    "StaleReceipt",
    "Stream",
    "StreamBatch",
    "StreamConsumer",
    "StreamConsumerSuperseded",
    "StreamGroupInfo",
    "StreamGroupNotFound",
    "StreamHandler",
    "StreamInfo",
    "StreamMessage",
    "StreamNotFound",
    "StreamWorker",
    "Transaction",
    "Worker",
    "WorkerOptions",
    "WorkerStats",
]
__version__ = "0.2.0"

# Where the names of __all__ live, looked in in this order.
_HOMES = ("pgbroker.errors", "pgbroker.queues", "pgbroker.runtime", "pgbroker.schedules", "pgbroker.streams")


def __getattr__(name: str) -> Any:
    if name in __all__:
        for home in _HOMES:
            module = importlib.import_module(home)
            if name in module.__dict__:
                value = globals()[name] = module.__dict__[name]
                return value
    try:  # a subpackage, as `import pgbroker.codecs` would give (an attribute once imported)
        found: ModuleType = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    return found


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
