"""Benchmark: how soon a waiting reader has a message after it is sent, sync and asyncio clients.

One reader waits on an idle queue with notify enabled; a sender sends a message once the
reader is back asleep, 100 times (--sends). Latency runs from the start of the send call to
the reader's read_many returning the message, so it covers the commit, the NOTIFY, the
listener's wake-up and the read. The poll interval is set far above the target, so a
wake-up that was not a notification's shows up as a fallback in the table.

    python -m bench.notify_latency [--dsn DSN] [--sends 100] [--throttle-ms 0]

Without --dsn the DSN comes from DATABASE_URL, else the embedded cluster is used. pgbroker is
installed if it is not; the benchmark's queue is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
import uuid
from dataclasses import dataclass

import psycopg

from pgbroker import Broker
from pgbroker._db.dsn import resolve_dsn
from pgbroker.queues._client_async import AsyncBroker

POLL_INTERVAL = 5.0
TARGET_MEDIAN_MS = 20.0


@dataclass(frozen=True)
class Result:
    client: str
    latencies: list[float]  # seconds, send call started -> message in the reader's hands
    sends: list[float]  # seconds the send call took (its commit included)

    HEADER = (
        f"{'client':<7}{'sends':>7}{'median_ms':>11}{'p95_ms':>9}{'min_ms':>9}{'max_ms':>9}"
        f"{'send_ms':>9}{'fallbacks':>11}"
    )

    def row(self) -> str:
        ms = sorted(x * 1000 for x in self.latencies)
        p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
        fallbacks = sum(x >= POLL_INTERVAL * 1000 for x in ms)
        send_ms = statistics.median(self.sends) * 1000
        return (
            f"{self.client:<7}{len(ms):>7}{statistics.median(ms):>11.2f}{p95:>9.2f}"
            f"{ms[0]:>9.2f}{ms[-1]:>9.2f}{send_ms:>9.2f}{fallbacks:>11}"
        )


def gap_seconds(throttle_ms: int) -> float:
    """Pause between a receive and the next send: the reader is asleep again and the throttle over."""
    return max(0.05, throttle_ms / 1000 + 0.02)


def run_sync(dsn: str, queue_name: str, sends: int, throttle_ms: int) -> Result:
    with Broker(dsn, max_connections=2, poll_interval=POLL_INTERVAL) as broker:
        queue = broker.create_queue(queue_name)
        queue.enable_notify(throttle_ms)
        sent_at: dict[int, float] = {}
        received = threading.Semaphore(0)
        latencies: list[float] = []

        def read() -> None:
            while len(latencies) < sends:
                for message in queue.read_many(1, wait=POLL_INTERVAL * 4):
                    latencies.append(time.monotonic() - sent_at[message.message["i"]])
                    queue.delete(message.msg_id)
                    received.release()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        durations = []
        for i in range(sends):
            time.sleep(gap_seconds(throttle_ms))
            sent_at[i] = time.monotonic()
            queue.send({"i": i})
            durations.append(time.monotonic() - sent_at[i])
            received.acquire()
        reader.join()
        return Result("sync", latencies, durations)


async def run_async(dsn: str, queue_name: str, sends: int, throttle_ms: int) -> Result:
    async with AsyncBroker(dsn, max_connections=2, poll_interval=POLL_INTERVAL) as broker:
        queue = await broker.create_queue(queue_name)
        await queue.enable_notify(throttle_ms)
        sent_at: dict[int, float] = {}
        received = asyncio.Semaphore(0)
        latencies: list[float] = []

        async def read() -> None:
            async for message in queue.consume(batch_size=1, idle_wait=POLL_INTERVAL * 4):
                latencies.append(time.monotonic() - sent_at[message.message["i"]])
                await queue.delete(message.msg_id)
                received.release()
                if len(latencies) == sends:
                    return

        reader = asyncio.create_task(read())
        durations = []
        for i in range(sends):
            await asyncio.sleep(gap_seconds(throttle_ms))
            sent_at[i] = time.monotonic()
            await queue.send({"i": i})
            durations.append(time.monotonic() - sent_at[i])
            await received.acquire()
        await reader
        return Result("async", latencies, durations)


def settings(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit'),"
            " current_setting('fsync')"
        ).fetchone()
    assert row is not None
    return f"PostgreSQL {row[0]}, synchronous_commit={row[1]}, fsync={row[2]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--dsn", help="server to use (default: DATABASE_URL, else the embedded cluster)")
    parser.add_argument("--sends", type=int, default=100, help="messages per client (default 100)")
    parser.add_argument("--throttle-ms", type=int, default=0, help="notify throttle (default 0)")
    args = parser.parse_args(argv)
    dsn = resolve_dsn(args.dsn)
    queue_name = f"bench_notify_{uuid.uuid4().hex[:8]}"
    with Broker(dsn, max_connections=1) as broker:
        broker.install()
    try:
        results = [
            run_sync(dsn, queue_name, args.sends, args.throttle_ms),
            asyncio.run(run_async(dsn, queue_name, args.sends, args.throttle_ms)),
        ]
    finally:
        with Broker(dsn, max_connections=1) as broker:
            broker.drop_queue(queue_name)
    print(f"send -> wake latency on an idle queue, notify throttle {args.throttle_ms} ms")
    print(settings(dsn))
    print(Result.HEADER)
    for result in results:
        print(result.row())
    medians = [statistics.median(r.latencies) * 1000 for r in results]
    verdict = "met" if max(medians) < TARGET_MEDIAN_MS else "MISSED"
    print(f"target median < {TARGET_MEDIAN_MS:.0f} ms: {verdict}")


if __name__ == "__main__":
    main()
