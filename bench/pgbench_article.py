"""Scenario (a): the pgbench runs of "Implementing Queues in PostgreSQL", three systems side by side.

The article enqueues (one INSERT a transaction) and dequeues (one DELETE of the oldest row, found
with FOR UPDATE SKIP LOCKED) with 15 pgbench clients, in isolation and concurrently. The same
workloads are expressed with pgmq's and pgbroker's SQL API as pgbench custom scripts: send (one
message, or a batch of 10), pop, and read + delete (pgmq) / read + ack (pgbroker) with 1 and 10
messages a read. pgbroker's dequeue with read and ack is its consumer call, ``pgbroker.consume``,
which acks the previous batch and reads the next in one transaction (pgmq has no such call: its
clients read, then delete). Every run uses ``-M prepared``, ``-n``, and a backlog prefilled so that a
dequeue never finds the queue empty; messages a second are counted from the queue's length before
and after, not assumed from the transaction count.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from psycopg import sql

from bench.cpu_clock import postmaster_pid, server_cpu_seconds
from bench.harness import (
    NAIVE,
    PGBROKER,
    PGMQ,
    Bench,
    Config,
    Histogram,
    Row,
    ScenarioResult,
    Series,
    System,
    alternating_rounds,
    connect,
    mean_rate,
    percentile,
)

TITLE = "The article's pgbench runs: naive queue, pgmq and pgbroker"
COLUMNS = [NAIVE, PGMQ, PGBROKER]

# The article's payload: a small JSON document that no operation looks into.
ARTICLE_PAYLOAD = (
    '{"type": "performance test", "topic": "fifo queue read and write, no domain logic involved"}'
)


@dataclass(frozen=True)
class Script:
    """One pgbench script: its text, and how many messages one transaction enqueues or dequeues."""

    text: str
    batch: int


def _naive_enqueue() -> Script:
    return Script(
        "INSERT INTO queue_schema.queue (element_identifier, time_inserted, payload)\n"
        f"VALUES (gen_random_uuid(), current_timestamp, '{ARTICLE_PAYLOAD}');\n",
        1,
    )


def _naive_dequeue() -> Script:
    return Script(
        "DELETE FROM queue_schema.queue q\n"
        "WHERE q.element_identifier = (\n"
        "    SELECT i.element_identifier FROM queue_schema.queue i\n"
        "    ORDER BY i.time_inserted ASC FOR UPDATE SKIP LOCKED LIMIT 1)\n"
        "RETURNING q.element_identifier, q.time_inserted, q.payload;\n",
        1,
    )


# The scripts below are pgbench files, not statements run from Python (hence the noqa S608):
# the queue names in them are made by the harness (Bench.new_queue_name), never given by a user.


def _send(queue: str, batch: int) -> Script:
    if batch == 1:
        return Script(f"SELECT * FROM pgmq.send('{queue}', '{ARTICLE_PAYLOAD}'::jsonb);\n", 1)  # noqa: S608
    items = ", ".join([f"'{ARTICLE_PAYLOAD}'"] * batch)
    return Script(f"SELECT * FROM pgmq.send_batch('{queue}', ARRAY[{items}]::jsonb[]);\n", batch)  # noqa: S608


def _pop(queue: str) -> Script:
    return Script(f"SELECT * FROM pgmq.pop('{queue}', 1);\n", 1)  # noqa: S608


def _read_ack(system: str, queue: str, qty: int, archive: bool, *, pgmq_api: bool = False) -> Script:
    # \gset carries the read's ids (or receipts) to the ack; array_agg keeps it one row even
    # when a read finds nothing, and the array forms take any number of them. ``pgmq_api``: pgbroker
    # too through pgmq.read and pgmq.delete (its pgmq-compatible API), as a pgmq client calls it.
    if system == PGMQ or pgmq_api:
        ack = "archive" if archive else "delete"
        read = f"SELECT coalesce(array_agg(msg_id), '{{}}') AS ids FROM pgmq.read('{queue}', 30, {qty})"  # noqa: S608
        ack_ids = f"SELECT * FROM pgmq.{ack}('{queue}', :ids::bigint[]);"  # noqa: S608
        return Script(f"{read} \\gset\n{ack_ids}\n", qty)
    # pgbroker's consumer loop is one call a batch: pgbroker.consume acks the receipts of the
    # batch before (carried in a pgbench variable, '{}' at the start: -D receipts={}) and reads the
    # next one, in one transaction. Messages read by a client's last call stay in the queue
    # and are not counted.
    flag = str(archive).lower()
    consume = (
        "SELECT coalesce(array_agg(receipt), '{}') AS receipts "  # noqa: S608
        f"FROM pgbroker.consume('{queue}', 30, {qty}, :receipts::text[], {flag})"
    )
    return Script(f"{consume} \\gset\n", qty)


@dataclass(frozen=True)
class Step:
    key: str
    label: str
    #: "enqueue", "dequeue" or "concurrent": what the queue must hold before the step.
    kind: str
    systems: tuple[str, ...]


STEPS = (
    Step("enqueue-1", "enqueue, 1 msg/tx (INSERT / send)", "enqueue", (NAIVE, PGMQ, PGBROKER)),
    Step("enqueue-10", "enqueue, 10 msg/tx (send_batch)", "enqueue", (PGMQ, PGBROKER)),
    Step("dequeue-1", "dequeue, 1 msg/tx (DELETE / pop)", "dequeue", (NAIVE, PGMQ, PGBROKER)),
    Step("read-1", "read 1 + delete / consume 1", "dequeue", (PGMQ, PGBROKER)),
    Step("read-10", "read 10 + delete / consume 10", "dequeue", (PGMQ, PGBROKER)),
    Step("read-1-api", "read 1 + delete, pgmq API on both", "dequeue", (PGMQ, PGBROKER)),
    Step("read-10-api", "read 10 + delete[], pgmq API on both", "dequeue", (PGMQ, PGBROKER)),
    Step("concurrent", "concurrent enqueue 1 + dequeue 1", "concurrent", (NAIVE, PGMQ, PGBROKER)),
)


def _scripts(step: Step, system: str, queue: str, archive: bool) -> dict[str, Script]:
    """The pgbench processes a step runs on a system, by role ("enqueue"/"dequeue")."""
    if system == NAIVE:
        enqueue, dequeue = _naive_enqueue(), _naive_dequeue()
    else:
        enqueue, dequeue = _send(queue, 1), _pop(queue)
    if step.key == "enqueue-1":
        return {"enqueue": enqueue}
    if step.key == "enqueue-10":
        return {"enqueue": _send(queue, 10)}
    if step.key == "dequeue-1":
        return {"dequeue": dequeue}
    if step.key == "read-1":
        return {"dequeue": _read_ack(system, queue, 1, archive)}
    if step.key == "read-10":
        return {"dequeue": _read_ack(system, queue, 10, archive)}
    if step.key in ("read-1-api", "read-10-api"):
        qty = 1 if step.key == "read-1-api" else 10
        return {"dequeue": _read_ack(system, queue, qty, archive, pgmq_api=True)}
    return {"enqueue": enqueue, "dequeue": dequeue}


# -- running pgbench -------------------------------------------------------------------------------


def run_seconds(config: Config) -> int:
    """How long one pgbench run lasts: the step's time shared among its rounds."""
    return max(1, round(config.pgbench_seconds / max(1, config.pgbench_rounds)))


def find_pgbench() -> str:
    override = os.environ.get("PGBROKER_PG_BIN")
    if override and Path(override, "pgbench").is_file():
        return str(Path(override, "pgbench"))
    found = shutil.which("pgbench")
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"), reverse=True):
        return str(candidate)
    raise RuntimeError("pgbench not found: install postgresql-client or set PGBROKER_PG_BIN")


@dataclass
class PgbenchRun:
    transactions: int = 0
    tps: float = 0.0
    failed: bool = False
    message: str = ""
    #: (second, tps) from -P 1
    progress: list[tuple[float, float]] = field(default_factory=list)
    #: sampled transaction latencies, ms
    latencies: list[float] = field(default_factory=list)


_PROGRESS = re.compile(r"progress: ([\d.]+) s, ([\d.]+) tps")
_PROCESSED = re.compile(r"number of transactions actually processed: (\d+)")
_TPS = re.compile(r"tps = ([\d.]+) \((?:without|excluding)")


class _Process:
    def __init__(self, bench: Bench, dsn: str, script: Script, workdir: Path, role: str) -> None:
        config = bench.config
        self.workdir = workdir
        self.role = role
        script_file = workdir / f"{role}.sql"
        script_file.write_text(script.text)
        self.prefix = workdir / f"log_{role}"
        self.out = (workdir / f"{role}.out").open("w")
        self.err = (workdir / f"{role}.err").open("w")
        args = [
            find_pgbench(),
            "-n",
            "-M",
            "prepared",
            "-c",
            str(config.pgbench_clients),
            "-j",
            str(config.pgbench_threads),
            "-T",
            str(run_seconds(config)),
            "-P",
            "1",
            "-l",
            "--sampling-rate",
            str(config.pgbench_log_sampling),
            "--log-prefix",
            str(self.prefix),
            "-D",
            "receipts={}",
            "-f",
            str(script_file),
            dsn,
        ]
        self.proc = subprocess.Popen(args, stdout=self.out, stderr=self.err, cwd=workdir)

    def finish(self) -> PgbenchRun:
        code = self.proc.wait()
        self.out.close()
        self.err.close()
        stdout = (self.workdir / f"{self.role}.out").read_text()
        stderr = (self.workdir / f"{self.role}.err").read_text()
        run = PgbenchRun()
        if m := _PROCESSED.search(stdout):
            run.transactions = int(m[1])
        if m := _TPS.search(stdout):
            run.tps = float(m[1])
        run.progress = [(float(t), float(v)) for t, v in _PROGRESS.findall(stderr)]
        if code != 0 or "aborted" in stderr or "aborted" in stdout:
            run.failed = True
            lines = [line for line in stderr.splitlines() if not line.startswith("progress:")]
            run.message = " / ".join(lines[-3:]) or f"pgbench exited with {code}"
        for log_file in self.workdir.glob(f"{self.prefix.name}.*"):
            for line in log_file.read_text().splitlines():
                fields = line.split()
                # client_id transaction_no time(us) script_no time_epoch time_us ...
                if len(fields) >= 3 and fields[2].isdigit():
                    run.latencies.append(int(fields[2]) / 1000.0)
        return run


# -- queue state -----------------------------------------------------------------------------------


def _naive_length(system: System) -> int:
    with connect(system.dsn) as conn:
        row = conn.execute("SELECT count(*) FROM queue_schema.queue").fetchone()
    return int(row[0]) if row else 0


def _naive_reset(system: System) -> None:
    with connect(system.dsn) as conn:
        conn.execute("TRUNCATE queue_schema.queue")


def _naive_top_up(system: System, target: int) -> None:
    missing = target - _naive_length(system)
    with connect(system.dsn) as conn:
        if missing > 0:
            conn.execute(
                "INSERT INTO queue_schema.queue (element_identifier, time_inserted, payload)"
                " SELECT gen_random_uuid(), clock_timestamp(), %s::json FROM generate_series(1, %s)",
                [ARTICLE_PAYLOAD, missing],
            )
        conn.execute("VACUUM ANALYZE queue_schema.queue")


def _length(bench: Bench, system: System, queue: str) -> int:
    return _naive_length(system) if system.key == NAIVE else bench.queue_length(system, queue)


def _top_up(bench: Bench, system: System, queue: str, target: int) -> None:
    if system.key == NAIVE:
        _naive_top_up(system, target)
        return
    missing = target - bench.queue_length(system, queue)
    if missing > 0:
        bench.fill_queue(system, queue, missing, ARTICLE_PAYLOAD)  # vacuums too
        return
    with connect(system.dsn) as conn:
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(bench.queue_table(queue)))


# -- the scenario ----------------------------------------------------------------------------------


def run(bench: Bench, result: ScenarioResult) -> None:
    config = bench.config
    seconds = run_seconds(config)
    rounds = max(1, config.pgbench_rounds)
    result.description = (
        f"pgbench, {config.pgbench_clients} clients, {config.pgbench_threads} threads, "
        f"{rounds} run{'s' if rounds > 1 else ''} of {seconds} s per step and system "
        "(in alternating order; rates averaged, latencies pooled), "
        f"-M prepared; dequeue runs start from a backlog of {config.pgbench_prefill:,} messages; "
        f"acks {'archive' if config.ack_archive else 'delete'}. Latency is per transaction "
        "(a dequeue's read and ack together), from pgbench's log sampled at "
        f"{config.pgbench_log_sampling:.0%}."
    )
    # One queue per system for the dequeue steps (topped up between them); a fresh one for each
    # enqueue step, which starts empty.
    dequeue_queues = {key: bench.new_queue_name("pgbench_dequeue") for key in (PGMQ, PGBROKER)}
    for key, name in dequeue_queues.items():
        bench.create_queue(bench.systems[key], name)
    workroot = Path(tempfile.mkdtemp(prefix="pgbroker-pgbench-"))
    try:
        rounds = max(1, config.pgbench_rounds)
        for step in STEPS:
            throughput: dict[str, dict[str, float | None]] = {"enqueue": {}, "dequeue": {}}
            p50: dict[str, float | None] = {}
            p99: dict[str, float | None] = {}
            cpu: dict[str, float | None] = {}
            runs: dict[str, list[_Measured]] = {key: [] for key in step.systems}
            for n, key in alternating_rounds(step.systems, rounds):
                system = bench.systems[key]
                runs[key].append(
                    _run_step(bench, step, system, dequeue_queues, workroot, result, first=n == 0)
                )
            for key, measured in runs.items():
                for role in measured[0].rates:
                    throughput[role][key] = mean_rate([m.rates[role] for m in measured])
                latencies = [ms for m in measured for ms in m.latencies]
                costs = [m.server_cpu for m in measured if m.server_cpu is not None]
                cpu[key] = sum(costs) / len(costs) if costs else None
                p50[key] = percentile(latencies, 50)
                p99[key] = percentile(latencies, 99)
                if latencies:
                    name = step.label
                    result.histograms.append(Histogram(name, key, latencies))
            roles = ["enqueue", "dequeue"] if step.kind == "concurrent" else [step.kind]
            for role in roles:
                label = f"{step.label}: {role}" if step.kind == "concurrent" else step.label
                key = f"{step.key}:{role}" if step.kind == "concurrent" else step.key
                result.rows.append(Row(label, "msg/s", throughput[role], key=key))
            result.rows.append(Row(step.label, "p50 ms/tx", p50, key=step.key))
            result.rows.append(Row(step.label, "p99 ms/tx", p99, key=step.key))
            result.rows.append(Row(step.label, "server CPU us/msg", cpu, key=f"{step.key}:cpu"))
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
        for key, name in dequeue_queues.items():
            bench.drop_queue(bench.systems[key], name)


@dataclass
class _Measured:
    rates: dict[str, float | None]
    #: sampled transaction latencies of every process of the run, ms
    latencies: list[float]
    #: the server's CPU (all its processes) per message sent or consumed, microseconds: a cost that
    #: holds on a loaded machine, where rates swing (bench.cpu_clock); None off this machine
    server_cpu: float | None = None


def _run_step(
    bench: Bench,
    step: Step,
    system: System,
    dequeue_queues: dict[str, str],
    workroot: Path,
    result: ScenarioResult,
    *,
    first: bool,
) -> _Measured:
    """One run of a step on a system: pgbench_seconds / pgbench_rounds long.

    Only a step's first round adds its throughput-over-time series to the result (the plots show
    one run per system); every round's latencies go to the step's histogram.
    """
    config = bench.config
    label = f"(a) {system.key:8} {step.label}"
    with bench.progress.step(label) as out:
        fresh = step.kind == "enqueue" and system.key != NAIVE
        queue = bench.new_queue_name(f"pgbench_{step.key}") if fresh else dequeue_queues.get(system.key, "")
        if fresh:
            bench.create_queue(system, queue)
        elif step.kind == "enqueue":
            _naive_reset(system)
        if step.kind != "enqueue":
            _top_up(bench, system, queue, config.pgbench_prefill)
        bench.settle(system)
        scripts = _scripts(step, system.key, queue, config.ack_archive)
        before = _length(bench, system, queue)
        workdir = workroot / f"{system.key}_{step.key}_{time.monotonic_ns()}"
        workdir.mkdir()
        postmaster = postmaster_pid(system.dsn)
        cpu_before = server_cpu_seconds(postmaster)
        t0 = time.monotonic()
        processes = {role: _Process(bench, system.dsn, s, workdir, role) for role, s in scripts.items()}
        runs = {role: p.finish() for role, p in processes.items()}
        wall = time.monotonic() - t0
        cpu_after = server_cpu_seconds(postmaster)
        after = _length(bench, system, queue)
        if fresh:
            bench.drop_queue(system, queue)

        seconds = float(run_seconds(config))
        enqueued = runs["enqueue"].transactions * scripts["enqueue"].batch if "enqueue" in runs else 0
        dequeued = before + enqueued - after
        rates: dict[str, float | None] = {}
        if "enqueue" in runs:
            rates["enqueue"] = enqueued / seconds
        if "dequeue" in runs:
            rates["dequeue"] = dequeued / seconds
        latencies = [ms for r in runs.values() for ms in r.latencies]
        moved = enqueued + (dequeued if "dequeue" in runs else 0)
        cpu = None
        if cpu_before is not None and cpu_after is not None and moved > 0:
            cpu = (cpu_after - cpu_before) / moved * 1e6
        for role, r in runs.items():
            batch = scripts[role].batch
            name = f"{step.label}: {role}" if len(runs) > 1 else step.label
            if first:
                result.series.append(
                    Series(name, system.key, "msg/s", [(t, tps * batch) for t, tps in r.progress])
                )
            if r.failed:
                result.errors.append(f"{system.key} {step.label} ({role}): {r.message}")
                out.append(f"{role} FAILED: {r.message}")
        drained = step.kind != "enqueue" and after == 0
        if drained:
            result.warnings.append(f"{system.key} {step.label}: the backlog ran out; raise --pgbench-prefill")
        out.extend(f"{role} {rate:,.0f} msg/s" for role, rate in rates.items() if rate is not None)
        out.append(f"wall {wall:.1f} s")
        result.extra.setdefault("runs", []).append(
            {
                "step": step.key,
                "system": system.key,
                "scripts": {role: s.text for role, s in scripts.items()},
                "transactions": {role: r.transactions for role, r in runs.items()},
                "pgbench_tps": {role: r.tps for role, r in runs.items()},
                "queue_before": before,
                "queue_after": after,
                "rates": rates,
            }
        )
        return _Measured(rates, latencies, cpu)
