"""Timing a peer: enqueue rates, drains by worker processes, a steady flow, idle latency.

Workers run in processes of their own (spawned: a fresh interpreter, as a deployed worker is), so
that "one worker process" means what it says and the harness's own work never shares their event
loop. Their handler only counts (shared memory, no lock: one slot per process) and, where the
payload carries its send time ``t``, notes the latency from the send call's start to the handler's
start. A drain's rate runs from the first handler call to the moment the system reports no job
left (handled and acknowledged), so a system that defers its acks pays for them.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.sharedctypes import Synchronized
from typing import Any, TypeVar

from bench.peers import Peer, peers
from pgbroker import _event_loop as event_loop

#: seconds a drain may take before it is cut short (its rate then counts what was handled)
DRAIN_LIMIT = 180.0
_POLL = 0.005

T = TypeVar("T")


@dataclass
class Drained:
    rate: float
    handled: int
    complete: bool


@dataclass
class Flow:
    """A steady or idle run: handler-start latencies (seconds) and the handled rate."""

    latencies: list[float] = field(default_factory=list)
    rate: float = 0.0
    sent: int = 0
    handled: int = 0


async def run_until(done: Callable[[], bool], work: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``work(stop)`` in a worker process, ``stop`` set once ``done()`` holds (a flag the
    parent sets, a count reached), looked at every few milliseconds."""
    stop = asyncio.Event()

    async def watch() -> None:
        while not done():
            await asyncio.sleep(_POLL)
        stop.set()

    watcher = asyncio.create_task(watch())
    await work(stop)
    await watcher


def stop_processes(procs: Sequence[Any], halt: Any) -> None:
    """Tell the worker processes to stop (``halt``), give them a minute, then kill what is left."""
    halt.value = 1
    for proc in procs:
        proc.join(60)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()


def _child(
    key: str,
    dsn: str,
    queue: str,
    tuned: bool,
    slot: int,
    counts: Any,
    firsts: Any,
    target: int,
    halt: Synchronized[int],
    out: Any,
) -> None:
    """A worker process: run the peer's worker until ``target`` jobs are handled in all (0: until
    ``halt``), then report this process's latencies."""
    peer = peers()[key]
    samples: list[float] = []

    def handle(payload: dict[str, Any]) -> None:
        now = time.time()
        if not firsts[slot]:
            firsts[slot] = now
        counts[slot] += 1
        sent = payload.get("t") if isinstance(payload, dict) else None
        if sent is not None:
            samples.append(now - sent)

    def done() -> bool:
        return bool(halt.value) or bool(target and sum(counts) >= target)

    event_loop.run(run_until(done, lambda stop: peer.work(dsn, queue, handle, stop, tuned)))
    out.put(samples)


class Workers:
    """``processes`` worker processes of one peer on one queue; a context manager."""

    def __init__(self, peer: Peer, dsn: str, queue: str, *, tuned: bool, processes: int, target: int = 0):
        self._context = multiprocessing.get_context("spawn")
        self.counts = self._context.RawArray("q", processes)
        self.firsts = self._context.RawArray("d", processes)
        self._halt = self._context.Value("i", 0)
        self._out = self._context.SimpleQueue()
        shared = (self.counts, self.firsts, target, self._halt, self._out)
        self._procs = [
            self._context.Process(target=_child, args=(peer.key, dsn, queue, tuned, n, *shared))
            for n in range(processes)
        ]
        self.latencies: list[float] = []

    def handled(self) -> int:
        return sum(self.counts)

    def first(self) -> float:
        return min((t for t in self.firsts if t), default=0.0)

    def wait_for(self, ready: Callable[[], bool], limit: float) -> bool:
        deadline = time.monotonic() + limit
        while not ready():
            if time.monotonic() > deadline or not any(p.is_alive() for p in self._procs):
                return ready()
            time.sleep(_POLL)
        return True

    def __enter__(self) -> Workers:
        for proc in self._procs:
            proc.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        stop_processes(self._procs, self._halt)
        for proc in self._procs:
            if proc.exitcode == 0:  # not killed: it reported its latencies
                self.latencies.extend(self._out.get())


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def enqueue_rate(peer: Peer, dsn: str, queue: str, count: int, batch: int) -> float:
    """msg/s of one producer enqueueing ``count`` jobs ``batch`` at a time."""
    _run(peer.create(dsn, queue, False))
    seconds = _run(peer.enqueue(dsn, queue, [{"i": i} for i in range(count)], batch))
    return count / seconds


def _no_job_left(peer: Peer, dsn: str, queue: str) -> bool:
    return _run(peer.remaining(dsn, queue)) == 0


def drain(peer: Peer, dsn: str, queue: str, count: int, *, tuned: bool, processes: int) -> Drained:
    """Enqueue ``count`` jobs, then time ``processes`` worker processes draining them."""
    _run(peer.create(dsn, queue, tuned))
    _run(peer.enqueue(dsn, queue, [{"i": i} for i in range(count)], 1000))
    with Workers(peer, dsn, queue, tuned=tuned, processes=processes, target=count) as workers:
        handled = workers.wait_for(lambda: workers.handled() >= count, DRAIN_LIMIT)
        done = handled and workers.wait_for(partial(_no_job_left, peer, dsn, queue), 30)
        ended = time.time()
        began = workers.first()
        finished = workers.handled()
    if not began or ended <= began:
        return Drained(0.0, finished, False)
    return Drained(finished / (ended - began), finished, done)


def steady(peer: Peer, dsn: str, queue: str, *, rate: int, seconds: float, batch: int = 10) -> Flow:
    """A producer enqueueing ``rate`` jobs a second (``batch`` a call) while one worker handles."""
    _run(peer.create(dsn, queue, True))
    flow = Flow()
    with Workers(peer, dsn, queue, tuned=True, processes=1) as workers:
        _warm_up(peer, dsn, queue, workers)
        began = time.monotonic()
        calls = int(seconds * rate / batch)

        async def produce() -> None:
            async with peer.sender(dsn, queue) as send:
                for n in range(calls):
                    pause = began + n * batch / rate - time.monotonic()
                    if pause > 0:
                        await asyncio.sleep(pause)
                    await send([{"t": time.time()} for _ in range(batch)])

        _run(produce())
        flow.sent = calls * batch
        # A worker that cannot keep up is not waited for long: its rate says so.
        workers.wait_for(lambda: workers.handled() >= flow.sent + 1, 10)
        flow.handled = workers.handled() - 1
        flow.rate = flow.handled / (time.monotonic() - began)
    flow.latencies = workers.latencies
    return flow


def idle_latency(peer: Peer, dsn: str, queue: str, *, samples: int, gap: float) -> Flow:
    """One job every ``gap`` seconds to a worker that sleeps between them."""
    _run(peer.create(dsn, queue, True))
    flow = Flow()
    with Workers(peer, dsn, queue, tuned=True, processes=1) as workers:
        _warm_up(peer, dsn, queue, workers)

        async def produce() -> None:
            async with peer.sender(dsn, queue) as send:
                for n in range(samples):
                    await asyncio.sleep(gap)
                    await send([{"t": time.time()}])
                    deadline = time.monotonic() + 10
                    while workers.handled() < n + 2 and time.monotonic() < deadline:
                        await asyncio.sleep(_POLL)

        _run(produce())
        flow.sent = samples
        flow.handled = workers.handled() - 1
    flow.latencies = workers.latencies
    return flow


def _warm_up(peer: Peer, dsn: str, queue: str, workers: Workers) -> None:
    """One job without a send time, handled before measuring: the worker is up and listening."""
    _run(peer.enqueue(dsn, queue, [{"warm": 1}], 1))
    if not workers.wait_for(lambda: workers.handled() >= 1, 60):
        raise RuntimeError(f"{peer.key}: the worker did not start within 60 s")
    time.sleep(0.5)  # and back asleep
