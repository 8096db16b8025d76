"""The benchmark harness: one server, three databases, the run's settings, progress and results.

Every scenario runs against the same server in one run: pgbroker in one database, the reference
pgmq 1.13 SQL (from the ``pgmq`` wheel) in another, and the naive queue of "Implementing Queues in
PostgreSQL" in a third. The server is a private embedded cluster in a fresh temporary directory
(so a benchmark never disturbs the default cluster or another one) unless ``--dsn`` names a server.
Scenario modules get a :class:`Bench` and return :class:`ScenarioResult` records; ``bench.report``
turns those into the table, the JSON, the plots and docs/performance.md.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeAlias

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgbroker._db.install import install as install_pgbroker
from pgbroker.embedded import EmbeddedPostgres

Conn: TypeAlias = psycopg.Connection[tuple[Any, ...]]

PGBROKER = "pgbroker"
PGMQ = "pgmq"
NAIVE = "naive"

#: Databases made by the harness; fixed names so that a run on a shared server cleans up after a
#: previous one, and distinctive so that they cannot be someone's real database.
DATABASES = {PGBROKER: "pgbroker_bench_pgbroker", PGMQ: "pgbroker_bench_pgmq", NAIVE: "pgbroker_bench_naive"}

#: The settings every report states.
REPORTED_SETTINGS = (
    "server_version",
    "synchronous_commit",
    "fsync",
    "full_page_writes",
    "wal_level",
    "shared_buffers",
    "work_mem",
    "max_wal_size",
    "checkpoint_timeout",
    "autovacuum",
    "autovacuum_naptime",
    "jit",
    "max_connections",
)

# The naive queue of the article: one table, a uuid key, an index on the insertion time.
_NAIVE_SCHEMA = """
CREATE SCHEMA queue_schema;
CREATE TABLE queue_schema.queue (
    element_identifier uuid PRIMARY KEY,
    time_inserted timestamp,
    payload json
);
CREATE INDEX time_inserted_idx ON queue_schema.queue (time_inserted ASC);
"""


# -- configuration ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """What to run and for how long. ``full()`` fits in 15 minutes on the 2-core machine."""

    mode: str
    scenarios: tuple[str, ...]
    # (a) pgbench
    pgbench_clients: int
    pgbench_threads: int
    pgbench_seconds: float
    pgbench_prefill: int
    #: each step runs the systems in this many rounds of pgbench_seconds / rounds, in alternating
    #: order (A B B A ...), so that a change in the machine's load weighs on every system alike
    pgbench_rounds: int
    pgbench_log_sampling: float
    # (b) producer/consumer driver
    driver_seconds: float
    #: as pgbench_rounds, for the driver's steps: rounds of driver_seconds / rounds, alternating
    driver_rounds: int
    producers: int
    consumers: int
    consume_prefill: int
    # (c) backlog scaling
    backlog_waiting: tuple[int, ...]
    backlog_in_flight: int
    backlog_due: int
    backlog_ops: int
    backlog_explain_ops: int
    # (d) bloat
    churn_seconds: float
    churn_rate: int
    # (e) client overhead
    client_seconds: float
    # acks delete (as pgmq.delete) or archive (as pgmq.archive / pgbroker.ack's default)
    ack_archive: bool = False
    # (f) worker runtimes side by side (bench.peer_table)
    #: jobs drained by the tuned worker, one process, per round (two processes: half as many)
    peer_messages: int = 100_000
    #: jobs drained by the workers with their libraries' defaults (one at a time for most)
    peer_default_messages: int = 2_000
    #: rounds of the tuned one-process drain, in alternating order (the other steps run once)
    peer_rounds: int = 2
    #: jobs enqueued 100 a call (a tenth of them one a call)
    peer_enqueue_messages: int = 10_000
    peer_steady_rate: int = 1_000
    peer_steady_seconds: float = 5.0
    peer_latency_samples: int = 15
    # (g) the job queue under load (bench.job_queue)
    #: handlers (W) of the depth steps
    job_workers: tuple[int, ...] = (1, 4, 16, 64)
    #: ready jobs the depth producer keeps
    job_depth: int = 2_000
    #: jobs a second of the fixed-rate phases (1.5x in the overload phase)
    job_rate: int = 1_000
    #: seconds of each depth step and each phase
    job_seconds: float = 10.0
    # (h) a stream group against PgQ (bench.stream_pgq)
    #: handlers (W) of its steps
    stream_workers: tuple[int, ...] = (1, 4, 16, 64)
    #: messages the producer keeps in flight (sent, not yet handled)
    stream_depth: int = 2_000
    #: seconds of a round; rounds per W, the systems in alternating order
    stream_seconds: float = 8.0
    stream_rounds: int = 2
    #: messages a second of its fixed-rate step (0: none)
    stream_rate: int = 1_000

    @staticmethod
    def full() -> Config:
        return Config(
            mode="full",
            scenarios=("a", "b", "c", "d", "e", "f", "g", "h"),
            pgbench_clients=15,
            pgbench_threads=2,
            pgbench_seconds=10.0,
            pgbench_prefill=600_000,
            pgbench_rounds=2,
            pgbench_log_sampling=0.2,
            driver_seconds=8.0,
            driver_rounds=2,
            producers=2,
            consumers=4,
            consume_prefill=300_000,
            # 12 million: past where a generic plan of a read would be compiled (jit_above_cost)
            backlog_waiting=(0, 100_000, 1_000_000, 12_000_000),
            backlog_in_flight=100_000,
            backlog_due=10_000,
            backlog_ops=200,
            backlog_explain_ops=20,
            churn_seconds=30.0,
            churn_rate=2_000,
            client_seconds=5.0,
        )

    @staticmethod
    def quick() -> Config:
        return replace(
            Config.full(),
            mode="quick",
            pgbench_seconds=2.0,
            pgbench_prefill=60_000,
            pgbench_rounds=1,
            driver_seconds=1.5,
            driver_rounds=1,
            consume_prefill=40_000,
            backlog_waiting=(0, 10_000, 100_000),
            backlog_in_flight=10_000,
            backlog_due=2_000,
            backlog_ops=40,
            backlog_explain_ops=5,
            churn_seconds=6.0,
            churn_rate=500,
            client_seconds=1.5,
            peer_messages=10_000,
            peer_default_messages=1_000,
            peer_rounds=1,
            peer_enqueue_messages=2_000,
            peer_steady_seconds=2.0,
            peer_latency_samples=5,
            job_workers=(1, 16, 64),
            job_seconds=3.0,
            job_rate=500,
            stream_seconds=3.0,
            stream_rounds=1,
        )


# -- results ---------------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of a scenario's table: a step, a metric, and a value per column (None: not run)."""

    step: str
    metric: str
    values: dict[str, float | None]
    #: a stable name for the step, for the targets (labels are for people and may change)
    key: str = ""


@dataclass
class Series:
    """A time series for the throughput-over-time plots: points are (seconds, value)."""

    group: str
    label: str
    unit: str
    points: list[tuple[float, float]]


@dataclass
class Histogram:
    """Latency samples (ms) of one step and one system, for the latency histograms."""

    group: str
    label: str
    samples: list[float]


@dataclass
class ScenarioResult:
    key: str
    title: str
    description: str
    columns: list[str]
    #: (numerator, denominator) column names of the ratio column, or None for no ratio.
    ratio: tuple[str, str] | None
    #: more ratio columns after that one, the same way
    more_ratios: list[tuple[str, str]] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    histograms: list[Histogram] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    #: metrics to plot as bars, one group of bars per step (on a log scale)
    bar_metrics: list[str] = field(default_factory=list)
    #: something failed: the figures it concerns are missing or wrong
    errors: list[str] = field(default_factory=list)
    #: the figures stand but need a caveat (a backlog ran out, consumers fell behind)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0


def percentile(samples: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by nearest rank; None without samples."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def percentile_ms(samples: Sequence[float], q: float) -> float | None:
    """The q-th percentile of samples in seconds, in milliseconds to 0.01 ms; None without samples."""
    found = percentile(samples, q)
    return None if found is None else round(found * 1000, 2)


def alternating_rounds(systems: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, system) for a step run in rounds: A B, then B A, then A B ...

    A change in the machine's load during the step then weighs on every system alike.
    """
    for n in range(max(1, rounds)):
        for key in systems if n % 2 == 0 else list(reversed(systems)):
            yield n, key


def mean_rate(rates: Sequence[float | None]) -> float | None:
    """The mean of a step's rates over its rounds; None if any round has none (it failed)."""
    if not rates or any(r is None for r in rates):
        return None
    return sum(r for r in rates if r is not None) / len(rates)


def json_payload(size: int) -> str:
    """A JSON object whose text is exactly ``size`` bytes (at least 8), like pgmq's 22 B and 1 KB."""
    if size < 8:
        raise ValueError("a JSON payload needs at least 8 bytes")
    return '{"p":"' + "x" * (size - 8) + '"}'


# -- progress --------------------------------------------------------------------------------------


class Progress:
    """One line per step on stdout, with the time since the run started and the step's own time."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def line(self, text: str) -> None:
        print(f"[{self.elapsed():7.1f} s] {text}", flush=True)

    @contextlib.contextmanager
    def step(self, label: str) -> Iterator[list[str]]:
        """Time a step; the caller appends a short outcome to the yielded list."""
        t0 = time.monotonic()
        outcome: list[str] = []
        try:
            yield outcome
        except Exception as exc:
            self.line(f"{label}: FAILED after {time.monotonic() - t0:.1f} s: {exc}")
            raise
        detail = "; ".join(outcome)
        self.line(f"{label}: {detail}  ({time.monotonic() - t0:.1f} s)" if detail else label)


# -- the server and its databases --------------------------------------------------------------------


def connect(dsn: str, *, prepare: bool = False) -> Conn:
    """An autocommit connection; with ``prepare`` every statement is prepared at its first run."""
    conn = psycopg.connect(dsn, autocommit=True)
    if prepare:
        conn.prepare_threshold = 0
    return conn


def _scratch_dir() -> Path:
    # On disk, not tmpfs: commits must pay for their WAL flush as on a real server.
    d = Path(tempfile.mkdtemp(prefix="pgbroker-bench-"))
    # As root the server runs as an unprivileged user, which must be able to enter it.
    d.chmod(0o711)
    return d


class Server:
    """The server the run uses: a private embedded cluster (default) or the one ``dsn`` names."""

    def __init__(self, dsn: str | None, data_dir: Path | None) -> None:
        self._given_dsn = dsn
        self._data_dir = data_dir
        self._scratch: Path | None = None
        self._embedded: EmbeddedPostgres | None = None
        self.admin_dsn = ""
        self.description = ""
        self.data_dir: Path | None = None

    def __enter__(self) -> Server:
        if self._given_dsn:
            self.admin_dsn = self._given_dsn
            params = conninfo_to_dict(self._given_dsn)
            self.description = f"server given with --dsn (host {params.get('host') or 'default'})"
            return self
        if self._data_dir is None:
            self._scratch = _scratch_dir()
            data_dir = self._scratch / "pg"
        else:
            data_dir = self._data_dir
        self._embedded = EmbeddedPostgres(data_dir)
        self.admin_dsn = self._embedded.start()
        self.data_dir = data_dir
        if self._scratch is not None:
            self.description = "private embedded cluster (initdb defaults, a fresh data directory on disk)"
        else:
            self.description = f"embedded cluster in {data_dir}"
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._embedded is not None:
            self._embedded.stop()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def dsn_for(self, dbname: str) -> str:
        return make_conninfo(self.admin_dsn, dbname=dbname)

    def settings(self) -> dict[str, str]:
        with connect(self.admin_dsn) as conn:
            rows = conn.execute(
                "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name",
                [list(REPORTED_SETTINGS)],
            ).fetchall()
            version = conn.execute("SELECT version()").fetchone()
        found = {str(name): str(value) for name, value in rows}
        found["version"] = str(version[0]) if version else ""
        return found

    def is_superuser(self) -> bool:
        with connect(self.admin_dsn) as conn:
            row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        return bool(row and row[0])


def _recreate_database(admin_dsn: str, name: str) -> None:
    with connect(admin_dsn) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))


def _drop_database(admin_dsn: str, name: str) -> None:
    with connect(admin_dsn) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def reference_pgmq_version() -> str:
    from tests.compat.reference import reference_version

    return reference_version()


def install_reference_pgmq(conn: Conn) -> None:
    # Shared with the differential tests: the wheel's pgmq.sql, in one transaction.
    from tests.compat.reference import install_reference

    install_reference(conn)


@dataclass(frozen=True)
class System:
    """A queue implementation under test and the database it lives in."""

    key: str
    label: str
    dsn: str


# -- the run ---------------------------------------------------------------------------------------


class Bench:
    """What a scenario gets: the config, the systems, progress, and helpers on queue tables."""

    def __init__(self, config: Config, server: Server, progress: Progress) -> None:
        self.config = config
        self.server = server
        self.progress = progress
        self.systems: dict[str, System] = {}
        self.superuser = False
        self.schema_version = ""
        self._queue_seq = 0

    def setup(self) -> None:
        self.superuser = self.server.is_superuser()
        labels = {
            PGBROKER: "pgbroker",
            PGMQ: f"pgmq {reference_pgmq_version()} SQL",
            NAIVE: "naive queue (article)",
        }
        for key, dbname in DATABASES.items():
            with self.progress.step(f"setup: database {dbname} ({labels[key]})") as out:
                _recreate_database(self.server.admin_dsn, dbname)
                dsn = self.server.dsn_for(dbname)
                with connect(dsn) as conn:
                    if key == PGBROKER:
                        result = install_pgbroker(conn)
                        self.schema_version = result.version
                        out.append(f"pgbroker schema version {result.version}")
                    elif key == PGMQ:
                        install_reference_pgmq(conn)
                        out.append("reference pgmq SQL installed")
                    else:
                        conn.execute(_NAIVE_SCHEMA.encode())
                        out.append("naive queue table created")
                self.systems[key] = System(key, labels[key], dsn)

    def teardown(self) -> None:
        for dbname in DATABASES.values():
            with contextlib.suppress(psycopg.Error):
                _drop_database(self.server.admin_dsn, dbname)

    # -- queues ------------------------------------------------------------------------------

    def new_queue_name(self, hint: str) -> str:
        """A fresh queue name per step, so that no step inherits another's dead tuples."""
        self._queue_seq += 1
        cleaned = "".join(c if c.isalnum() else "_" for c in hint.lower())[:30]
        return f"b{self._queue_seq}_{cleaned}"

    def create_queue(self, system: System, name: str) -> None:
        with connect(system.dsn) as conn:
            conn.execute("SELECT pgmq.create(%s)", [name])

    def drop_queue(self, system: System, name: str) -> None:
        with connect(system.dsn) as conn, contextlib.suppress(psycopg.Error):
            conn.execute("SELECT pgmq.drop_queue(%s)", [name])

    @staticmethod
    def queue_table(name: str) -> sql.Composed:
        return sql.SQL("pgmq.{}").format(sql.Identifier(f"q_{name.lower()}"))

    def fill_queue(self, system: System, name: str, count: int, payload: str) -> None:
        """Add ``count`` ready messages with one INSERT ... SELECT (fast; same rows as a send).

        vt = enqueued_at = now(), which is exactly what a send without delay stores in both
        implementations (pgbroker's ready index keys on it). Then VACUUM ANALYZE, so that a
        step starts from a settled table rather than from one whose hint bits are still unset.
        """
        if count <= 0:
            return
        with connect(system.dsn) as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (vt, message) SELECT now(), %s::jsonb FROM generate_series(1, %s)"
                ).format(self.queue_table(name)),
                [payload, count],
            )
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(self.queue_table(name)))

    def queue_length(self, system: System, name: str) -> int:
        with connect(system.dsn) as conn:
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(self.queue_table(name))).fetchone()
        return int(row[0]) if row else 0

    def settle(self, system: System) -> None:
        """Start a step from a checkpointed server, so that no step pays for another's writes."""
        if not self.superuser:
            return
        with connect(system.dsn) as conn, contextlib.suppress(psycopg.Error):
            conn.execute("CHECKPOINT")


def run_scenario(bench: Bench, body: Callable[[Bench, ScenarioResult], None], result: ScenarioResult) -> None:
    """Run one scenario; a failure is recorded in the result and the run goes on."""
    t0 = time.monotonic()
    bench.progress.line(f"== ({result.key}) {result.title}")
    try:
        body(bench, result)
    except Exception as exc:
        result.errors.append(f"{type(exc).__name__}: {exc}")
        traceback.print_exc(file=sys.stdout)
    result.seconds = time.monotonic() - t0


def machine() -> dict[str, Any]:
    load = os.getloadavg()
    return {
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in load],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "psycopg": psycopg.__version__,
    }
