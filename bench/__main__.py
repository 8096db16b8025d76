"""``python -m bench`` (``make bench``): run the scenarios against pgbroker and pgmq (and, in scenario
(f), the worker runtimes of PgQueuer, Procrastinate and a pgmq loop; ``--peers`` runs only that one),
print the ratios.

With no ``--dsn`` the run starts a private PostgreSQL cluster in a fresh temporary directory and
removes it at the end. Results go to bench/results/<timestamp>.json and bench/results/<timestamp>/
(PNG plots); a full run also regenerates the results block of docs/performance.md (``--docs`` makes
a quick run do so too, ``--no-docs`` stops a full one).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _scenarios() -> dict[str, ModuleType]:
    from bench import (
        backlog,
        bloat,
        client_overhead,
        job_queue,
        peer_table,
        pgbench_article,
        producer_consumer,
        stream_pgq,
    )

    return {
        "a": pgbench_article,
        "b": producer_consumer,
        "c": backlog,
        "d": bloat,
        "e": client_overhead,
        "f": peer_table,
        "g": job_queue,
        "h": stream_pgq,
    }


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x.replace("_", "")) for x in text.split(",") if x.strip())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark pgbroker against the reference pgmq SQL (and the article's naive queue), "
        "and its worker runtime against PgQueuer's, Procrastinate's and a pgmq loop (f).",
    )
    p.add_argument("--dsn", help="a superuser DSN of the server to use (default: a private embedded cluster)")
    p.add_argument("--data-dir", type=Path, help="keep the embedded cluster in this directory (reused)")
    p.add_argument("--quick", action="store_true", help="short durations and small backlogs: a smoke test")
    p.add_argument(
        "--only",
        help="scenarios to run, e.g. 'a,c' (a pgbench, b producer/consumer, "
        "c backlog, d bloat, e client overhead, f worker runtimes against PgQueuer, Procrastinate, pgmq, "
        "g a job queue under load: W handlers, claim latency, pressure and chaos, against a pgmq loop, "
        "h a stream group against PgQ: W handlers, order per key)",
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="run only the worker runtimes side by side (scenario f; same as --only f)",
    )
    p.add_argument("--results-dir", type=Path, default=ROOT / "bench" / "results")
    docs = p.add_mutually_exclusive_group()
    docs.add_argument("--docs", action="store_true", help="regenerate docs/performance.md even in --quick")
    docs.add_argument("--no-docs", action="store_true", help="leave docs/performance.md alone")
    p.add_argument(
        "--archive",
        action="store_true",
        help="acks archive (pgmq.archive, pgbroker.ack(..., true)) instead of deleting",
    )
    g = p.add_argument_group("durations and sizes (override the full or --quick preset)")
    g.add_argument("--pgbench-seconds", type=float)
    g.add_argument("--pgbench-clients", type=int)
    g.add_argument("--pgbench-threads", type=int)
    g.add_argument("--pgbench-prefill", type=int)
    g.add_argument("--pgbench-rounds", type=int, help="(a) runs per step and system, in alternating order")
    g.add_argument("--driver-seconds", type=float)
    g.add_argument("--driver-rounds", type=int, help="(b) runs per step and system, in alternating order")
    g.add_argument("--producers", type=int)
    g.add_argument("--consumers", type=int)
    g.add_argument("--consume-prefill", type=int)
    g.add_argument("--backlog-waiting", type=_ints, help="backlog sizes, e.g. 0,100000,1000000")
    g.add_argument("--backlog-in-flight", type=int)
    g.add_argument("--backlog-due", type=int, help="expired leases in the last backlog state (0: none)")
    g.add_argument("--backlog-ops", type=int)
    g.add_argument("--churn-seconds", type=float)
    g.add_argument("--churn-rate", type=int)
    g.add_argument("--client-seconds", type=float)
    g.add_argument("--peer-messages", type=int, help="(f) jobs per tuned drain (default 100000)")
    g.add_argument("--peer-default-messages", type=int, help="(f) jobs per drain with the defaults")
    g.add_argument("--peer-rounds", type=int, help="(f) rounds of the one-process drain, alternating")
    g.add_argument("--peer-enqueue-messages", type=int)
    g.add_argument("--peer-steady-rate", type=int, help="(f) jobs a second of the steady producer")
    g.add_argument("--peer-steady-seconds", type=float)
    g.add_argument("--peer-latency-samples", type=int)
    g.add_argument("--job-workers", type=_ints, help="(g) handlers W of the depth steps, e.g. 1,4,16,64")
    g.add_argument("--job-depth", type=int, help="(g) ready jobs the depth producer keeps")
    g.add_argument("--job-rate", type=int, help="(g) jobs a second of the fixed-rate phases")
    g.add_argument("--job-seconds", type=float, help="(g) seconds of each step and phase")
    g.add_argument("--stream-workers", type=_ints, help="(h) handlers W of its steps, e.g. 1,4,16,64")
    g.add_argument("--stream-depth", type=int, help="(h) messages the producer keeps in flight")
    g.add_argument("--stream-seconds", type=float, help="(h) seconds of a round")
    g.add_argument("--stream-rounds", type=int, help="(h) rounds per W, systems in alternating order")
    g.add_argument("--stream-rate", type=int, help="(h) messages a second of the fixed-rate step (0: none)")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> Any:
    from bench.harness import Config

    config = Config.quick() if args.quick else Config.full()
    overrides: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(args, f.name, None)
        if value is not None and f.name not in ("mode", "scenarios"):
            overrides[f.name] = value
    only = "f" if args.peers else args.only
    if only:
        wanted = tuple(s.strip() for s in only.split(",") if s.strip())
        unknown = set(wanted) - set(_scenarios())
        if unknown:
            raise SystemExit(f"unknown scenario(s) {sorted(unknown)}: choose from {', '.join(_scenarios())}")
        overrides["scenarios"] = wanted
    if args.archive:
        overrides["ack_archive"] = True
    return dataclasses.replace(config, **overrides)


def main(argv: list[str] | None = None) -> int:
    from bench import report
    from bench.harness import Bench, Progress, ScenarioResult, Server, machine, run_scenario
    from pgbroker._db.install_rules import latest_version

    args = parse_args(argv)
    config = build_config(args)
    progress = Progress()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    progress.line(f"pgbroker benchmark, {config.mode} run {stamp}: scenarios {', '.join(config.scenarios)}")
    start_machine = machine()
    results: list[ScenarioResult] = []
    modules = _scenarios()
    with Server(args.dsn, args.data_dir) as server:
        settings = server.settings()
        where = f" in {server.data_dir}" if server.data_dir else ""
        progress.line(f"server: {server.description}{where}")
        progress.line(f"settings: {report.settings_line(settings)}")
        bench = Bench(config, server, progress)
        try:
            bench.setup()
            for key in config.scenarios:
                module = modules[key]
                result = ScenarioResult(
                    key=key,
                    title=module.TITLE,
                    description="",
                    columns=list(module.COLUMNS),
                    ratio=getattr(module, "RATIO", ("pgbroker", "pgmq")),
                    more_ratios=list(getattr(module, "MORE_RATIOS", [])),
                )
                body: Callable[[Bench, ScenarioResult], None] = module.run
                run_scenario(bench, body, result)
                results.append(result)
        finally:
            if args.dsn or args.data_dir:
                bench.teardown()
    meta = {
        "timestamp": stamp,
        "mode": config.mode,
        "seconds": progress.elapsed(),
        "server": server.description,
        "settings": settings,
        "machine": start_machine,
        "load_at_end": [round(x, 2) for x in os.getloadavg()],
        "pgmq_version": _pgmq_version(),
        "pgbroker_schema_version": bench.schema_version,
        "pgbroker_schema_latest": latest_version(),
        "config": report.config_json(config),
        "argv": sys.argv[1:] if argv is None else argv,
    }
    outcomes = report.evaluate_targets(results)
    report.print_report(meta, results, outcomes)
    plots = report.write_plots(results, args.results_dir / stamp)
    json_path = args.results_dir / f"{stamp}.json"
    report.write_json(json_path, report.to_json(meta, results, outcomes))
    print()
    print(f"results: {json_path}")
    print(f"plots:   {args.results_dir / stamp}/ ({len(plots)} files)")
    if (config.mode == "full" and not args.no_docs) or args.docs:
        doc = ROOT / "docs" / "performance.md"
        report.write_docs(doc, report.markdown(meta, results, outcomes, plots), plots)
        print(f"docs:    {doc} (plots in {doc.parent / 'perf'})")
    print(f"total {progress.elapsed():.0f} s")
    return 1 if any(r.errors for r in results) else 0


def _pgmq_version() -> str:
    from bench.harness import reference_pgmq_version

    return reference_pgmq_version()


if __name__ == "__main__":
    sys.exit(main())
