"""Scenario (g): a job queue under load, the shape of the usual independent comparisons of
Postgres queues; also ``python -m bench.job_queue [--quick] [--dsn DSN] ...`` (the options of
``python -m bench``, this scenario only).

Every system in bench.peers with the job shape (``Peer.work_jobs``: pgmq's consumer loop, W loops
each reading up to 64 and archiving the batch in one call; pgbroker's Worker with W handlers; and,
when installed, PgQueuer's QueueManager and Procrastinate's worker, see their modules) runs
in its own database, its workers in a process of their own. Each job's handler does 1 ms of
synthetic work (an asyncio sleep) and notes its claim latency: from the producer's send to the
handler's start (the payload carries the send time).

Steps: (1) a producer keeping ``job_depth`` jobs ready (topping the queue up as workers take
them), W = 1, 4, 16, 64 handlers: handled jobs a second, claim latency, and the CPU a job costs
the worker process and the server (bench.cpu_clock: a cost that holds on a loaded machine, where
rates do not); beside them the ceiling, W handlers of the same work with no queue at all; (2) a producer at a
fixed rate with W = 16 in two worker processes, in phases: baseline; an idle-in-transaction session
holding back xmin for the whole phase; two active REPEATABLE READ readers (long snapshots, one
after another); 1.5x the rate; and chaos: one of the two worker processes SIGKILLed halfway,
another started in its place (its leased jobs come back after the vt). After the chaos phase the
step waits for every job sent to be done (while the count falls: a backlog is worked through) and
reports the seconds that took, or the jobs still left. Systems alternate order from one W (or
phase series) to the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import multiprocessing
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.ceiling import ceiling
from bench.cpu_clock import postmaster_pid, server_cpu_seconds
from bench.harness import (
    Bench,
    Histogram,
    Row,
    ScenarioResult,
    _drop_database,
    alternating_rounds,
    percentile_ms,
)
from bench.peers import Peer, peers
from bench.peers.runner import run_until, stop_processes
from pgbroker import _event_loop as event_loop

TITLE = "Job queue under load: W handlers, 1 ms of work a job, claim latency, pressure and chaos"
#: the peers with a job runtime, when their libraries are installed (the bench extra)
_LIBRARIES = {"PgQueuer": "pgqueuer", "Procrastinate": "procrastinate"}
COLUMNS = ["pgmq", "pgbroker", *(key for key, lib in _LIBRARIES.items() if importlib.util.find_spec(lib))]
RATIO = ("pgbroker", "pgmq")
#: the column of the depth steps' ceiling: W handlers of WORK each with no queue at all
CEILING = "ceiling"
MORE_RATIOS = [("pgbroker", key) for key in COLUMNS if key in _LIBRARIES]
_PEER_SETTINGS = {
    "PgQueuer": " PgQueuer: QueueManager.run(max_concurrent_tasks=W, batch_size=W/2; W=1: the entrypoint's "
    "concurrency_limit=1), heartbeat_timeout and dequeue_timeout the vt.",
    "Procrastinate": " Procrastinate: run_worker_async(concurrency=W), heartbeats every vt/5, and a sweep "
    "each second retrying the jobs of workers silent for the vt (get_stalled_jobs, retry_job).",
}

#: seconds of synthetic work per job
WORK = 0.001
#: lease seconds (pgmq's read vt, the Worker's vt): what a killed worker's jobs wait to come back
VT = 5
#: handlers in the pressure phases (two processes of half as many)
PHASE_WORKERS = 16
_POLL = 0.005
#: after the chaos phase: seconds without progress after which the jobs left are reported, and
#: seconds of waiting at most (a system with a backlog works through it meanwhile)
STUCK = VT * 4 + 30
DRAIN_LIMIT = 180


# -- worker processes ------------------------------------------------------------------------------


def _child(key: str, dsn: str, queue: str, workers: int, slot: int, counts: Any, halt: Any, out: str) -> None:
    """A worker process: ``workers`` handlers of the peer until ``halt``; then its claim latencies
    as (handler start, seconds since the send) pairs, one a line, in the file ``out`` (a pipe
    would block a large list until the parent reads, and the parent joins first)."""
    peer = peers()[key]
    samples: list[tuple[float, float]] = []
    cpu: list[float] = []  # the process's CPU seconds at its first job, then the jobs since
    handled = 0

    async def handle(payload: dict[str, Any]) -> None:
        nonlocal handled
        now = time.time()
        if not cpu:
            cpu.append(time.process_time())
        handled += 1
        counts[slot] += 1
        sent = payload.get("t") if isinstance(payload, dict) else None
        if sent is not None:
            samples.append((now, now - sent))
        await asyncio.sleep(WORK)

    def work(stop: asyncio.Event) -> Awaitable[None]:
        return peer.work_jobs(dsn, queue, handle, stop, workers, VT)

    event_loop.run(run_until(lambda: bool(halt.value), work))
    Path(out).write_text("".join(f"{at} {latency}\n" for at, latency in samples))
    if cpu:  # the first job's own cost is not counted: it is the clock's start
        Path(f"{out}.cpu").write_text(f"{time.process_time() - cpu[0]} {handled - 1}\n")


class Pool:
    """Worker processes of one peer on one queue (a context manager); ``kill_one`` for chaos."""

    def __init__(self, peer: Peer, dsn: str, queue: str, *, processes: int, workers: int) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._args = (peer.key, dsn, queue, workers)
        self.counts = self._context.RawArray("q", processes + 1)  # a spare slot for a replacement
        self._halt = self._context.Value("i", 0)
        self._out = Path(tempfile.mkdtemp(prefix="pgbroker-bench-jobs-"))
        self._procs = [self._spawn(n) for n in range(processes)]
        self.samples: list[tuple[float, float]] = []
        #: CPU seconds the worker processes used from their first job on, and the jobs since
        self.cpu_seconds = 0.0
        self.cpu_jobs = 0

    def _spawn(self, slot: int) -> Any:
        return self._context.Process(
            target=_child, args=(*self._args, slot, self.counts, self._halt, str(self._out / str(slot)))
        )

    def handled(self) -> int:
        return sum(self.counts)

    def wait_for(self, count: int, limit: float) -> bool:
        deadline = time.monotonic() + limit
        while self.handled() < count:
            if time.monotonic() > deadline:
                return False
            time.sleep(_POLL)
        return True

    def kill_one(self) -> None:
        """SIGKILL the first worker process and start another in its place."""
        victim = self._procs.pop(0)
        victim.kill()
        victim.join()
        replacement = self._spawn(len(self.counts) - 1)
        replacement.start()
        self._procs.append(replacement)

    def __enter__(self) -> Pool:
        for proc in self._procs:
            proc.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        stop_processes(self._procs, self._halt)
        for path in self._out.iterdir():
            if path.suffix == ".cpu":
                seconds, jobs = path.read_text().split()
                self.cpu_seconds += float(seconds)
                self.cpu_jobs += int(jobs)
                continue
            for line in path.read_text().splitlines():
                at, latency = line.split()
                self.samples.append((float(at), float(latency)))
        shutil.rmtree(self._out, ignore_errors=True)


# -- producers and pressure ------------------------------------------------------------------------


async def _ready(conn: psycopg.AsyncConnection[Any], peer: Peer, queue: str) -> int:
    cursor = await conn.execute(peer.ready_jobs(queue))
    row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def keep_depth(peer: Peer, dsn: str, queue: str, depth: int, seconds: float) -> None:
    """Top the queue up to ``depth`` ready jobs for ``seconds``, up to 500 a call (100 a call capped
    both systems at about 6,000 jobs a second here: the producer must not be what is measured)."""
    deadline = time.monotonic() + seconds
    async with (
        peer.sender(dsn, queue) as send,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
    ):
        while time.monotonic() < deadline:
            missing = depth - await _ready(conn, peer, queue)
            while missing > 0:
                batch = min(500, missing)
                await send([{"t": time.time()} for _ in range(batch)])
                missing -= batch
            await asyncio.sleep(_POLL)


async def at_rate(peer: Peer, dsn: str, queue: str, rate: float, seconds: float, batch: int = 10) -> None:
    """Send ``rate`` jobs a second, ``batch`` a call, for ``seconds``."""
    began = time.monotonic()
    calls = int(seconds * rate / batch)
    async with peer.sender(dsn, queue) as send:
        for n in range(calls):
            pause = began + n * batch / rate - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            await send([{"t": time.time()} for _ in range(batch)])


@contextlib.contextmanager
def idle_in_transaction(dsn: str, table: sql.Composable) -> Iterator[None]:
    """A session that opened a transaction, took a snapshot (reading the jobs' ``table``) and went
    idle: xmin held back."""
    with psycopg.connect(dsn) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table))
        try:
            yield
        finally:
            conn.rollback()


@contextlib.contextmanager
def repeatable_read_readers(
    dsn: str, table: sql.Composable, readers: int = 2, span: float = 1.0
) -> Iterator[None]:
    """``readers`` sessions in REPEATABLE READ transactions of ``span`` seconds, one after another,
    each reading the jobs' ``table`` over and over."""
    done = threading.Event()

    def read() -> None:
        with psycopg.connect(dsn) as conn:
            while not done.is_set():
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                ends = time.monotonic() + span
                while time.monotonic() < ends and not done.is_set():
                    conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table))
                    time.sleep(0.02)
                conn.rollback()

    threads = [threading.Thread(target=read, daemon=True) for _ in range(readers)]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        done.set()
        for thread in threads:
            thread.join(30)


# -- the steps -------------------------------------------------------------------------------------


@dataclass
class Measured:
    rate: float = 0.0
    latencies: list[float] = field(default_factory=list)
    left: int | None = None
    #: CPU microseconds a job: the worker processes' and the server's (None: not measured)
    worker_cpu: float | None = None
    server_cpu: float | None = None
    #: seconds from the end of the chaos phase until no job was left (None: not done)
    drained: float | None = None


def _window(samples: list[tuple[float, float]], began: float, ended: float) -> list[float]:
    return [latency for at, latency in samples if began <= at <= ended]


def _warm_up(peer: Peer, dsn: str, queue: str, pool: Pool) -> None:
    """A job without a send time per process, handled before measuring: the workers are up."""
    asyncio.run(peer.enqueue(dsn, queue, [{"warm": 1}] * 4, 4))
    if not pool.wait_for(4, 120):
        raise RuntimeError(f"{peer.key}: the workers did not start within 120 s")


def depth_step(peer: Peer, dsn: str, queue: str, *, workers: int, depth: int, seconds: float) -> Measured:
    asyncio.run(peer.create(dsn, queue, False))
    postmaster = postmaster_pid(dsn)
    with Pool(peer, dsn, queue, processes=1, workers=workers) as pool:
        _warm_up(peer, dsn, queue, pool)
        asyncio.run(keep_depth(peer, dsn, queue, depth, 0.5))  # the queue at its depth first
        start_count, began, server_began = pool.handled(), time.time(), server_cpu_seconds(postmaster)
        asyncio.run(keep_depth(peer, dsn, queue, depth, seconds))
        jobs = pool.handled() - start_count
        rate = jobs / (time.time() - began)
        ended, server_ended = time.time(), server_cpu_seconds(postmaster)
    measured = Measured(rate, _window(pool.samples, began, ended))
    if pool.cpu_jobs:
        measured.worker_cpu = pool.cpu_seconds / pool.cpu_jobs * 1e6
    if server_began is not None and server_ended is not None and jobs:
        # The producer's sends count too: the same number of jobs sent the same way for every system.
        measured.server_cpu = (server_ended - server_began) / jobs * 1e6
    return measured


def phase_series(peer: Peer, dsn: str, queue: str, *, rate: float, seconds: float) -> dict[str, Measured]:
    """The fixed-rate phases on one queue, two worker processes of PHASE_WORKERS / 2 handlers."""
    asyncio.run(peer.create(dsn, queue, False))
    found: dict[str, tuple[float, float, float]] = {}
    with Pool(peer, dsn, queue, processes=2, workers=PHASE_WORKERS // 2) as pool:
        _warm_up(peer, dsn, queue, pool)
        for name, pressure, factor in (
            ("baseline", contextlib.nullcontext(), 1.0),
            ("idle-in-transaction", idle_in_transaction(dsn, peer.job_table(queue)), 1.0),
            ("repeatable-read-readers", repeatable_read_readers(dsn, peer.job_table(queue)), 1.0),
            ("load-1.5x", contextlib.nullcontext(), 1.5),
        ):
            with pressure:
                began, count = time.time(), pool.handled()
                asyncio.run(at_rate(peer, dsn, queue, rate * factor, seconds))
                found[name] = (began, time.time(), (pool.handled() - count) / (time.time() - began))
        began, count = time.time(), pool.handled()

        async def chaos() -> None:
            producing = asyncio.create_task(at_rate(peer, dsn, queue, rate, seconds))
            await asyncio.sleep(seconds / 2)
            await asyncio.to_thread(pool.kill_one)
            await producing

        asyncio.run(chaos())
        found["chaos"] = (began, time.time(), (pool.handled() - count) / (time.time() - began))
        left, drained = _wait_until_done(peer, dsn, queue)
    measured = {
        name: Measured(rate, _window(pool.samples, began, ended))
        for name, (began, ended, rate) in found.items()
    }
    measured["chaos"].left = left
    measured["chaos"].drained = drained
    return measured


def _wait_until_done(peer: Peer, dsn: str, queue: str) -> tuple[int, float | None]:
    """Wait for every job sent to be done (handled and acknowledged; the killed worker's come back
    after their lease). A system still working through a backlog is waited for while its count
    falls, DRAIN_LIMIT seconds at most; one whose count stays put for STUCK seconds keeps jobs it
    will not give back by itself. Jobs left, and the seconds it took (None: not done)."""
    began = last_progress = time.monotonic()
    left = asyncio.run(peer.remaining(dsn, queue))
    while left and time.monotonic() - last_progress < STUCK and time.monotonic() - began < DRAIN_LIMIT:
        time.sleep(0.2)
        now_left = asyncio.run(peer.remaining(dsn, queue))
        if now_left < left:
            last_progress = time.monotonic()
        left = now_left
    return left, None if left else time.monotonic() - began


# -- the scenario ----------------------------------------------------------------------------------


def run(bench: Bench, result: ScenarioResult) -> None:
    from bench.peer_table import databases

    systems = {key: peer for key, peer in peers().items() if key in COLUMNS}
    result.columns = [*systems, CEILING]
    result.more_ratios = [*result.more_ratios, ("pgbroker", CEILING)]
    config = bench.config
    dsns = databases(bench, systems)
    try:
        _depth_sweep(bench, result, systems, dsns)
        _phases(bench, result, systems, dsns)
    finally:
        for peer in systems.values():
            with contextlib.suppress(psycopg.Error):
                _drop_database(bench.server.admin_dsn, peer.database)
    result.bar_metrics = ["msg/s", "claim p99 ms"]
    result.description = (
        f"Handlers do {WORK * 1000:g} ms of work a job (an asyncio sleep); claim latency is from the "
        f"send to the handler's start. Depth steps keep {config.job_depth:,} jobs ready for "
        f"{config.job_seconds:g} s; phases send {config.job_rate:,} jobs a second (10 a call) for "
        f"{config.job_seconds:g} s each with {PHASE_WORKERS} handlers in two processes; vt {VT} s. "
        "pgmq: W loops, each reading up to 64 and archiving the batch in one call; pgbroker: "
        "Worker(concurrency=W), the queue's defaults (acks archive). The ceiling: W handlers of the "
        "same work in a process of their own with no queue, what no system can exceed at that W. "
        "CPU per job: the worker process's from its first job on, and the whole server's (all its "
        "processes, the producer's sends included) over the step."
        + "".join(_PEER_SETTINGS[key] for key in systems if key in _PEER_SETTINGS)
    )


def _latency_rows(step: str, key: str, measured: dict[str, Measured]) -> list[Row]:
    return [
        Row(
            step,
            f"claim p{q} ms",
            {k: percentile_ms(m.latencies, q) for k, m in measured.items()},
            key=f"{key}-p{q}",
        )
        for q in (50, 95, 99)
    ]


def _depth_sweep(
    bench: Bench, result: ScenarioResult, systems: dict[str, Peer], dsns: dict[str, str]
) -> None:
    config = bench.config
    for n, workers in enumerate(config.job_workers):
        measured: dict[str, Measured] = {}
        order = [key for _, key in alternating_rounds(list(systems), n + 1)][-len(systems) :]
        for key in order:
            with bench.progress.step(f"(g) depth {config.job_depth:,}, W={workers}: {key}") as out:
                measured[key] = depth_step(
                    systems[key],
                    dsns[key],
                    bench.new_queue_name(f"jobs_w{workers}"),
                    workers=workers,
                    depth=config.job_depth,
                    seconds=config.job_seconds,
                )
                p50 = percentile_ms(measured[key].latencies, 50)
                out.append(f"{measured[key].rate:,.0f} msg/s, claim p50 {p50} ms")
        with bench.progress.step(f"(g) W={workers}: the ceiling, no queue") as out:
            limit = ceiling(workers, WORK, config.job_seconds)
            out.append(f"{limit:,.0f} jobs/s")
        step = f"depth {config.job_depth:,}, W={workers}"
        rates: dict[str, float | None] = {k: m.rate for k, m in measured.items()}
        result.rows.append(Row(step, "msg/s", {**rates, CEILING: limit}, key=f"depth-w{workers}"))
        result.rows.extend(_latency_rows(step, f"depth-w{workers}", measured))
        for metric, cost in (("worker CPU us/job", "worker_cpu"), ("server CPU us/job", "server_cpu")):
            values = {k: getattr(m, cost) for k, m in measured.items()}
            result.rows.append(Row(step, metric, values, key=f"depth-w{workers}-{cost}"))
        result.histograms.extend(
            Histogram(f"claim latency, W={workers}", k, [x * 1000 for x in m.latencies])
            for k, m in measured.items()
        )


def _phases(bench: Bench, result: ScenarioResult, systems: dict[str, Peer], dsns: dict[str, str]) -> None:
    config = bench.config
    series: dict[str, dict[str, Measured]] = {}
    for key in reversed(list(systems)):
        with bench.progress.step(f"(g) phases at {config.job_rate:,}/s, W={PHASE_WORKERS}: {key}") as out:
            series[key] = phase_series(
                systems[key],
                dsns[key],
                bench.new_queue_name("jobs_phases"),
                rate=config.job_rate,
                seconds=config.job_seconds,
            )
            out.append(", ".join(f"{name} {m.rate:,.0f}/s" for name, m in series[key].items()))
    for name in next(iter(series.values())):
        measured = {key: found[name] for key, found in series.items()}
        step = (
            f"{name}, {config.job_rate * (1.5 if name == 'load-1.5x' else 1):,.0f}/s sent, W={PHASE_WORKERS}"
        )
        result.rows.append(Row(step, "msg/s", {k: m.rate for k, m in measured.items()}, key=f"phase-{name}"))
        result.rows.extend(_latency_rows(step, f"phase-{name}", measured))
    left = {key: found["chaos"].left for key, found in series.items()}
    step = f"after chaos (until done, {DRAIN_LIMIT} s at most, {STUCK} s without progress)"
    not_done = {k: None if v is None else float(v) for k, v in left.items()}
    result.rows.append(Row(step, "jobs not done", not_done, key="chaos-left"))
    drained = {k: found["chaos"].drained for k, found in series.items()}
    result.rows.append(Row(step, "s until done", drained, key="chaos-drain"))
    if any(left.values()):
        result.warnings.append(f"jobs not done after the chaos phase: {left}")


def main(argv: list[str] | None = None) -> int:
    from bench.__main__ import main as bench_main

    return bench_main(["--only", "g", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
