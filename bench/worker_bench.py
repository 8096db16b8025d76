"""Benchmark of the worker runtime: send -> handler latency on an idle queue, and throughput.

Latency: a Worker sleeps on an empty queue (notify enabled with the default 250 ms throttle);
a message is sent every --gap seconds, longer than the throttle, so that each send finds the
worker asleep. It runs from the start of the send call (its commit included) to the start of
the handler: the NOTIFY, the wake-up, the read and the dispatch.

Throughput: --messages messages are sent first, then workers drain the queue with a no-op
handler (the runtime's own cost: reads, acks by policy, dispatch); msg/s is counted from the
workers' start to the last ack. One process per configuration, and one with --processes
worker processes side by side.

    python -m bench.worker_bench [--dsn DSN] [--sends 50] [--messages 20000] [--processes 2]

Without --dsn the DSN comes from DATABASE_URL, else the embedded cluster is used. pgbroker is
installed if it is not; the benchmark's queues are dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.queues import SimpleQueue

from bench.notify_latency import settings
from pgbroker import Broker, Message, Worker
from pgbroker._db.dsn import resolve_dsn
from pgbroker.runtime._app import serve

TARGET_MEDIAN_MS = 20.0


# -- latency --------------------------------------------------------------------------------------


def latency(dsn: str, queue_name: str, sends: int, gap: float) -> list[float]:
    """Seconds from each send call's start to its handler's start."""
    with Broker(dsn, max_connections=1) as broker:
        queue = broker.create_queue(queue_name)
        sent_at: dict[int, float] = {}
        seen: list[float] = []
        handled = threading.Semaphore(0)

        async def handle(message: Message) -> None:
            seen.append(time.monotonic() - sent_at[message.message["i"]])
            handled.release()

        worker = Worker(queue_name, handle, concurrency=1)

        def send_all() -> None:
            time.sleep(1.0)  # the worker is up and asleep
            for i in range(sends):
                time.sleep(gap)
                sent_at[i] = time.monotonic()
                queue.send({"i": i})
                handled.acquire()
            worker.stop()

        async def run() -> None:
            sender = asyncio.create_task(asyncio.to_thread(send_all))
            await serve([worker], dsn=dsn, handle_signals=False)
            await sender

        asyncio.run(run())
        return seen


# -- throughput -----------------------------------------------------------------------------------


def _noop(message: Message) -> None:
    pass


async def _async_noop(message: Message) -> None:
    pass


@dataclass(frozen=True)
class Setup:
    name: str
    handler: Callable[[Message], object]
    concurrency: int
    processes: int = 1


def _drain(
    dsn: str, setup: Setup, queue_name: str, until: Callable[[Worker], bool]
) -> tuple[float, float, int]:
    """Run one worker until until(worker) holds: (first ack, last ack, acks), times from time.time()."""
    worker = Worker(queue_name, setup.handler, concurrency=setup.concurrency, notify=False)
    span: list[float] = []

    async def run() -> None:
        async def watch() -> None:
            while not until(worker):
                if not span and worker.stats.completed:
                    span.append(time.time())
                await asyncio.sleep(0.005)
            span.append(time.time())
            worker.stop()

        watcher = asyncio.create_task(watch())
        await serve([worker], dsn=dsn, handle_signals=False)
        await watcher

    asyncio.run(run())
    return span[0], span[-1], worker.stats.completed


def _drain_process(
    dsn: str, setup: Setup, queue_name: str, results: SimpleQueue[tuple[float, float, int]]
) -> None:
    """One of several worker processes: it stops once the queue is empty."""
    with Broker(dsn, max_connections=1) as broker:
        queue = broker.queue(queue_name)
        empty = threading.Event()

        def watch_queue() -> None:
            while queue.metrics().queue_length:
                time.sleep(0.02)
            empty.set()

        threading.Thread(target=watch_queue, daemon=True).start()
        results.put(_drain(dsn, setup, queue_name, lambda worker: empty.is_set()))


def throughput(dsn: str, queue_name: str, setup: Setup, messages: int) -> float:
    """msg/s for the setup to drain ``messages`` messages, from the first ack to the last.

    (Not from the start: a worker process takes a second or more to import and connect.)
    """
    with Broker(dsn, max_connections=1) as broker:
        queue = broker.create_queue(queue_name)
        for first in range(0, messages, 1000):
            queue.send_many([{"i": i} for i in range(first, min(messages, first + 1000))])
        if setup.processes == 1:
            spans = [_drain(dsn, setup, queue_name, lambda worker: worker.stats.completed >= messages)]
        else:
            context = multiprocessing.get_context("spawn")
            results: SimpleQueue[tuple[float, float, int]] = context.SimpleQueue()
            processes = [
                context.Process(target=_drain_process, args=(dsn, setup, queue_name, results))
                for _ in range(setup.processes)
            ]
            for process in processes:
                process.start()
            for process in processes:
                process.join()
            spans = [results.get() for _ in processes]
        assert queue.metrics().queue_length == 0
        assert sum(acks for _, _, acks in spans) == messages
        broker.drop_queue(queue_name)
        return messages / (max(last for _, last, _ in spans) - min(first for first, _, _ in spans))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--dsn", help="server to use (default: DATABASE_URL, else the embedded cluster)")
    parser.add_argument("--sends", type=int, default=50, help="latency samples (default 50)")
    parser.add_argument("--gap", type=float, default=0.3, help="seconds between sends (default 0.3)")
    parser.add_argument("--messages", type=int, default=20_000, help="messages per throughput run (20000)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes of the last run (2)")
    args = parser.parse_args(argv)
    dsn = resolve_dsn(args.dsn)
    with Broker(dsn, max_connections=1) as broker:
        broker.install()
    prefix = f"bench_worker_{uuid.uuid4().hex[:8]}"
    print(settings(dsn))

    samples = sorted(x * 1000 for x in latency(dsn, f"{prefix}_latency", args.sends, args.gap))
    with Broker(dsn, max_connections=1) as broker:
        broker.drop_queue(f"{prefix}_latency")
    p95 = samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]
    median = statistics.median(samples)
    print(f"\nsend -> handler latency on an idle queue ({len(samples)} sends, {args.gap} s apart)")
    print(f"{'median_ms':>10}{'p95_ms':>9}{'min_ms':>9}{'max_ms':>9}")
    print(f"{median:>10.2f}{p95:>9.2f}{samples[0]:>9.2f}{samples[-1]:>9.2f}")
    print(f"target median < {TARGET_MEDIAN_MS:.0f} ms: {'met' if median < TARGET_MEDIAN_MS else 'MISSED'}")

    setups = [
        Setup("async no-op", _async_noop, 8),
        Setup("async no-op", _async_noop, 32),
        Setup("sync no-op (threads)", _noop, 32),
        Setup("async no-op", _async_noop, 32, processes=args.processes),
    ]
    print(f"\nworker throughput, {args.messages:,} messages drained per run")
    print(f"{'handler':<22}{'concurrency':>12}{'processes':>10}{'msg/s':>10}")
    for n, setup in enumerate(setups):
        rate = throughput(dsn, f"{prefix}_{n}", setup, args.messages)
        print(f"{setup.name:<22}{setup.concurrency:>12}{setup.processes:>10}{rate:>10,.0f}", flush=True)


if __name__ == "__main__":
    main()
