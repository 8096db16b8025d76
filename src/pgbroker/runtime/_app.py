"""Running workers: the App registry (``@app.handler("orders")``) and serve(), which runs workers
until SIGTERM or SIGINT and then stops them gracefully.

    app = pgbroker.App()

    @app.handler("orders", concurrency=4)
    def ship(message: pgbroker.Message) -> None:
        ...

    app.run()                      # or: pgbroker worker mymodule:app

serve() opens one connection pool for all its workers (each uses up to four connections at
once: two reads in flight, acks sent on their own, the heartbeat) and one LISTEN connection,
shared through an AsyncBroker.

Signals: SIGTERM or SIGINT stops every worker with its grace period (with handlers running,
worker.stopping says so at WARNING); SIGINT once more (Ctrl-C twice) gives back what is still in
flight at once. SIGTERM again changes nothing:
process managers send it to every process of a service, and the worker supervisor passes
it on as well, so a worker process may well receive it twice.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from typing import Any, TextIO, TypedDict, TypeVar, Unpack

from pgbroker import _event_loop as event_loop
from pgbroker._db.dsn import PoolerMode, pooler_mode
from pgbroker._db.pools import DEFAULT_CONNECT_TIMEOUT, DEFAULT_POOL_TIMEOUT, PoolTimeouts
from pgbroker.errors import InvalidArgument
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.queues._refusal_watch import RefusalWatch
from pgbroker.runtime._log_events import log_event, on_bug
from pgbroker.runtime._signals import on_stop_signals
from pgbroker.runtime._stream_worker import StreamHandler, StreamWorker
from pgbroker.runtime._worker import WORKER_REFUSALS, Handler, Worker, WorkerStats
from pgbroker.schedules._scheduler import Scheduler

__all__ = ["App", "WorkerOptions", "serve", "serve_scheduler"]

# What a scheduler that died of a bug beside the workers leaves: said with its error.
_SCHEDULER_GONE = "the workers go on; this process sends no schedule ticks until restarted"

H = TypeVar("H", bound=Handler)
SH = TypeVar("SH", bound=StreamHandler)


class WorkerOptions(TypedDict, total=False):
    """Keyword options of Worker (see there)."""

    concurrency: int
    batch_size: int
    vt: int
    heartbeat: bool
    notify: bool
    poll_min: float
    poll_max: float
    grace_period: float
    maintain_every: float
    max_deliveries: int | None


class App:
    """Handlers by queue name, run together by run(), serve() or `pgbroker worker module:app`."""

    def __init__(self) -> None:
        self._handlers: dict[str, tuple[Handler, WorkerOptions]] = {}
        self._stream_workers: list[Callable[[], StreamWorker]] = []
        self._stream_groups: list[str] = []  # "stream/group" of each stream handler, for messages

    @property
    def queues(self) -> list[str]:
        return list(self._handlers)

    def handler(self, queue: str, **options: Unpack[WorkerOptions]) -> Callable[[H], H]:
        """Register the decorated function as the handler of ``queue``; it is returned unchanged."""

        def register(function: H) -> H:
            if queue in self._handlers:
                raise InvalidArgument(f'queue "{queue}" already has a handler: {self._handlers[queue][0]!r}')
            Worker(queue, function, **options)  # checks the options here, where a mistake is made
            self._handlers[queue] = (function, options)
            return function

        return register

    def stream_handler(self, stream: str, group: str, **options: Any) -> Callable[[SH], SH]:
        """Register the decorated function as a handler of ``group`` on ``stream`` (see
        StreamWorker for the options); it runs with the queue handlers, one consumer a process."""

        def register(function: SH) -> SH:
            StreamWorker(stream, group, function, **options)  # checks the options here
            self._stream_workers.append(lambda: StreamWorker(stream, group, function, **options))
            self._stream_groups.append(f"{stream}/{group}")
            return function

        return register

    def workers(
        self, queues: Iterable[str] | None = None, **overrides: Unpack[WorkerOptions]
    ) -> list[Worker]:
        """A Worker per registered queue (or per queue named), with ``overrides`` over each one's options."""
        names = self.queues if queues is None else list(queues)
        unknown = [name for name in names if name not in self._handlers]
        if unknown:
            # An App of stream handlers alone has handlers all the same: say which, and that a
            # queue name does not choose them (it said 'Registered: none.').
            hint = f"Queue handlers: {', '.join(self.queues) or 'none'}"
            if self._stream_groups:
                hint += f"; stream handlers, chosen by no queue name: {', '.join(self._stream_groups)}"
            raise InvalidArgument(f"no handler for queue {', '.join(map(repr, unknown))}", hint=f"{hint}.")
        workers = []
        for name in names:
            handler, registered = self._handlers[name]
            options: WorkerOptions = {**registered, **overrides}
            workers.append(Worker(name, handler, **options))
        return workers

    def stream_workers(self) -> list[StreamWorker]:
        """A StreamWorker per registered stream handler."""
        return [make() for make in self._stream_workers]

    def run(
        self,
        dsn: str | None = None,
        *,
        pooler: PoolerMode | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
        loop: event_loop.LoopName | None = None,
        **overrides: Unpack[WorkerOptions],
    ) -> None:
        """Run every handler until SIGTERM or SIGINT (see serve, and Broker for ``pooler``,
        ``connect_timeout`` and ``pool_timeout``), on the event loop ``loop`` names: uvloop
        when it is installed ("auto", or $PGBROKER_LOOP), or "asyncio"'s own."""
        event_loop.run(
            serve(
                [*self.workers(**overrides), *self.stream_workers()],
                dsn=dsn,
                pooler=pooler,
                connect_timeout=connect_timeout,
                pool_timeout=pool_timeout,
            ),
            loop,
        )


async def serve(
    workers: Sequence[Worker | StreamWorker],
    *,
    dsn: str | None = None,
    broker: AsyncBroker | None = None,
    handle_signals: bool = True,
    progress_every: float | None = None,
    progress_out: TextIO | None = None,
    schedules: bool = True,
    pooler: PoolerMode | None = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    pool_timeout: float = DEFAULT_POOL_TIMEOUT,
    on_started: Callable[[], None] | None = None,
) -> None:
    """Run workers until they stop: by Worker.stop(), or by SIGTERM or SIGINT (see above) when
    ``handle_signals`` (it needs the main thread).

    With ``schedules`` (the default) a Scheduler runs beside them and sends the ticks of the
    cron schedules (pgbroker.schedules._scheduler); any number of processes may run one.

    Uses ``broker`` when given, else a pool of its own on ``dsn`` (resolved like Broker's), behind
    ``pooler``, with ``connect_timeout`` and ``pool_timeout`` (as Broker's): a server that cannot
    be reached fails at once with libpq's words.
    With ``progress_every``, prints each worker's counts and rate that often (to stderr).
    ``on_started`` is called once the pool is open and the workers run (a command's start line).
    Raises the error that stopped a worker (QueueNotFound, say) after stopping the others.
    """
    if not workers:
        raise InvalidArgument("no workers to run", hint="Register a handler, or pass a Worker.")
    mode = pooler_mode(pooler)
    async with AsyncExitStack() as stack:
        if broker is None:
            broker = await _own_broker(stack, dsn, workers, mode, PoolTimeouts(connect_timeout, pool_timeout))
        stopping = False
        scheduler = Scheduler() if schedules else None

        def on_signal(signum: int) -> None:
            nonlocal stopping
            hurry = stopping and signum == signal.SIGINT
            busy = sum(worker.in_flight for worker in workers)
            if busy and not stopping:
                # The wait can last the whole grace period: said at once, not only under -v.
                log_event(
                    logging.WARNING,
                    "worker.stopping",
                    in_flight=busy,
                    grace_period=max(worker.grace_period for worker in workers),
                    hint="waiting for the running handlers"
                    + ("; Ctrl-C again gives their messages back now" if signum == signal.SIGINT else ""),
                )
            if hurry or not stopping:
                for worker in workers:
                    worker.stop(grace_period=0 if hurry else None)
                if scheduler is not None:
                    scheduler.stop()
            stopping = True

        stack.enter_context(on_stop_signals(on_signal, enabled=handle_signals))
        # One watch for the pool, whatever its workers (a stream worker has none of its own).
        await stack.enter_async_context(WORKER_REFUSALS.watching(broker))
        if progress_every is not None:
            reporter = asyncio.create_task(_report(workers, progress_every, progress_out or sys.stderr))
            reporter.add_done_callback(on_bug("worker.progress_failed"))
            stack.callback(reporter.cancel)
        tasks = [
            asyncio.create_task(worker.run(broker), name=f"pgbroker-worker-{worker.queue}")
            for worker in workers
        ]
        if scheduler is not None:
            scheduling = asyncio.create_task(scheduler.run(broker), name="pgbroker-scheduler")
            scheduling.add_done_callback(on_bug("scheduler.failed", hint=_SCHEDULER_GONE))
            stack.push_async_callback(_stopped, scheduler, scheduling)
        if on_started is not None:
            on_started()
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = next((task for task in done if not task.cancelled() and task.exception()), None)
        if failed is not None:
            for worker in workers:
                worker.stop()
            await asyncio.wait(tasks)
            error = failed.exception()
            assert error is not None
            raise error


async def _stopped(scheduler: Scheduler, task: asyncio.Task[None]) -> None:
    scheduler.stop()
    await asyncio.gather(task, return_exceptions=True)


async def _own_broker(
    stack: AsyncExitStack,
    dsn: str | None,
    workers: Sequence[Worker | StreamWorker],
    pooler: PoolerMode,
    timeouts: PoolTimeouts,
) -> AsyncBroker:
    # Two connections a worker kept open, four at most (+ the scheduler's). No round trip checks a
    # connection on checkout: AsyncBroker passes over those the server has closed
    # (pgbroker._db.liveness), and a worker retries a call whose connection broke anyway.
    broker = AsyncBroker(
        dsn,
        min_connections=2 * len(workers),
        max_connections=4 * len(workers) + 1,
        connect_timeout=timeouts.connect,
        pool_timeout=timeouts.pool,
        pooler=pooler,
    )
    await broker.open()
    stack.push_async_callback(broker.close)
    return broker


async def _report(workers: Sequence[Worker | StreamWorker], every: float, out: TextIO) -> None:
    """A progress line per worker every ``every`` seconds: counts, and the rate since the last line."""
    last = {id(worker): (time.monotonic(), worker.stats.completed) for worker in workers}
    while True:
        await asyncio.sleep(every)
        for worker in workers:
            stats: WorkerStats = worker.stats
            then, completed = last[id(worker)]
            now = time.monotonic()
            rate = (stats.completed - completed) / (now - then)
            last[id(worker)] = (now, stats.completed)
            print(
                f"progress queue={worker.queue} completed={stats.completed} rate={rate:.1f}/s "
                f"retried={stats.retried} dead_lettered={stats.dead_lettered} stale={stats.stale} "
                f"in_flight={worker.in_flight}",
                file=out,
                flush=True,
            )


async def serve_scheduler(
    dsn: str | None = None,
    *,
    handle_signals: bool = True,
    pooler: PoolerMode | None = None,
    pool_timeout: float = DEFAULT_POOL_TIMEOUT,
    on_started: Callable[[], None] | None = None,
) -> None:
    """Run a scheduler on its own (``pgbroker scheduler``) until SIGTERM or SIGINT; raises what
    stopped it otherwise (NotInstalled, a role without the right): alone, it has nothing to do.
    ``on_started`` is called once its pool is open (a login refused before then raises)."""
    scheduler = Scheduler()
    scheduler_log = logging.getLogger("pgbroker.scheduler")
    refusals = RefusalWatch(scheduler_log, "scheduler.database_refused", "scheduler")
    async with AsyncBroker(dsn, max_connections=2, pooler=pooler, pool_timeout=pool_timeout) as broker:
        if on_started is not None:
            on_started()
        with on_stop_signals(lambda _: scheduler.stop(), enabled=handle_signals):
            async with refusals.watching(broker):
                await scheduler.run(broker)
    if scheduler.gave_up is not None:
        raise scheduler.gave_up
