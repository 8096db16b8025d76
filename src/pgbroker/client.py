"""The synchronous client: Broker (connections, install, queue management), Queue and Transaction.

The code is generated from the asyncio client, pgbroker.aio, the one written copy: it lives in
pgbroker/_generated/client.py (scripts/async_to_sync.py, `make generate`), where the duplicate
checks and the reader can tell it from hand-written code. This module is its public name.
"""

from pgbroker._generated.client import (
    Broker,
    ConnectionExecutor,
    Executor,
    PoolExecutor,
    Queue,
    Transaction,
)

__all__ = ["Broker", "ConnectionExecutor", "Executor", "PoolExecutor", "Queue", "Transaction"]
