"""A multiprocess producer/consumer driver: raw SQL calls to each system's functions over psycopg.

Each producer and consumer is a process of its own with one autocommit connection whose
statements are prepared at first use (``prepare_threshold = 0``), as a tuned client would run
them. pgmq is driven as its own clients drive it (``pgmq.send``/``send_batch``, ``pgmq.read`` then
``pgmq.delete``/``archive``), pgbroker with its consumer call (``pgbroker.consume``: a fenced ack of
the batch before and the read of the next, one call and one transaction a batch); pgmq's batch of 1
uses its single-message forms. All processes start together on a barrier
and run for a fixed time; each counts messages in one-second buckets and keeps its latencies.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import threading
import time
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg

PGMQ = "pgmq"
PGBROKER = "pgbroker"


@dataclass(frozen=True)
class Workload:
    system: str
    dsn: str
    queue: str
    payload: str
    producers: int
    producer_batch: int
    consumers: int
    consumer_batch: int
    seconds: float
    vt: int = 30
    archive: bool = False
    #: Messages a second the producers aim for together; None: as fast as they can.
    rate: float | None = None
    #: A consumer that finds the queue empty sleeps this long before reading again.
    empty_backoff: float = 0.005


@dataclass
class WorkerReport:
    role: str
    sent: int = 0
    consumed: int = 0
    per_second: list[int] = field(default_factory=list)
    #: producer: one send call; consumer: one read + ack of a non-empty batch
    op_ms: list[float] = field(default_factory=list)
    #: consumer: from a message's enqueued_at to the end of its ack
    e2e_ms: list[float] = field(default_factory=list)
    empty_reads: int = 0
    error: str | None = None


@dataclass
class RunResult:
    seconds: float
    sent: int = 0
    consumed: int = 0
    sent_per_second: list[int] = field(default_factory=list)
    consumed_per_second: list[int] = field(default_factory=list)
    send_ms: list[float] = field(default_factory=list)
    cycle_ms: list[float] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)
    empty_reads: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Statements:
    send_one: LiteralString
    send_many: LiteralString
    read: LiteralString
    ack_one: LiteralString
    ack_many: LiteralString
    #: whether an ack takes the archive flag as its third parameter
    ack_takes_flag: bool
    #: the column of a read's row (0-based) that the ack takes: msg_id or receipt
    ack_key: int


_SEND_ONE: LiteralString = "SELECT * FROM pgmq.send(%s, %s::jsonb)"
_SEND_MANY: LiteralString = "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])"


def _statements(system: str, archive: bool) -> _Statements:
    if system == PGBROKER:
        return _Statements(
            _SEND_ONE,
            _SEND_MANY,
            "SELECT msg_id, enqueued_at, message, receipt FROM pgbroker.read(%s, %s::integer, %s::integer)",
            "SELECT pgbroker.ack(%s, %s::text, %s::boolean)",
            "SELECT * FROM pgbroker.ack(%s, %s::text[], %s::boolean)",
            True,
            3,
        )
    if system == PGMQ:
        return _Statements(
            _SEND_ONE,
            _SEND_MANY,
            "SELECT msg_id, enqueued_at, message FROM pgmq.read(%s, %s::integer, %s::integer)",
            "SELECT pgmq.archive(%s, %s::bigint)" if archive else "SELECT pgmq.delete(%s, %s::bigint)",
            "SELECT * FROM pgmq.archive(%s, %s::bigint[])"
            if archive
            else "SELECT * FROM pgmq.delete(%s, %s::bigint[])",
            False,
            0,
        )
    raise ValueError(f"the driver does not know system {system!r}")


def _count(buckets: list[int], t0: float, now: float, n: int) -> None:
    second = int(now - t0)
    while len(buckets) <= second:
        buckets.append(0)
    buckets[second] += n


def _produce(
    conn: psycopg.Connection[Any], w: Workload, st: _Statements, index: int, t0: float
) -> WorkerReport:
    report = WorkerReport("producer")
    deadline = t0 + w.seconds
    batch = [w.payload] * w.producer_batch
    interval = 0.0
    next_at = t0
    if w.rate:
        interval = w.producer_batch / (w.rate / w.producers)
        next_at = t0 + index * interval / w.producers  # staggered
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        if interval and now < next_at:
            time.sleep(min(next_at - now, deadline - now))
            continue
        next_at += interval
        start = time.perf_counter()
        if w.producer_batch == 1:
            conn.execute(st.send_one, (w.queue, w.payload)).fetchall()
        else:
            conn.execute(st.send_many, (w.queue, batch)).fetchall()
        report.op_ms.append((time.perf_counter() - start) * 1000)
        report.sent += w.producer_batch
        _count(report.per_second, t0, time.monotonic(), w.producer_batch)
    return report


_CONSUME: LiteralString = (
    "SELECT msg_id, enqueued_at, message, receipt"
    " FROM pgbroker.consume(%s, %s::integer, %s::integer, %s::text[], %s::boolean)"
)


def _consume_pgbroker(conn: psycopg.Connection[Any], w: Workload, t0: float) -> WorkerReport:
    """pgbroker's consumer loop: each pgbroker.consume call acks the batch before and reads the next.

    A batch counts as consumed when the call that acks it returns (its end-to-end latency ends
    there too); the batch read by the last call is acked after the clock stops and not counted.
    """
    report = WorkerReport("consumer")
    deadline = t0 + w.seconds
    held: list[Any] = []
    while time.monotonic() < deadline:
        start = time.perf_counter()
        receipts = [row[3] for row in held]
        rows = conn.execute(_CONSUME, (w.queue, w.vt, w.consumer_batch, receipts, w.archive)).fetchall()
        done = time.time()
        if held:
            report.op_ms.append((time.perf_counter() - start) * 1000)
            report.e2e_ms.extend((done - row[1].timestamp()) * 1000 for row in held)
            report.consumed += len(held)
            _count(report.per_second, t0, time.monotonic(), len(held))
        held = rows
        if not rows:
            report.empty_reads += 1
            time.sleep(w.empty_backoff)
    if held:
        conn.execute(
            "SELECT * FROM pgbroker.ack(%s, %s::text[], %s::boolean)",
            (w.queue, [row[3] for row in held], w.archive),
        ).fetchall()
    return report


def _consume(conn: psycopg.Connection[Any], w: Workload, st: _Statements, t0: float) -> WorkerReport:
    if w.system == PGBROKER:
        return _consume_pgbroker(conn, w, t0)
    report = WorkerReport("consumer")
    deadline = t0 + w.seconds
    while time.monotonic() < deadline:
        start = time.perf_counter()
        rows = conn.execute(st.read, (w.queue, w.vt, w.consumer_batch)).fetchall()
        if not rows:
            report.empty_reads += 1
            time.sleep(w.empty_backoff)
            continue
        keys = [row[st.ack_key] for row in rows]
        if len(keys) == 1:
            params: tuple[Any, ...] = (w.queue, keys[0])
            query = st.ack_one
        else:
            params = (w.queue, keys)
            query = st.ack_many
        if st.ack_takes_flag:
            params = (*params, w.archive)
        conn.execute(query, params).fetchall()
        report.op_ms.append((time.perf_counter() - start) * 1000)
        done = time.time()
        report.e2e_ms.extend((done - row[1].timestamp()) * 1000 for row in rows)
        report.consumed += len(rows)
        _count(report.per_second, t0, time.monotonic(), len(rows))
    return report


def _worker(role: str, index: int, w: Workload, barrier: Any, results: Any) -> None:
    report = WorkerReport(role)
    conn: psycopg.Connection[Any] | None = None
    try:
        conn = psycopg.connect(w.dsn, autocommit=True)
        conn.prepare_threshold = 0
    except Exception as exc:
        report.error = f"{role} {index}: cannot connect: {exc}"
    barrier.wait(timeout=120)
    t0 = time.monotonic()
    if conn is not None:
        try:
            st = _statements(w.system, w.archive)
            report = _produce(conn, w, st, index, t0) if role == "producer" else _consume(conn, w, st, t0)
        except Exception as exc:
            report.error = f"{role} {index}: {type(exc).__name__}: {exc}"
        finally:
            conn.close()
    results.put(report)


def _sum_buckets(target: list[int], buckets: list[int]) -> None:
    while len(target) < len(buckets):
        target.append(0)
    for i, n in enumerate(buckets):
        target[i] += n


def run(w: Workload, started: threading.Event | None = None) -> RunResult:
    """Run the workload's producers and consumers together for ``w.seconds``.

    ``started`` is set when every process is connected and the clock starts.
    """
    ctx = mp.get_context("forkserver")
    roles = ["producer"] * w.producers + ["consumer"] * w.consumers
    barrier = ctx.Barrier(len(roles) + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(role, i, w, barrier, results), daemon=True)
        for i, role in enumerate(roles)
    ]
    for p in procs:
        p.start()
    barrier.wait(timeout=120)
    if started is not None:
        started.set()
    out = RunResult(w.seconds)
    reports: list[WorkerReport] = []
    try:
        for _ in procs:
            reports.append(results.get(timeout=w.seconds + 120))
    except queue_module.Empty:
        out.errors.append("a worker did not report back in time")
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    for r in reports:
        if r.error:
            out.errors.append(r.error)
        out.sent += r.sent
        out.consumed += r.consumed
        out.empty_reads += r.empty_reads
        if r.role == "producer":
            _sum_buckets(out.sent_per_second, r.per_second)
            out.send_ms.extend(r.op_ms)
        else:
            _sum_buckets(out.consumed_per_second, r.per_second)
            out.cycle_ms.extend(r.op_ms)
            out.e2e_ms.extend(r.e2e_ms)
    # A bucket past the deadline holds the last call's stragglers only.
    seconds = int(w.seconds)
    del out.sent_per_second[seconds:]
    del out.consumed_per_second[seconds:]
    return out
