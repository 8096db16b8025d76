"""Running workers in a test: serve them until a condition holds, then stop them gracefully."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from pgbroker import StreamWorker, Worker
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.runtime._app import serve


async def run_until(
    dsn: str,
    workers: Sequence[Worker | StreamWorker],
    done: Callable[[], bool],
    *,
    timeout: float = 30,
    broker: AsyncBroker | None = None,
) -> None:
    """Serve the workers until done() holds, then stop them gracefully; fail after ``timeout``."""

    async def watch() -> None:
        deadline = time.monotonic() + timeout
        try:
            while not done():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not done after {timeout} s: {[w.stats for w in workers]}")
                await asyncio.sleep(0.01)
        finally:
            for worker in workers:
                worker.stop()

    watcher = asyncio.create_task(watch())
    await serve(workers, dsn=dsn, broker=broker, handle_signals=False)
    await watcher


async def while_serving(
    task: asyncio.Task[None], condition: Callable[[], bool], what: str, seconds: float = 60
) -> None:
    """Wait until condition() holds while ``task`` serves workers; fail if it ends first (with its
    error), or after ``seconds``, saying ``what`` did not happen."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert not task.done(), f"the workers stopped: {task.exception()!r}"
        assert time.monotonic() < deadline, f"{what} (after {seconds} s)"
        await asyncio.sleep(0.05)
