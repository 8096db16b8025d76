"""The memory of pgbroker's long-running processes over a long run: does it stay flat?

    python -m bench.memory_soak [--dsn DSN] [--phases 12] [--messages 40000] [--requests 3000]
    python -m bench.memory_soak --quick

Four processes run as an operator runs them (the real CLI, each a process of its own, on one
database): ``pgbroker worker`` on a queue, ``pgbroker worker`` on a stream group (an App),
``pgbroker serve``, and ``pgbroker bridge out`` from a queue to Redis Streams (a private
redis-server the bench starts on a free loopback port, tests/support/servers.py). Each phase
sends ``--messages`` messages to the worker's queue, as many to the stream (every stream message
under a key never used before, so that anything kept per key shows) and as many to the bridge's
queue, and makes ``--requests`` HTTP requests through serve: sends (each with an Idempotency-Key
never used before), reads and acks of 10, a /metrics scrape now and then, spread over three API
keys. The bench empties the Redis stream after each phase.
Once every message is handled, the resident set size (VmRSS) of each process is read from /proc.

The first ``--warm-up`` phases fill caches, pools and the allocator's arenas. After them a
process that keeps nothing per message stays flat; one that leaks grows with the work. The
result is the growth after the warm-up, fitted by least squares, in MB per million messages
(per million requests for serve), and a plot of RSS against the work done
(bench/results/memory-<timestamp>.png, beside its JSON).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import redis
from tests.http.live import pgbroker_serve
from tests.support.processes import stop_gracefully
from tests.support.servers import private_server

from bench.harness import Progress, Server, _drop_database, _recreate_database
from bench.memory_soak_handlers import GROUP, STREAM
from pgbroker import Broker, Stream
from pgbroker._db.api_keys import create_key

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "pgbroker_bench_memory"
QUEUE = "soak"
HTTP_QUEUE = "soak_http"
BRIDGE_QUEUE = "soak_bridge"
SEND_BATCH = 500
#: about the size of a small event: a few fields and some text
PAYLOAD_TEXT = "x" * 160
HTTP_CLIENTS = 3  # one API key each
#: MB per million messages (or requests) past which the growth after the warm-up reads as a leak
LEAK_MB_PER_MILLION = 20.0


# -- the processes and their memory ------------------------------------------------------------------


def resident_mb(pid: int) -> float:
    """The process's resident set size in MB (VmRSS of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@dataclass
class Watched:
    """One long-running process: its RSS after each phase, against the work done by then."""

    name: str
    unit: str  # what the work is counted in
    pid: int
    work: list[int] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)

    def sample(self, done: int) -> None:
        self.work.append(done)
        self.rss_mb.append(resident_mb(self.pid))

    def growth_per_million(self, warm_up: int) -> float | None:
        """The least-squares slope of RSS against the work after the warm-up, MB per million."""
        xs, ys = self.work[warm_up:], self.rss_mb[warm_up:]
        if len(xs) < 2 or xs[-1] == xs[0]:
            return None
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
        slope /= sum((x - mean_x) ** 2 for x in xs)
        return slope * 1_000_000


@contextmanager
def cli_process(dsn: str, log: Path, *argv: str) -> Iterator[subprocess.Popen[bytes]]:
    """``pgbroker --dsn DSN ARGV`` in a process of its own, stopped with SIGTERM at the end."""
    paths = [str(ROOT), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "pgbroker.cli", "--dsn", dsn, *argv], env=env, stdout=out, stderr=out
        )
    try:
        yield process
    finally:
        stop_gracefully(process, 30)


# -- the traffic --------------------------------------------------------------------------------------


def _payloads(start: int, count: int) -> list[dict[str, Any]]:
    return [{"n": n, "text": PAYLOAD_TEXT} for n in range(start, start + count)]


def send_messages(broker: Broker, start: int, count: int) -> None:
    """``count`` messages to each queue and as many to the stream, each under a key of its own."""
    queues, stream = [broker.queue(QUEUE), broker.queue(BRIDGE_QUEUE)], Stream(broker, STREAM)
    for first in range(start, start + count, SEND_BATCH):
        batch = _payloads(first, min(SEND_BATCH, start + count - first))
        for queue in queues:
            queue.send_many(batch)
        stream.send_many(batch, keys=[f"key-{p['n']}" for p in batch])


def backlog(broker: Broker) -> int:
    """Messages of the queues and of the stream's group not yet handled (or published)."""
    queued = sum(broker.metrics(name).queue_length for name in (QUEUE, BRIDGE_QUEUE))
    return queued + sum(partition.lag for partition in Stream(broker, STREAM).lag())


def empty_redis_stream(port: int) -> None:
    with redis.Redis(host="127.0.0.1", port=port) as client:
        client.xtrim(BRIDGE_QUEUE, maxlen=0)


def http_traffic(url: str, token: str, requests: int, numbers: Iterator[int]) -> None:
    """``requests`` requests through serve with one key: sends, reads with their acks, scrapes."""
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=60) as http:
        made = 0
        while made < requests:
            n = next(numbers)
            sent = http.post(
                f"/v1/queues/{HTTP_QUEUE}/messages",
                json={"message": {"n": n, "text": PAYLOAD_TEXT}},
                headers={"Idempotency-Key": f"soak-{n}"},
            )
            sent.raise_for_status()
            read = http.post(f"/v1/queues/{HTTP_QUEUE}/read", json={"qty": 10, "vt": 30})
            read.raise_for_status()
            made += 2
            if receipts := [m["receipt"] for m in read.json()["messages"]]:
                http.post(f"/v1/queues/{HTTP_QUEUE}/ack", json={"receipts": receipts}).raise_for_status()
                made += 1
            if n % 50 == 0:
                http.get("/metrics").raise_for_status()
                made += 1


def in_threads(targets: Sequence[Callable[[], None]]) -> None:
    """Run the targets side by side; the first failure is raised."""
    failures: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:  # handed to the caller
            failures.append(exc)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def wait_until_handled(broker: Broker, processes: list[subprocess.Popen[bytes]], logs: Path) -> None:
    """Wait for the backlog to empty, however long the machine takes, while the workers live."""
    while backlog(broker):
        if any(p.poll() is not None for p in processes):
            raise RuntimeError(f"a worker or the bridge exited; the logs are under {logs}")
        time.sleep(0.2)


# -- the run -----------------------------------------------------------------------------------------


def prepare(dsn: str) -> list[str]:
    """Install, make the queues and the stream, and the three API keys; returns their tokens."""
    with Broker(dsn, max_connections=1) as broker:
        broker.install()
        broker.create_queue(QUEUE)
        broker.create_queue(HTTP_QUEUE)
        broker.create_queue(BRIDGE_QUEUE)
        stream = Stream(broker, STREAM)
        stream.create(partitions=4)
        stream.create_group(GROUP, start="start")
        with broker.connection() as conn:
            return [
                create_key(conn, f"soak-{i}", scopes=["send", "read"], queues=[HTTP_QUEUE])[1]
                for i in range(HTTP_CLIENTS)
            ]


def run(dsn: str, args: argparse.Namespace, progress: Progress) -> list[Watched]:
    tokens = prepare(dsn)
    logs = Path(tempfile.mkdtemp(prefix="pgbroker-bench-memory-"))
    with ExitStack() as stack, Broker(dsn, max_connections=2) as broker:
        worker = stack.enter_context(
            cli_process(
                dsn,
                logs / "worker.log",
                "worker",
                "--queue",
                QUEUE,
                "--concurrency",
                "16",
                "bench.memory_soak_handlers:queue_handler",
            )
        )
        streams = stack.enter_context(
            cli_process(dsn, logs / "stream-worker.log", "worker", "bench.memory_soak_handlers:stream_app")
        )
        # The server's per-key rate limit (100 a second) is not what this measures: lifted.
        serve = stack.enter_context(
            pgbroker_serve(dsn, "--connections", "4", "--rate", "100000", "--burst", "100000")
        )
        redis_server = stack.enter_context(private_server("redis"))
        bridge = stack.enter_context(
            cli_process(
                dsn,
                logs / "bridge.log",
                "bridge",
                "out",
                "--queue",
                BRIDGE_QUEUE,
                "--to",
                f"redis://127.0.0.1:{redis_server.port}?stream={BRIDGE_QUEUE}",
            )
        )
        watched = [
            Watched("pgbroker worker (queue)", "messages", worker.pid),
            Watched("pgbroker worker (stream group)", "messages", streams.pid),
            Watched("pgbroker serve", "requests", serve.process.pid),
            Watched("pgbroker bridge out (Redis)", "messages", bridge.pid),
        ]
        numbers = itertools.count()
        sent = requests = 0
        for phase in range(args.phases):
            began = time.monotonic()
            share = args.requests // HTTP_CLIENTS
            in_threads(
                [partial(send_messages, broker, sent, args.messages)]
                + [partial(http_traffic, serve.url, token, share, numbers) for token in tokens]
            )
            sent += args.messages
            requests += args.requests
            wait_until_handled(broker, [worker, streams, bridge], logs)
            empty_redis_stream(redis_server.port)
            for process in watched:
                process.sample(requests if process.unit == "requests" else sent)
            rss = ", ".join(f"{w.rss_mb[-1]:.1f}" for w in watched)
            progress.line(f"phase {phase + 1}/{args.phases}: {time.monotonic() - began:.1f} s; RSS MB {rss}")
    return watched


def report(watched: list[Watched], warm_up: int) -> list[dict[str, Any]]:
    rows = []
    print(f"\n{'process':34} {'work':>10} {'RSS warm':>9} {'RSS end':>8} {'MB/million':>11}  verdict")
    for w in watched:
        growth = w.growth_per_million(warm_up)
        verdict = "?" if growth is None else ("grows" if growth > LEAK_MB_PER_MILLION else "flat")
        warm = w.rss_mb[min(warm_up, len(w.rss_mb)) - 1]
        print(
            f"{w.name:34} {w.work[-1]:>10,} {warm:>9.1f} {w.rss_mb[-1]:>8.1f} "
            f"{'-' if growth is None else f'{growth:.2f}':>11}  {verdict}"
        )
        rows.append(
            {
                "name": w.name,
                "unit": w.unit,
                "work": w.work,
                "rss_mb": w.rss_mb,
                "growth_mb_per_million": growth,
                "verdict": verdict,
            }
        )
    return rows


def plot(watched: list[Watched], warm_up: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(watched), figsize=(3.6 * len(watched), 3.4), squeeze=False)
    for ax, w in zip(axes[0], watched, strict=True):
        ax.plot([x / 1000 for x in w.work], w.rss_mb, marker="o", markersize=3)
        if warm_up < len(w.work):
            ax.axvline(w.work[warm_up - 1] / 1000, color="grey", linestyle=":", linewidth=1)
        ax.set_title(w.name, fontsize=9)
        ax.set_xlabel(f"{w.unit} (thousands)")
        ax.set_ylabel("RSS (MB)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.memory_soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", help="a superuser DSN (default: a private embedded cluster)")
    p.add_argument("--phases", type=int, default=12)
    p.add_argument("--warm-up", type=int, default=3, help="phases left out of the fit")
    p.add_argument("--messages", type=int, default=40_000, help="to the queue and to the stream, a phase")
    p.add_argument("--requests", type=int, default=3_000, help="HTTP requests a phase")
    p.add_argument("--quick", action="store_true", help="6 phases of 10,000 messages and 900 requests")
    p.add_argument("--results-dir", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    if args.quick:
        args.phases, args.warm_up, args.messages, args.requests = 6, 2, 10_000, 900
    if args.phases <= args.warm_up + 1:
        p.error("--phases must leave at least two phases after --warm-up")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    progress = Progress()
    with Server(args.dsn, None) as server:
        _recreate_database(server.admin_dsn, DATABASE)
        try:
            watched = run(server.dsn_for(DATABASE), args, progress)
        finally:
            _drop_database(server.admin_dsn, DATABASE)
    rows = report(watched, args.warm_up)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    stem = args.results_dir / f"memory-{time.strftime('%Y%m%d-%H%M%S')}"
    plot(watched, args.warm_up, stem.with_suffix(".png"))
    settings = {k: v for k, v in vars(args).items() if k != "results_dir"}
    stem.with_suffix(".json").write_text(json.dumps({"settings": settings, "processes": rows}, indent=2))
    print(f"\nresults: {stem}.json, plot: {stem}.png")
    return 0 if all(row["verdict"] == "flat" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
