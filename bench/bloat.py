"""Scenario (d): table and index size and dead tuples after sustained churn.

Both systems get the same workload: producers paced to a fixed rate (batches of 10) and consumers
reading 10 and acking as fast as messages come, for a fixed time, autovacuum as configured on the
server. Every second a sampler records the queue table's size, its indexes' size and its dead
tuples; at the end the table reports them with the share of updates that were HOT (an update that
changes an indexed column, or a column of a partial index's predicate, cannot be HOT and leaves
a dead index entry per index).
"""

from __future__ import annotations

import threading
import time
from typing import Any, LiteralString

from bench import driver
from bench.harness import (
    PGBROKER,
    PGMQ,
    Bench,
    Conn,
    Row,
    ScenarioResult,
    Series,
    System,
    connect,
    json_payload,
)

TITLE = "Bloat after sustained churn: sizes, dead tuples, HOT updates"
COLUMNS = [PGMQ, PGBROKER]
PAYLOAD = json_payload(22)

_SIZES: LiteralString = """
SELECT pg_relation_size(c.oid),
       pg_indexes_size(c.oid),
       pg_total_relation_size(c.oid),
       coalesce(s.n_dead_tup, 0),
       coalesce(s.n_live_tup, 0),
       coalesce(s.n_tup_upd, 0),
       coalesce(s.n_tup_hot_upd, 0),
       coalesce(s.autovacuum_count, 0),
       coalesce(s.n_tup_del, 0)
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = to_regclass(%s)
"""

_INDEXES: LiteralString = """
SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid)
FROM pg_index i WHERE i.indrelid = to_regclass(%s) ORDER BY 1
"""

MB = 1024 * 1024


def _sizes(conn: Conn, table: str) -> tuple[int, ...]:
    row = conn.execute(_SIZES, [table]).fetchone()
    return tuple(int(x) for x in row) if row else (0,) * 9


def run(bench: Bench, result: ScenarioResult) -> None:
    config = bench.config
    result.description = (
        f"{config.producers} producers paced to {config.churn_rate:,} msg/s in all (send_batch of 10), "
        f"{config.consumers} consumers (read 10 + ack), {config.churn_seconds:g} s per system, "
        "starting from an empty queue; autovacuum as the server is configured (see settings). "
        "Sizes are the queue table's (q_<name>), measured right after the run."
    )
    final: dict[str, dict[str, Any]] = {}
    for key in COLUMNS:
        final[key] = _churn(bench, bench.systems[key], result)
    metrics = [
        ("table MB", "heap", MB),
        ("indexes MB", "indexes", MB),
        ("total MB", "total", MB),
        ("dead tuples", "dead", 1),
        ("live tuples", "live", 1),
        ("HOT updates %", "hot_percent", 1),
        ("autovacuum runs", "autovacuum", 1),
        ("messages churned", "consumed", 1),
    ]
    for metric, field, scale in metrics:
        values: dict[str, float | None] = {}
        for key in COLUMNS:
            value = final[key].get(field)
            values[key] = None if value is None else float(value) / scale
        result.rows.append(Row("after churn", metric, values))
    result.extra["final"] = final


def _churn(bench: Bench, system: System, result: ScenarioResult) -> dict[str, Any]:
    config = bench.config
    queue = bench.new_queue_name("churn")
    table = f"pgmq.q_{queue.lower()}"
    with bench.progress.step(f"(d) {system.key:8} churn {config.churn_seconds:g} s") as out:
        bench.create_queue(system, queue)
        bench.settle(system)
        samples: list[tuple[float, tuple[int, ...]]] = []
        stop = threading.Event()
        started = threading.Event()

        def sample() -> None:
            with connect(system.dsn) as conn:
                started.wait(timeout=180)
                t0 = time.monotonic()
                while not stop.is_set():
                    samples.append((time.monotonic() - t0, _sizes(conn, table)))
                    stop.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            r = driver.run(
                driver.Workload(
                    system=system.key,
                    dsn=system.dsn,
                    queue=queue,
                    payload=PAYLOAD,
                    producers=config.producers,
                    producer_batch=10,
                    consumers=config.consumers,
                    consumer_batch=10,
                    seconds=config.churn_seconds,
                    archive=config.ack_archive,
                    rate=config.churn_rate,
                ),
                started,
            )
        finally:
            stop.set()
            sampler.join(timeout=10)
        # Backends report their table statistics at most once a second.
        time.sleep(1.5)
        with connect(system.dsn) as conn:
            heap, indexes, total, dead, live, upd, hot, autovacuum, deleted = _sizes(conn, table)
            index_sizes = {name: int(size) for name, size in conn.execute(_INDEXES, [table]).fetchall()}
        left = bench.queue_length(system, queue)
        bench.drop_queue(system, queue)
        for error in r.errors:
            result.errors.append(f"{system.key} churn: {error}")
        result.series.append(
            Series("queue table + indexes (MB)", system.key, "MB", [(t, s[2] / MB) for t, s in samples])
        )
        dead_points = [(t, float(s[3])) for t, s in samples]
        result.series.append(Series("dead tuples", system.key, "tuples", dead_points))
        out.append(
            f"{r.consumed / r.seconds:,.0f} msg/s churned, total {total / MB:.1f} MB, {dead:,} dead, "
            f"HOT {100 * hot / upd if upd else 0:.0f}%"
        )
        return {
            "heap": heap,
            "indexes": indexes,
            "total": total,
            "index_sizes": index_sizes,
            "dead": dead,
            "live": live,
            "updates": upd,
            "hot_updates": hot,
            "hot_percent": 100 * hot / upd if upd else None,
            "deletes": deleted,
            "autovacuum": autovacuum,
            "sent": r.sent,
            "consumed": r.consumed,
            "left_in_queue": left,
        }
