"""Scenario (b): pgmq-style producer/consumer runs, pgmq's SQL against pgbroker's.

pgmq's published benchmarks run producers and consumers for a fixed time with 22 B and 1 KB
messages and report messages a second. Here each step is one such run on a fresh queue, with the
multiprocess driver of bench.driver: producers only (send with a batch of 1, 10, 100), consumers
only (read + delete/ack with a batch of 1 or 10, from a prefilled backlog), and both together
(end to end). Latencies: one send call for producers; one read + ack for consumers; from the
message's enqueued_at to the end of its ack for end-to-end runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench import driver
from bench.harness import (
    PGBROKER,
    PGMQ,
    Bench,
    Histogram,
    Row,
    ScenarioResult,
    Series,
    json_payload,
    percentile,
)

TITLE = "Producer/consumer runs (pgmq's benchmark): msgs/s, p50 and p99"
COLUMNS = [PGMQ, PGBROKER]


@dataclass(frozen=True)
class Step:
    key: str
    label: str
    size: int
    producers: int
    producer_batch: int
    consumers: int
    consumer_batch: int

    @property
    def kind(self) -> str:
        if not self.consumers:
            return "send"
        if not self.producers:
            return "consume"
        return "e2e"


def _size_label(size: int) -> str:
    return f"{size} B" if size < 1024 else f"{size // 1024} KB"


def steps(producers: int, consumers: int) -> list[Step]:
    out: list[Step] = []
    for size in (22, 1024):
        s = _size_label(size)
        for batch in (1, 10, 100):
            out.append(Step(f"send-{size}-{batch}", f"send x{batch}, {s}", size, producers, batch, 0, 0))
    for size, batch in ((22, 1), (22, 10), (1024, 10)):
        s = _size_label(size)
        out.append(Step(f"consume-{size}-{batch}", f"read+ack x{batch}, {s}", size, 0, 0, consumers, batch))
    end_to_end = ((22, 1, 10), (22, 10, 10), (22, 100, 10), (22, 10, 1), (1024, 1, 10), (1024, 10, 10))
    for size, pb, cb in end_to_end:
        s = _size_label(size)
        out.append(
            Step(
                f"e2e-{size}-{pb}x{cb}",
                f"end to end, send x{pb} / read x{cb}, {s}",
                size,
                producers,
                pb,
                consumers,
                cb,
            )
        )
    return out


def run(bench: Bench, result: ScenarioResult) -> None:
    config = bench.config
    result.description = (
        f"{config.producers} producer and {config.consumers} consumer processes (one connection each, "
        f"prepared statements), {config.driver_seconds:g} s a run, a fresh queue per run; read-only runs "
        f"start from a backlog of {config.consume_prefill:,} (22 B) or {config.consume_prefill // 4:,} "
        f"(1 KB) messages; acks {'archive' if config.ack_archive else 'delete'}; a consumer that reads "
        "nothing sleeps 5 ms."
    )
    for i, step in enumerate(steps(config.producers, config.consumers)):
        rates: dict[str, float | None] = {}
        p50: dict[str, float | None] = {}
        p99: dict[str, float | None] = {}
        # Alternate which system goes first, so that a drift in the machine's load does not always
        # favour the same one.
        for key in COLUMNS if i % 2 == 0 else list(reversed(COLUMNS)):
            measured = _run_step(bench, step, key, result)
            if measured is None:
                rates[key] = p50[key] = p99[key] = None
                continue
            rates[key], p50[key], p99[key] = measured
        lat = {"send": "ms/send", "consume": "ms/read+ack", "e2e": "ms send→ack"}[step.kind]
        result.rows.append(Row(step.label, "msg/s", rates, key=step.key))
        result.rows.append(Row(step.label, f"p50 {lat}", p50, key=step.key))
        result.rows.append(Row(step.label, f"p99 {lat}", p99, key=step.key))


def _run_step(
    bench: Bench, step: Step, key: str, result: ScenarioResult
) -> tuple[float, float | None, float | None] | None:
    config = bench.config
    system = bench.systems[key]
    payload = json_payload(step.size)
    with bench.progress.step(f"(b) {key:8} {step.label}") as out:
        queue = bench.new_queue_name(step.key)
        bench.create_queue(system, queue)
        try:
            prefill = 0
            if step.kind == "consume":
                prefill = config.consume_prefill if step.size < 100 else config.consume_prefill // 4
                bench.fill_queue(system, queue, prefill, payload)
            bench.settle(system)
            workload = driver.Workload(
                system=key,
                dsn=system.dsn,
                queue=queue,
                payload=payload,
                producers=step.producers,
                producer_batch=step.producer_batch,
                consumers=step.consumers,
                consumer_batch=step.consumer_batch,
                seconds=config.driver_seconds,
                archive=config.ack_archive,
            )
            r = driver.run(workload)
            left = bench.queue_length(system, queue)
        finally:
            bench.drop_queue(system, queue)
        for error in r.errors:
            result.errors.append(f"{key} {step.label}: {error}")
            out.append(f"ERROR {error}")
        if step.kind == "send":
            rate, buckets, latencies = r.sent / r.seconds, r.sent_per_second, r.send_ms
        elif step.kind == "consume":
            rate, buckets, latencies = r.consumed / r.seconds, r.consumed_per_second, r.cycle_ms
            if left == 0:
                result.warnings.append(f"{key} {step.label}: the backlog ran out; raise --consume-prefill")
        else:
            rate, buckets, latencies = r.consumed / r.seconds, r.consumed_per_second, r.e2e_ms
        result.series.append(Series(step.label, key, "msg/s", [(i + 0.5, n) for i, n in enumerate(buckets)]))
        if latencies:
            result.histograms.append(Histogram(step.label, key, latencies))
        out.append(f"{rate:,.0f} msg/s")
        if step.kind == "e2e":
            out.append(f"sent {r.sent / r.seconds:,.0f} msg/s, {left:,} left")
            if left > max(1000, r.sent // 10):
                result.warnings.append(
                    f"{key} {step.label}: consumers fell behind "
                    f"({left:,} of {r.sent:,} sent left in the queue)"
                )
        result.extra.setdefault("runs", []).append(
            {
                "step": step.key,
                "system": key,
                "size": step.size,
                "producers": step.producers,
                "producer_batch": step.producer_batch,
                "consumers": step.consumers,
                "consumer_batch": step.consumer_batch,
                "prefill": prefill,
                "seconds": r.seconds,
                "sent": r.sent,
                "consumed": r.consumed,
                "left_in_queue": left,
                "empty_reads": r.empty_reads,
                "send_ms": _summary(r.send_ms),
                "read_ack_ms": _summary(r.cycle_ms),
                "e2e_ms": _summary(r.e2e_ms),
            }
        )
        if r.errors and not (r.sent or r.consumed):
            return None
        return rate, percentile(latencies, 50), percentile(latencies, 99)


def _summary(samples: list[float]) -> dict[str, float | int | None]:
    return {
        "n": len(samples),
        "p50": percentile(samples, 50),
        "p90": percentile(samples, 90),
        "p99": percentile(samples, 99),
        "max": max(samples) if samples else None,
    }
