"""Scenario (b): pgmq-style producer/consumer runs, pgmq's SQL against pgbroker's.

pgmq's published benchmarks run producers and consumers for a fixed time with 22 B and 1 KB
messages and report messages a second. Here a step is such runs with the multiprocess driver of
bench.driver, each on a fresh queue: producers only (send with a batch of 1, 10, 100), consumers
only (read + delete/ack with a batch of 1 or 10, from a prefilled backlog), and both together
(end to end). As in scenario (a), each step runs every system in ``driver_rounds`` rounds of
``driver_seconds / driver_rounds``, in alternating order (A B, then B A), so that a change in the
machine's load during the step weighs on both alike: msgs/s are averaged over the rounds,
latencies pooled, the over-time series is the first round's. Latencies: one send call for
producers; one read + ack for consumers; from the message's enqueued_at to the end of its ack for
end-to-end runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench import driver
from bench.harness import (
    PGBROKER,
    PGMQ,
    Bench,
    Config,
    Histogram,
    Row,
    ScenarioResult,
    Series,
    alternating_rounds,
    json_payload,
    mean_rate,
    percentile,
)

TITLE = "Producer/consumer runs (pgmq's benchmark) in alternating rounds: mean msgs/s, pooled p50 and p99"
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


def run_seconds(config: Config) -> float:
    """How long one driver run lasts: the step's time shared among its rounds."""
    return config.driver_seconds / max(1, config.driver_rounds)


def _runs_text(config: Config) -> str:
    seconds = f"{run_seconds(config):g} s per step and system"
    if config.driver_rounds > 1:
        return (
            f"{config.driver_rounds} runs of {seconds} (in alternating order, A B then B A; "
            "rates averaged, latencies pooled)"
        )
    return f"one run of {seconds} (which system goes first alternates from step to step)"


def run(bench: Bench, result: ScenarioResult) -> None:
    config = bench.config
    rounds = max(1, config.driver_rounds)
    result.description = (
        f"{config.producers} producer and {config.consumers} consumer processes (one connection each, "
        f"prepared statements), {_runs_text(config)}, a fresh queue per run; read-only runs start "
        f"from a backlog of {config.consume_prefill:,} (22 B) or {config.consume_prefill // 4:,} "
        f"(1 KB) messages; acks {'archive' if config.ack_archive else 'delete'}; a consumer that "
        "reads nothing sleeps 5 ms."
    )
    for i, step in enumerate(steps(config.producers, config.consumers)):
        # Which system opens the step alternates too: with an odd number of rounds, a drift in
        # the load does not always favour the same one.
        opening = COLUMNS if i % 2 == 0 else list(reversed(COLUMNS))
        runs: dict[str, list[_Measured]] = {key: [] for key in COLUMNS}
        for n, key in alternating_rounds(opening, rounds):
            runs[key].append(_run_step(bench, step, key, result, n))
        rates: dict[str, float | None] = {}
        p50: dict[str, float | None] = {}
        p99: dict[str, float | None] = {}
        for key, measured in runs.items():
            rates[key] = mean_rate([m.rate for m in measured])
            latencies = [ms for m in measured for ms in m.latencies]
            p50[key] = percentile(latencies, 50)
            p99[key] = percentile(latencies, 99)
            if latencies:
                result.histograms.append(Histogram(step.label, key, latencies))
        lat = {"send": "ms/send", "consume": "ms/read+ack", "e2e": "ms send→ack"}[step.kind]
        result.rows.append(Row(step.label, "msg/s", rates, key=step.key))
        result.rows.append(Row(step.label, f"p50 {lat}", p50, key=step.key))
        result.rows.append(Row(step.label, f"p99 {lat}", p99, key=step.key))


@dataclass
class _Measured:
    #: msg/s; None: the run failed before it sent or consumed anything
    rate: float | None
    #: the latencies of the step's kind, ms
    latencies: list[float]


def _run_step(bench: Bench, step: Step, key: str, result: ScenarioResult, round_no: int) -> _Measured:
    """One run of a step on a system, on a fresh queue: driver_seconds / driver_rounds long.

    Only a step's first round adds its throughput-over-time series to the result (the plots show
    one run per system); the caller pools every round's latencies.
    """
    config = bench.config
    system = bench.systems[key]
    payload = json_payload(step.size)
    seconds = run_seconds(config)
    # Warnings name the round when there are several: each round stands on its own queue.
    of_round = f" (round {round_no + 1})" if config.driver_rounds > 1 else ""
    where = f"{key} {step.label}{of_round}"
    with bench.progress.step(f"(b) {key:8} {step.label}{of_round}") as out:
        queue = bench.new_queue_name(step.key)
        bench.create_queue(system, queue)
        try:
            prefill = 0
            filling = 0.0
            if step.kind == "consume":
                prefill = config.consume_prefill if step.size < 100 else config.consume_prefill // 4
                t0 = time.monotonic()
                bench.fill_queue(system, queue, prefill, payload)
                # Every round fills its own backlog: the report says what that costs.
                filling = time.monotonic() - t0
                out.append(f"prefill {prefill:,} in {filling:.1f} s")
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
                seconds=seconds,
                archive=config.ack_archive,
            )
            r = driver.run(workload)
            left = bench.queue_length(system, queue)
        finally:
            bench.drop_queue(system, queue)
        for error in r.errors:
            result.errors.append(f"{where}: {error}")
            out.append(f"ERROR {error}")
        if step.kind == "send":
            rate, buckets, latencies = r.sent / r.seconds, r.sent_per_second, r.send_ms
        elif step.kind == "consume":
            rate, buckets, latencies = r.consumed / r.seconds, r.consumed_per_second, r.cycle_ms
            if left == 0:
                result.warnings.append(f"{where}: the backlog ran out; raise --consume-prefill")
        else:
            rate, buckets, latencies = r.consumed / r.seconds, r.consumed_per_second, r.e2e_ms
        if round_no == 0:
            points = [(i + 0.5, float(n)) for i, n in enumerate(buckets)]
            result.series.append(Series(step.label, key, "msg/s", points))
        out.append(f"{rate:,.0f} msg/s")
        if step.kind == "e2e":
            out.append(f"sent {r.sent / r.seconds:,.0f} msg/s, {left:,} left")
            if left > max(1000, r.sent // 10):
                result.warnings.append(
                    f"{where}: consumers fell behind ({left:,} of {r.sent:,} sent left in the queue)"
                )
        result.extra.setdefault("runs", []).append(
            {
                "step": step.key,
                "system": key,
                "round": round_no,
                "size": step.size,
                "producers": step.producers,
                "producer_batch": step.producer_batch,
                "consumers": step.consumers,
                "consumer_batch": step.consumer_batch,
                "prefill": prefill,
                "prefill_seconds": filling,
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
            return _Measured(None, [])
        return _Measured(rate, latencies)


def _summary(samples: list[float]) -> dict[str, float | int | None]:
    return {
        "n": len(samples),
        "p50": percentile(samples, 50),
        "p90": percentile(samples, 90),
        "p99": percentile(samples, 99),
        "max": max(samples) if samples else None,
    }
