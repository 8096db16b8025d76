"""The stream worker runtime under load: one group, W handlers of 1 ms each, and a killed consumer.

    python -m bench.stream_workers_bench [--workers 1 4 16 64] [--seconds 5] [--backlog 100000]
                                         [--blocking] [--kills 3] [--lease 30] [--dsn DSN]

- throughput: a stream of 4 partitions holding a backlog of messages with 1,000 keys; one
  StreamWorker with concurrency=W (batch_size max(100, 4 W), docs/streams.md "Sizing") whose
  handler does 1 ms of work (``asyncio.sleep(0.001)``; with --blocking ``time.sleep(0.001)`` on
  the worker's threads). msg/s handled over --seconds after one second of warm-up.
- pinned xmin: a REPEATABLE READ transaction holds a snapshot open in another session while the
  worker (W=16) drains the backlog for --seconds; then pgstattuple counts the dead tuples of
  the group, cursor and position tables (every row version replaced meanwhile: none can be
  pruned).
- reassignment: two StreamWorker processes share a group (lease --lease seconds); one is
  SIGKILLed; the time from the kill until the other owns every partition, --kills times.
With no --dsn a private cluster is made in a temporary directory on disk and removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import statistics
import time
from typing import Any

from bench.harness import Server, connect
from pgbroker._db.install import install
from pgbroker.runtime._app import serve
from pgbroker.runtime._stream_worker import StreamWorker
from pgbroker.streams._records import StreamMessage

KEYS = 1_000
ctx = multiprocessing.get_context("spawn")


def _fill(dsn: str, stream: str, backlog: int) -> None:
    with connect(dsn) as conn:
        conn.execute("SELECT pgbroker.create_stream(%s, 4)", (stream,))
        conn.execute("SELECT pgbroker.create_stream_group(%s, 'g', 'start')", (stream,))
        for start in range(0, backlog, 5_000):
            n = min(5_000, backlog - start)
            conn.execute(
                "SELECT count(*) FROM pgbroker.stream_send_many(%s, array_fill('{}'::jsonb, ARRAY[%s]),"
                " NULL, ARRAY(SELECT 'k' || ((%s + i) %% %s) FROM generate_series(1, %s) i))",
                (stream, n, start, KEYS, n),
            )


async def _throughput(
    dsn: str, stream: str, workers: int, seconds: float, blocking: bool
) -> tuple[float, int]:
    """msg/s over ``seconds`` after a warm-up, and the messages handled in all."""
    handled = 0

    async def work(message: StreamMessage) -> None:
        nonlocal handled
        await asyncio.sleep(0.001)
        handled += 1

    def work_blocking(message: StreamMessage) -> None:
        nonlocal handled
        time.sleep(0.001)
        handled += 1  # one int add under the GIL; a lost count would only lower the rate

    handler = work_blocking if blocking else work
    worker = StreamWorker(stream, "g", handler, concurrency=workers, batch_size=max(100, 4 * workers))
    task = asyncio.create_task(serve([worker], dsn=dsn, handle_signals=False))
    await asyncio.sleep(1.0)
    start, t0 = handled, time.perf_counter()
    await asyncio.sleep(seconds)
    rate = (handled - start) / (time.perf_counter() - t0)
    worker.stop(grace_period=5)
    await asyncio.wait_for(task, 60)
    return rate, handled


# The group state tables; stream_position_0/1 (the insert-only positions) and
# stream_watermark_0/1 (the insert-only watermark, which replaced the table stream_watermark) exist
# from issue 25 on, and a run on a tree without them leaves them out.
STATE_TABLES = (
    "stream_cursor",
    "stream_position_0",
    "stream_position_1",
    "stream_consumer",
    "stream_watermark",
    "stream_watermark_0",
    "stream_watermark_1",
    "stream_group",
)


def _pinned(dsn: str, stream: str, seconds: float) -> tuple[int, dict[str, int]]:
    """Messages handled by W=16 while a snapshot is held open, and each state table's dead tuples."""
    with connect(dsn) as conn, connect(dsn) as pin:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        tables = [
            t
            for t in STATE_TABLES
            # A plain table (not a partitioned parent: pgstattuple reads heaps).
            if conn.execute(
                "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", (f"pgbroker.{t}",)
            ).fetchone()
            == ("r",)
        ]
        conn.execute("VACUUM " + ", ".join(f"pgbroker.{t}" for t in tables))
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT 1")  # the snapshot: xmin is held from here
        _, handled = asyncio.run(_throughput(dsn, stream, 16, seconds, False))
        dead = {
            t: conn.execute("SELECT dead_tuple_count FROM pgstattuple(%s)", (f"pgbroker.{t}",)).fetchone()[0]  # type: ignore[index]
            for t in tables
        }
        pin.execute("ROLLBACK")
    return handled, dead


def _member(dsn: str, stream: str, name: str, lease: int) -> None:
    async def work(message: StreamMessage) -> None:
        await asyncio.sleep(0.001)

    worker = StreamWorker(stream, "g", work, lease=lease, poll_max=0.2, consumer=name, retries=False)
    asyncio.run(serve([worker], dsn=dsn, handle_signals=False))


def _owners(conn: Any, stream: str) -> set[Any]:
    return {
        r[0]
        for r in conn.execute("SELECT owner FROM pgbroker.stream_cursor WHERE stream_name = %s", (stream,))
    }


def _reassignment(dsn: str, stream: str, lease: int) -> float:
    """Seconds from a SIGKILL to the survivor owning every partition."""
    members = {n: ctx.Process(target=_member, args=(dsn, stream, n, lease), daemon=True) for n in ("a", "b")}
    for p in members.values():
        p.start()
    with connect(dsn) as conn:
        owners: set[Any] = set()
        while owners != {"a", "b"}:  # both in, the partitions shared
            time.sleep(0.05)
            owners = _owners(conn, stream)
        os.kill(members["a"].pid or 0, signal.SIGKILL)
        killed = time.perf_counter()
        while owners != {"b"}:
            time.sleep(0.01)
            owners = _owners(conn, stream)
        took = time.perf_counter() - killed
    for p in members.values():
        p.kill()
        p.join()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--blocking", action="store_true", help="time.sleep on threads, not asyncio.sleep")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--lease", type=int, default=30)
    parser.add_argument("--dsn", help="a server to run on (a superuser); default: a private cluster")
    args = parser.parse_args()
    with Server(args.dsn, None) as server:
        with connect(server.admin_dsn) as admin:
            admin.execute("DROP DATABASE IF EXISTS stream_workers_bench WITH (FORCE)")
            admin.execute("CREATE DATABASE stream_workers_bench")
        dsn = server.dsn_for("stream_workers_bench")
        with connect(dsn) as conn:
            install(conn)
        with open("/proc/loadavg") as f:
            print(f"load average at start: {f.read().split()[:3]}", flush=True)
        rates = {}
        for w in args.workers:
            _fill(dsn, f"t{w}", args.backlog)
            rates[w], _ = asyncio.run(_throughput(dsn, f"t{w}", w, args.seconds, args.blocking))
            print(f"W={w}: {rates[w]:,.0f} msg/s", flush=True)
        _fill(dsn, "pinned", args.backlog)
        handled, dead = _pinned(dsn, "pinned", args.seconds)
        print(f"pinned xmin, W=16: {handled:,} messages; dead tuples {dead}", flush=True)
        kills = []
        for k in range(args.kills):
            with connect(dsn) as conn:
                conn.execute("SELECT pgbroker.create_stream(%s, 4)", (f"k{k}",))
                conn.execute("SELECT pgbroker.create_stream_group(%s, 'g', 'start')", (f"k{k}",))
            kills.append(_reassignment(dsn, f"k{k}", args.lease))
            print(
                f"kill {k + 1}: partitions reassigned in {kills[-1]:.2f} s (lease {args.lease} s)", flush=True
            )
        with connect(server.admin_dsn) as admin:
            admin.execute("DROP DATABASE IF EXISTS stream_workers_bench WITH (FORCE)")
    with open("/proc/loadavg") as f:
        print(f"load average at end: {f.read().split()[:3]}")
    handler = "time.sleep(0.001) on threads" if args.blocking else "asyncio.sleep(0.001)"
    print(f"\n| W handlers ({handler}) | msg/s |\n|---|---|")
    for w, rate in rates.items():
        print(f"| {w} | {rate:,.0f} |")
    per_thousand = sum(dead.values()) * 1000 / max(handled, 1)
    print(f"\npinned xmin: dead tuples {dead} after {handled:,} messages ({per_thousand:.1f} per 1,000)")
    if kills:
        print(
            f"\nreassignment after SIGKILL: median {statistics.median(kills):.2f} s, max {max(kills):.2f} s"
        )


if __name__ == "__main__":
    main()
