"""Scenario (h): one pgbroker stream group against PgQ, W handlers, 1 ms a message, per-key order;
also ``python -m bench.stream_pgq [--quick] [--dsn DSN] ...`` (the options of ``python -m bench``,
this scenario only).

Both systems (bench.peers.keyed) run in their own database on the bench's server, their consumer
in a spawned process of its own: pgbroker's StreamWorker on a stream of 4 partitions, one group,
``concurrency=W``, batches of up to 1,000; PgQ's consumer loop with W handlers over each batch's
keys, ticked by ``pgqd`` (bench.peers.pgq_peer and .pgbroker_streams say how and why). A
producer in this process keeps ``stream_depth`` messages in flight (sent, not yet handled), up
to 500 a call, in runs of 4 messages a key, the keys round robin over 1,000; each payload carries
its key, its number within the key and its send time. Each handler notes its claim latency (send
to handler start), checks the key's order and awaits 1 ms.

A step is one W (1, 4, 16, 64 by default): ``stream_rounds`` rounds of ``stream_seconds`` each
(after a warm-up), the systems in alternating order from round to round and from one W to the
next; msg/s is the mean over the rounds, latencies are pooled. Beside them: the ceiling, W
handlers doing their 1 ms alone (no database) in a process of their own (bench.ceiling); and CPU
time per message (from /proc) of the consumer process and of the server (all the cluster's
processes, when the server runs on this machine: bench.cpu_clock). Then a fixed-rate step:
``stream_rate`` messages a second (10 a call) to W = 16, where the claim latency is the systems'
own delivery time rather than the wait behind ``stream_depth`` messages. Order violations: a
message of a key whose handler started while another of that key was running, or that was not the
key's next (a later one came first, or one came twice); the only right count is 0.

PgQ needs its extension on the server (Debian's ``postgresql-15-pgq3``: ``make pgq``); without it
(another PostgreSQL major, or not installed) the PgQ column stays empty and the result says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench.ceiling import ceiling
from bench.cpu_clock import postmaster_pid, process_cpu_seconds, server_cpu_seconds
from bench.harness import (
    Bench,
    Histogram,
    Row,
    ScenarioResult,
    _drop_database,
    _recreate_database,
    percentile_ms,
)
from bench.peers.keyed import KeyedPeer, keyed_peers
from bench.peers.runner import run_until, stop_processes
from pgbroker import _event_loop as event_loop

TITLE = "A stream group against PgQ: W handlers, 1 ms of work a message, order per key"
#: W handlers doing their 1 ms and nothing else, no database: what no consumer can beat
CEILING = "ceiling"
COLUMNS = ["PgQ", "pgbroker", CEILING]
RATIO = ("pgbroker", "PgQ")

#: seconds of synthetic work per message
WORK = 0.001
KEYS = 1_000
#: messages of one key sent one after the other before the next key's (so that a runtime that
#: ran them side by side, or out of order, would show in the order check)
RUN = 4
#: most messages a producer's call sends
SEND_BATCH = 500
#: handlers of the fixed-rate step
RATE_WORKERS = 16
_POLL = 0.005


# -- the consumer process --------------------------------------------------------------------------


def _child(key: str, dsn: str, queue: str, workers: int, shared: Any, halt: Any, out: str) -> None:
    """A consumer process: ``workers`` handlers of the system until ``halt``. ``shared`` counts the
    handler starts [0] and the order violations [1]; the claim latencies go to the file ``out`` as
    (handler start, seconds since the send) pairs, one a line."""
    peer = keyed_peers()[key]
    samples: list[tuple[float, float]] = []
    expected: dict[str, int] = {}
    running: set[str] = set()

    async def handle(payload: dict[str, Any]) -> None:
        now = time.time()
        shared[0] += 1
        name, number = str(payload["k"]), int(payload["s"])
        if name in running or number != expected.get(name, 0):
            shared[1] += 1
        expected[name] = number + 1
        running.add(name)
        samples.append((now, now - float(payload["t"])))
        try:
            await asyncio.sleep(WORK)
        finally:
            running.discard(name)

    def work(stop: asyncio.Event) -> Awaitable[None]:
        return peer.work(dsn, queue, handle, stop, workers)

    event_loop.run(run_until(lambda: bool(halt.value), work))
    Path(out).write_text("".join(f"{at} {latency}\n" for at, latency in samples))


class Consumer:
    """One system's consumer process on one stream (a context manager)."""

    def __init__(self, peer: KeyedPeer, dsn: str, queue: str, workers: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.shared = context.RawArray("q", 2)
        self._halt = context.Value("i", 0)
        self._dir = Path(tempfile.mkdtemp(prefix="pgbroker-bench-keyed-"))
        self._proc = context.Process(
            target=_child,
            args=(peer.key, dsn, queue, workers, self.shared, self._halt, str(self._dir / "out")),
        )
        self.samples: list[tuple[float, float]] = []

    def handled(self) -> int:
        return int(self.shared[0])

    def violations(self) -> int:
        return int(self.shared[1])

    def cpu_seconds(self) -> float | None:
        """The process's CPU time so far (user + system; None where /proc does not say)."""
        return None if self._proc.pid is None else process_cpu_seconds(self._proc.pid)

    def __enter__(self) -> Consumer:
        self._proc.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        stop_processes([self._proc], self._halt)
        out = self._dir / "out"
        if out.exists():
            for line in out.read_text().splitlines():
                at, latency = line.split()
                self.samples.append((float(at), float(latency)))
        shutil.rmtree(self._dir, ignore_errors=True)


# -- the producer ----------------------------------------------------------------------------------


class Producer:
    """Keyed messages, runs of RUN per key, the keys round robin over KEYS, each message numbered
    within its key."""

    def __init__(self, peer: KeyedPeer, dsn: str, queue: str) -> None:
        self._peer, self._dsn, self._queue = peer, dsn, queue
        self.sent = 0

    def _next(self, count: int) -> list[tuple[str, dict[str, Any]]]:
        now = time.time()
        events = []
        for n in range(self.sent, self.sent + count):
            run, within = divmod(n, RUN)
            key = f"k{run % KEYS}"
            events.append((key, {"k": key, "s": run // KEYS * RUN + within, "t": now}))
        self.sent += count
        return events

    async def keep_depth(self, consumer: Consumer, depth: int, seconds: float) -> None:
        """Keep ``depth`` messages sent and not yet handled, for ``seconds``."""
        deadline = time.monotonic() + seconds
        async with self._peer.sender(self._dsn, self._queue) as send:
            while time.monotonic() < deadline:
                missing = depth - (self.sent - consumer.handled())
                while missing > 0:
                    batch = min(SEND_BATCH, missing)
                    await send(self._next(batch))
                    missing -= batch
                await asyncio.sleep(_POLL)

    async def at_rate(self, rate: float, seconds: float, batch: int = 10) -> None:
        """Send ``rate`` messages a second, ``batch`` a call, for ``seconds``."""
        began = time.monotonic()
        async with self._peer.sender(self._dsn, self._queue) as send:
            for n in range(int(seconds * rate / batch)):
                pause = began + n * batch / rate - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
                await send(self._next(batch))

    async def send(self, count: int) -> None:
        async with self._peer.sender(self._dsn, self._queue) as send:
            await send(self._next(count))


# -- a step ----------------------------------------------------------------------------------------


@dataclass
class Measured:
    rate: float = 0.0
    latencies: list[float] = field(default_factory=list)
    violations: int = 0
    #: the consumer process's CPU time per message handled (µs)
    cpu_us: float | None = None
    #: the server's (every process of the cluster) CPU time per message handled (µs)
    server_cpu_us: float | None = None


def _per_message(before: float | None, after: float | None, messages: int) -> float | None:
    return None if before is None or after is None else (after - before) * 1e6 / max(messages, 1)


def one_round(
    peer: KeyedPeer,
    dsn: str,
    queue: str,
    *,
    workers: int,
    depth: int,
    rate: float | None,
    seconds: float,
) -> Measured:
    """One system, one stream: ``depth`` messages kept in flight, or ``rate`` a second when given."""
    asyncio.run(peer.create(dsn, queue))
    postmaster = postmaster_pid(dsn)
    producer = Producer(peer, dsn, queue)
    try:
        with Consumer(peer, dsn, queue, workers) as consumer:
            # A few messages first, handled before measuring: the consumer is up.
            asyncio.run(producer.send(4))
            deadline = time.monotonic() + 120
            while consumer.handled() < 4:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{peer.key}: the consumer did not start within 120 s")
                time.sleep(_POLL)
            if rate is None:
                asyncio.run(producer.keep_depth(consumer, depth, 0.5))  # in flight at the depth first
            start_count, began = consumer.handled(), time.time()
            cpu, server_cpu = consumer.cpu_seconds(), server_cpu_seconds(postmaster)
            if rate is None:
                asyncio.run(producer.keep_depth(consumer, depth, seconds))
            else:
                asyncio.run(producer.at_rate(rate, seconds))
            ended, cpu_end, count = time.time(), consumer.cpu_seconds(), consumer.handled()
            # The producer's backend has exited: its CPU shows once the postmaster has reaped it.
            time.sleep(0.2)
            server_end, server_count = server_cpu_seconds(postmaster), consumer.handled()
        handled = count - start_count
        return Measured(
            handled / (ended - began),
            [latency for at, latency in consumer.samples if began <= at <= ended],
            consumer.violations(),
            _per_message(cpu, cpu_end, handled),
            _per_message(server_cpu, server_end, server_count - start_count),
        )
    finally:
        with contextlib.suppress(psycopg.Error):
            asyncio.run(peer.drop(dsn, queue))


# -- the scenario ----------------------------------------------------------------------------------


def run(bench: Bench, result: ScenarioResult) -> None:
    from bench.peers.pgq_peer import PgQPeer, Ticker, unavailable

    config = bench.config
    systems = keyed_peers()
    result.columns = [*systems, CEILING]
    skipped = unavailable(bench.server.admin_dsn)
    if skipped:
        del systems[PgQPeer.key]
        result.warnings.append(f"PgQ not run: {skipped}")
        bench.progress.line(f"(h) PgQ not run: {skipped}")
    dsns: dict[str, str] = {}
    for key, peer in systems.items():
        with bench.progress.step(f"(h) setup: database {peer.database} ({key})"):
            _recreate_database(bench.server.admin_dsn, peer.database)
            dsns[key] = bench.server.dsn_for(peer.database)
            asyncio.run(peer.install(dsns[key]))
    ticker = Ticker(bench.server.admin_dsn, [PgQPeer.database]) if PgQPeer.key in systems else None
    try:
        with ticker or contextlib.nullcontext():
            for n, workers in enumerate(config.stream_workers):
                _step(bench, result, systems, dsns, workers, n, None)
            if config.stream_rate:
                _step(
                    bench, result, systems, dsns, RATE_WORKERS, len(config.stream_workers), config.stream_rate
                )
    finally:
        for peer in systems.values():
            with contextlib.suppress(psycopg.Error):
                _drop_database(bench.server.admin_dsn, peer.database)
    result.bar_metrics = ["msg/s", "claim p99 ms"]
    ticks = f"; PgQ ticked by {ticker.how}" if ticker else ""
    result.description = (
        f"Handlers do {WORK * 1000:g} ms of work a message (an asyncio sleep); claim latency is from the "
        f"send to the handler's start. A producer keeps {config.stream_depth:,} messages in flight "
        f"(up to {SEND_BATCH} a call, runs of {RUN} a key, {KEYS:,} keys round robin) for "
        f"{config.stream_rounds} round(s) of {config.stream_seconds:g} s per W, the systems in "
        f"alternating order; then {config.stream_rate:,} messages a second (10 a call) to "
        f"W={RATE_WORKERS}, as many rounds. "
        + "; ".join(f"{key}: {peer.describe()}" for key, peer in systems.items())
        + f"{ticks}. Order violations must be 0."
    )


def _step(
    bench: Bench,
    result: ScenarioResult,
    systems: dict[str, KeyedPeer],
    dsns: dict[str, str],
    workers: int,
    n: int,
    rate: int | None,
) -> None:
    config = bench.config
    step = f"W={workers}" if rate is None else f"{rate:,}/s sent, W={workers}"
    key_stem = f"w{workers}" if rate is None else f"rate-w{workers}"
    rounds: dict[str, list[Measured]] = {key: [] for key in systems}
    for r in range(max(1, config.stream_rounds)):
        order = list(systems) if (n + r) % 2 == 0 else list(reversed(systems))
        for key in order:
            with bench.progress.step(f"(h) {step}, round {r + 1}: {key}") as out:
                found = one_round(
                    systems[key],
                    dsns[key],
                    bench.new_queue_name(f"keyed_w{workers}"),
                    workers=workers,
                    depth=config.stream_depth,
                    rate=rate,
                    seconds=config.stream_seconds,
                )
                rounds[key].append(found)
                out.append(
                    f"{found.rate:,.0f} msg/s, claim p50 {percentile_ms(found.latencies, 50)} ms, "
                    f"CPU µs/msg: consumer {found.cpu_us or 0:.0f}, server {found.server_cpu_us or 0:.0f}; "
                    f"{found.violations} order violations"
                )
    measured = {
        key: Measured(
            sum(m.rate for m in ms) / len(ms),
            [x for m in ms for x in m.latencies],
            sum(m.violations for m in ms),
            _mean([m.cpu_us for m in ms]),
            _mean([m.server_cpu_us for m in ms]),
        )
        for key, ms in rounds.items()
    }
    rates: dict[str, float | None] = {k: m.rate for k, m in measured.items()}
    if rate is None:
        rates[CEILING] = ceiling(workers, WORK, min(config.stream_seconds, 2.0))
    result.rows.append(Row(step, "msg/s", rates, key=f"depth-w{workers}" if rate is None else key_stem))
    result.rows.extend(
        Row(
            step,
            f"claim p{q} ms",
            {k: percentile_ms(m.latencies, q) for k, m in measured.items()},
            key=f"{key_stem}-p{q}",
        )
        for q in (50, 95, 99)
    )
    result.rows.append(
        Row(step, "consumer CPU µs/msg", {k: m.cpu_us for k, m in measured.items()}, key=f"{key_stem}-cpu")
    )
    result.rows.append(
        Row(
            step,
            "server CPU µs/msg",
            {k: m.server_cpu_us for k, m in measured.items()},
            key=f"{key_stem}-server-cpu",
        )
    )
    result.rows.append(
        Row(
            step,
            "order violations",
            {k: float(m.violations) for k, m in measured.items()},
            key=f"{key_stem}-violations",
        )
    )
    result.histograms.extend(
        Histogram(f"claim latency, {step}", k, [x * 1000 for x in m.latencies]) for k, m in measured.items()
    )
    if any(m.violations for m in measured.values()):
        result.errors.append(
            f"order violations at {step}: { ({k: m.violations for k, m in measured.items()}) }"
        )


def _mean(values: list[float | None]) -> float | None:
    return (
        None if not values or any(v is None for v in values) else sum(v or 0.0 for v in values) / len(values)
    )


def main(argv: list[str] | None = None) -> int:
    from bench.__main__ import main as bench_main

    return bench_main(["--only", "h", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
