"""The threads that run a worker's sync handlers, so that they never block its event loop, and what
a handler raised, as its failure."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import queue
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from pgbroker.queues._records import Message


class HandlerThreads:
    """Daemon threads that run sync handlers, ``size`` at a time.

    Not concurrent.futures' pool: its threads are joined at interpreter exit, so one handler
    stuck past the grace period would keep a stopping worker process alive for good.
    """

    def __init__(self, size: int, name: str) -> None:
        self._work: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._size = size
        for n in range(size):
            threading.Thread(target=self._serve, name=f"{name}-{n + 1}", daemon=True).start()

    async def run(self, handler: Callable[[Message], object], message: Message) -> None:
        """Run ``handler(message)`` on a thread, in a copy of the caller's context (its current
        span, say: pgbroker.tracing), then what it returned if that is awaitable (awaited_result)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        self._work.put((loop, future, contextvars.copy_context(), handler, message))
        await awaited_result(await future)

    def close(self) -> None:
        """Let the threads end once their current handler returns."""
        for _ in range(self._size):
            self._work.put(None)

    def _serve(self) -> None:
        while (item := self._work.get()) is not None:
            loop, future, context, handler, message = item
            result: object = None
            error: BaseException | None = None
            try:
                result = context.run(handler, message)
            except Exception as exc:
                error = exc
            except BaseException as exc:  # SystemExit or KeyboardInterrupt from a handler: a failure
                error = RuntimeError(f"handler raised {exc!r}")
            # The loop is closed when the worker stopped without waiting for this handler.
            with suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, result, error)


async def awaited_result(result: object) -> None:
    """What a sync handler returned, awaited when it is awaitable: an async handler behind a sync
    wrapper (a decorator written for functions) returns its coroutine, which nothing ran, while
    its message was acked as handled; it now runs, on the worker's loop, and what it raises is
    the handler's failure."""
    if inspect.isawaitable(result):
        await result


def handler_failure(raised: BaseException) -> Exception:
    """What an async handler raised, as its failure. A CancelledError that the running task was
    not asked for (the handler awaited something cancelled elsewhere: a client library's inner
    task, say) is the handler's failure like any other, as a RuntimeError naming it; a real
    cancellation (a stop, the grace period over) is raised again."""
    if isinstance(raised, Exception):
        return raised
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise raised
    failure = RuntimeError(f"handler raised {raised!r}").with_traceback(raised.__traceback__)
    failure.__cause__ = raised
    return failure


def _settle(future: asyncio.Future[object], result: object, error: BaseException | None) -> None:
    if future.done():  # cancelled: the worker gave the message back meanwhile
        if inspect.iscoroutine(result):
            result.close()  # never to run: no 'never awaited' warning
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
