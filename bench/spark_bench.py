"""Spark pipeline throughput: batch write, batch read, streaming queue to queue, and streaming read
with release, through the ``pgbroker`` data source; with the Postgres and Spark settings used.

    python -m bench.spark_bench                      # a private embedded cluster, local[2]
    python -m bench.spark_bench --dsn postgresql://... --messages 1000000 --master 'local[*]'

Targets on the reference 2-core machine: batch read >= 300k msg/s, write >= 150k msg/s,
streaming queue to queue >= 50k msg/s with 100k-row micro-batches. Spark's fixed costs (session
start, first query, Python worker start) are paid by a warm-up and left out of the figures; a
streaming figure counts the micro-batches after the first, whose time includes the query's start.

On a machine shared with other work the rates swing with its load; the CPU time used per message
(by the embedded Postgres, and by this process with Spark's JVM and Python workers) does much
less, and is printed beside them (Linux only; Postgres only for the embedded cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.harness import REPORTED_SETTINGS
from pgbroker._db.install import install
from pgbroker.embedded import EmbeddedPostgres

SPARK_SETTINGS = (
    "spark.master",
    "spark.driver.memory",
    "spark.sql.shuffle.partitions",
    "spark.sql.execution.arrow.maxRecordsPerBatch",
    "spark.python.worker.reuse",
)
TARGETS = {"batch write": 150_000, "batch read": 300_000, "stream queue -> queue": 50_000}
DATABASE = "pgbroker_bench_spark"


@dataclass
class Result:
    scenario: str
    messages: int
    seconds: float
    # CPU microseconds per message over the scenario's measured runs (None: not measured).
    postgres_us: float | None = None
    client_us: float | None = None

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.spark_bench", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--dsn", help="a superuser DSN (default: a private embedded cluster in a temporary directory)"
    )
    p.add_argument("--messages", type=int, default=500_000, help="messages per scenario (500000)")
    p.add_argument("--batch-rows", type=int, default=100_000, help="rows per micro-batch (100000)")
    p.add_argument("--master", default="local[2]", help="Spark master (local[2])")
    p.add_argument("--partitions", type=int, default=2, help="read and write partitions (2)")
    p.add_argument("--repeat", type=int, default=2, help="runs of each batch scenario; the best is kept (2)")
    p.add_argument("--json", type=Path, help="also write the results and settings to this file")
    return p.parse_args(argv)


class CpuMeter:
    """CPU seconds used so far by process trees: this process (the driver, Spark's JVM and its
    Python workers) and the embedded cluster's postmaster (its backends, exited ones included)."""

    def __init__(self, postmaster: int | None) -> None:
        self.roots = {"client": os.getpid(), "postgres": postmaster}

    def read(self) -> dict[str, float | None]:
        return {name: None if pid is None else tree_cpu(pid) for name, pid in self.roots.items()}

    def per_message(self, before: dict[str, float | None], messages: int) -> tuple[float | None, ...]:
        after = self.read()
        return tuple(
            None if b is None or after[k] is None else (after[k] - b) * 1e6 / messages  # type: ignore[operator]
            for k, b in before.items()
        )


def tree_cpu(root: int) -> float | None:
    """CPU seconds of ``root`` and its descendants: each live process's own time and that of its
    exited children (their time moves to their parent's cutime/cstime when reaped)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent pid, CPU seconds)
    tick = os.sysconf("SC_CLK_TCK")
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        stats[int(entry.name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]) / tick)
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
            todo += children.get(pid, [])
    return total


@contextmanager
def server(dsn: str | None) -> Iterator[tuple[str, int | None]]:
    """A superuser DSN and the postmaster's pid: the DSN given (pid None), or a private embedded
    cluster removed at the end."""
    if dsn:
        yield dsn, None
        return
    tmp = Path(
        tempfile.mkdtemp(
            prefix="pgbroker-spark-bench-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None
        )
    )
    tmp.chmod(0o711)  # as root the server runs as another user, which must enter it
    cluster = EmbeddedPostgres(tmp / "pg")
    try:
        dsn = cluster.start()
        yield dsn, int((cluster.data_dir / "postmaster.pid").read_text().split()[0])
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def fresh_database(admin_dsn: str) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=DATABASE)
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn)
        for queue in ("bench_in", "bench_out", "bench_stream", "warm"):
            conn.execute("SELECT pgmq.create(%s)", (queue,))
    return dsn


def fill(dsn: str, queue: str, count: int) -> None:
    """Messages like the demo's orders, sent through pgmq.send_batch in chunks."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for first in range(0, count, 100_000):
            conn.execute(
                "SELECT count(*) FROM pgmq.send_batch(%s, ARRAY(SELECT jsonb_build_object("
                "'order_id', g, 'customer', 'customer-' || g %% 97, 'total_cents', 500 + g * 37 %% 9500)"
                " FROM generate_series(%s::int, %s::int) g ORDER BY g))",
                (queue, first, min(first + 100_000, count) - 1),
            )
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier("pgmq", f"q_{queue}")))


def settings(dsn: str, spark: Any) -> dict[str, dict[str, str]]:
    with psycopg.connect(dsn) as conn:
        pg = {
            name: str(conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0])  # type: ignore[index]
            for name in REPORTED_SETTINGS
        }
    conf = spark.sparkContext.getConf()
    spark_settings = {name: conf.get(name) or _session_conf(spark, name) for name in SPARK_SETTINGS}
    spark_settings["spark.version"] = spark.version
    import pyarrow

    host = {
        "cpus": str(os.cpu_count()),
        "python": platform.python_version(),
        "pyarrow": pyarrow.__version__,
        "platform": platform.platform(),
        "load average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    return {"postgres": pg, "spark": spark_settings, "host": host}


def _session_conf(spark: Any, name: str) -> str:
    try:
        return str(spark.conf.get(name))
    except Exception:  # not set and without a default
        return "(default)"


def timed(run: Callable[[], None]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def bench_write(spark: Any, dsn: str, args: argparse.Namespace, meter: CpuMeter) -> Result:
    from pyspark.sql import functions as F

    orders = (
        spark.range(0, args.messages, numPartitions=args.partitions)
        .select(
            F.to_json(
                F.struct(
                    F.col("id").alias("order_id"),
                    F.concat(F.lit("customer-"), F.col("id") % 97).alias("customer"),
                    (F.lit(500) + F.col("id") * 37 % 9500).alias("total_cents"),
                )
            ).alias("message")
        )
        .cache()
    )
    orders.count()  # generated once, outside the measurement
    best = float("inf")
    before = meter.read()
    for _ in range(args.repeat):
        purge(dsn, "bench_in")
        best = min(
            best,
            timed(
                lambda: (
                    orders.write.format("pgbroker")
                    .option("queue", "bench_in")
                    .option("dsn", dsn)
                    .mode("append")
                    .save()
                )
            ),
        )
    cpu = meter.per_message(before, args.messages * args.repeat)
    orders.unpersist()
    assert count(dsn, "q_bench_in") == args.messages
    return Result("batch write", args.messages, best, *cpu)


def bench_read(
    spark: Any, dsn: str, args: argparse.Namespace, meter: CpuMeter, columns: str | None = None
) -> Result:
    reader = (
        spark.read.format("pgbroker")
        .option("queue", "bench_in")
        .option("dsn", dsn)
        .option("numPartitions", str(args.partitions))
    )
    df = (reader.option("columns", columns) if columns else reader).load()
    # The noop sink makes Spark read every column of every row, and keeps nothing.
    before = meter.read()
    best = min(timed(lambda: df.write.format("noop").mode("overwrite").save()) for _ in range(args.repeat))
    cpu = meter.per_message(before, args.messages * args.repeat)
    return Result(f"batch read ({columns})" if columns else "batch read", args.messages, best, *cpu)


def bench_stream(spark: Any, dsn: str, args: argparse.Namespace, meter: CpuMeter, *, sink: str) -> Result:
    """bench_stream to bench_out (sink "pgbroker") or to nowhere ("noop"), archiving what it read."""
    source = "bench_stream"
    purge(dsn, source)
    fill(dsn, source, args.messages)
    checkpoint = tempfile.mkdtemp(prefix="pgbroker-spark-bench-ckpt-")
    try:
        stream = (
            spark.readStream.format("pgbroker")
            .option("queue", source)
            .option("dsn", dsn)
            .option("maxRowsPerBatch", str(args.batch_rows))
            .option("numPartitions", str(args.partitions))
            .load()
        )
        if sink == "pgbroker":
            writer = (
                stream.select("message", "headers")
                .writeStream.format("pgbroker")
                .option("queue", "bench_out")
                .option("dsn", dsn)
            )
        else:
            writer = stream.writeStream.format("noop")
        before = meter.read()
        query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        query.awaitTermination()
        # All the batches, the first one too: CPU does not wait for the query to start.
        cpu = meter.per_message(before, args.messages)
        batches = [
            (int(p["numInputRows"]), p["durationMs"]["triggerExecution"]) for p in query.recentProgress
        ]
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    assert count(dsn, f"q_{source}") == 0, "every batch, the last one too, must be released"
    steady = [b for b in batches[1:] if b[0] > 0] or batches
    name = "stream queue -> queue" if sink == "pgbroker" else "stream read + release"
    return Result(name, sum(rows for rows, _ in steady), sum(ms for _, ms in steady) / 1000, *cpu)


def purge(dsn: str, queue: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgmq.purge_queue(%s)", (queue,))


def count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier("pgmq", table))
        ).fetchone()
    return int(row[0]) if row else 0


def report(results: list[Result], conf: dict[str, dict[str, str]], args: argparse.Namespace) -> str:
    lines = [
        f"pgbroker Spark pipeline benchmark: {args.messages:,} messages, {args.partitions} partitions, "
        f"micro-batches of {args.batch_rows:,} rows",
        "",
        f"{'scenario':<32}{'messages':>11}{'seconds':>9}{'msg/s':>10}{'CPU us/msg: pg':>16}{'client':>8}"
        "   target",
    ]
    for r in results:
        target = TARGETS.get(r.scenario)
        verdict = f">= {target:,}  {'OK' if r.rate >= target else 'BELOW'}" if target else ""
        cpu = "".join(
            f"{'-' if us is None else f'{us:.1f}':>{w}}" for us, w in ((r.postgres_us, 16), (r.client_us, 8))
        )
        lines.append(f"{r.scenario:<32}{r.messages:>11,}{r.seconds:>9.2f}{r.rate:>10,.0f}{cpu}   {verdict}")
    for section, values in conf.items():
        lines += ["", f"{section}:"] + [f"  {k} = {v}" for k, v in values.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pgbroker.spark import session

    with server(args.dsn) as (admin_dsn, postmaster):
        meter = CpuMeter(postmaster)
        dsn = fresh_database(admin_dsn)
        spark = session.start(
            "pgbroker spark bench",
            master=args.master,
            conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": str(args.partitions)},
            ship=False,
        )
        try:
            # Warm-up: JVM code paths, Python workers (and the modules they import to read and to
            # write), the data source's first planning.
            fill(dsn, "warm", 10_000)
            warm = spark.read.format("pgbroker").option("queue", "warm").option("dsn", dsn).load()
            warm.select("message").write.format("pgbroker").option("queue", "warm").option("dsn", dsn).mode(
                "append"
            ).save()
            conf = settings(dsn, spark)
            results: list[Result] = []
            scenarios: list[Callable[[], Result]] = [
                lambda: bench_write(spark, dsn, args, meter),
                lambda: bench_read(spark, dsn, args, meter),
                lambda: bench_read(spark, dsn, args, meter, "msg_id,message"),
                lambda: bench_stream(spark, dsn, args, meter, sink="pgbroker"),
                lambda: bench_stream(spark, dsn, args, meter, sink="noop"),
            ]
            for scenario in scenarios:
                results.append(scenario())
                done = results[-1]
                print(f"  {done.scenario}: {done.rate:,.0f} msg/s", file=sys.stderr, flush=True)
        finally:
            spark.stop()
    print(report(results, conf, args))
    if args.json:
        payload = {"results": [{**asdict(r), "msgs_per_s": r.rate} for r in results], "settings": conf}
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
