"""Scenario (f): worker runtimes side by side: PgQueuer, Procrastinate, pgmq and pgbroker.

Every system registered in bench.peers runs on the same server in a database of its own, in the
same run: one producer's enqueue rate (one job a call, and 100 a call); drains of a backlog by
worker processes with a no-op handler, with the library's defaults (one process) and with the
settings its docs recommend for speed (one and two processes); a steady producer with one worker
(handled jobs a second, and the latency from the send call's start to the handler's start); and
the same latency on an idle queue (one job at a time, the worker asleep in between). The tuned
one-process drain runs in ``peer_rounds`` rounds in alternating order (A B C D, then D C B A), so
that a change in the machine's load weighs on every system alike; its rate is the mean of the
rounds. A system may cap its drains (Procrastinate: a few thousand jobs) so that the run stays
within its time; its rate is still jobs a second. Ratio columns: pgbroker against each peer (for
latency rows lower is better, so a ratio below 1 favours pgbroker).
"""

from __future__ import annotations

import asyncio
import contextlib

import psycopg

from bench.harness import Bench, Row, ScenarioResult, _drop_database, _recreate_database, percentile
from bench.peers import Peer, peers, runner

TITLE = "Worker runtimes side by side: enqueue, drain with a no-op handler, steady flow, idle latency"
#: the registry decides the columns (bench.peers.peers()); these are the ones it has without additions
COLUMNS = ["PgQueuer", "Procrastinate", "pgmq", "pgbroker", "pgbroker streams"]
RATIO = ("pgbroker", "PgQueuer")
MORE_RATIOS = [("pgbroker", "Procrastinate"), ("pgbroker", "pgmq")]

#: seconds between the jobs of the idle-latency step: longer than pgbroker's 250 ms notify
#: throttle, so that every job finds the worker asleep
IDLE_GAP = 0.3


def _rate_row(key: str, step: str, values: dict[str, float | None]) -> Row:
    return Row(step=step, metric="msg/s", values=values, key=key)


def run(bench: Bench, result: ScenarioResult) -> None:
    systems = peers()
    result.columns = list(systems)
    result.more_ratios = [
        ("pgbroker", key) for key in systems if key not in ("pgbroker", "PgQueuer") and "pgbroker" not in key
    ] + [(key, "PgQueuer") for key in systems if key.startswith("pgbroker ")]
    dsns = databases(bench, systems)
    result.extra["settings"] = {
        key: {"defaults": peer.describe(False), "tuned": peer.describe(True)} for key, peer in systems.items()
    }
    try:
        _enqueue(bench, result, systems, dsns)
        _drains(bench, result, systems, dsns)
        _flows(bench, result, systems, dsns)
    finally:
        if bench.server.data_dir is None or bench.config.mode == "quick":
            for peer in systems.values():
                with contextlib.suppress(psycopg.Error):
                    _drop_database(bench.server.admin_dsn, peer.database)
    result.description = _description(result)


def databases(bench: Bench, systems: dict[str, Peer]) -> dict[str, str]:
    dsns = {}
    for key, peer in systems.items():
        with bench.progress.step(f"(f) setup: database {peer.database} ({key})"):
            _recreate_database(bench.server.admin_dsn, peer.database)
            dsns[key] = bench.server.dsn_for(peer.database)
            asyncio.run(peer.install(dsns[key]))
    return dsns


def _cap(peer: Peer, count: int) -> int:
    return count if peer.drain_cap is None else min(count, peer.drain_cap)


def _enqueue(bench: Bench, result: ScenarioResult, systems: dict[str, Peer], dsns: dict[str, str]) -> None:
    total = bench.config.peer_enqueue_messages
    for batch, count in ((1, max(100, total // 10)), (100, total)):
        values: dict[str, float | None] = {}
        for key, peer in systems.items():
            with bench.progress.step(f"(f) enqueue {count:,}, {batch} a call: {key}") as out:
                values[key] = runner.enqueue_rate(
                    peer, dsns[key], bench.new_queue_name(f"enq{batch}"), count, batch
                )
                out.append(f"{values[key]:,.0f} msg/s")
        result.rows.append(_rate_row(f"enqueue-{batch}", f"enqueue, {batch} a call", values))


def _drains(bench: Bench, result: ScenarioResult, systems: dict[str, Peer], dsns: dict[str, str]) -> None:
    config = bench.config
    steps = [
        ("drain-default-1p", "defaults, 1 process", False, 1, config.peer_default_messages, 1),
        ("drain-tuned-1p", "tuned, 1 process", True, 1, config.peer_messages, config.peer_rounds),
        ("drain-tuned-2p", "tuned, 2 processes", True, 2, config.peer_messages // 2, 1),
    ]
    for key, label, tuned, processes, count, rounds in steps:
        rates: dict[str, list[float]] = {system: [] for system in systems}
        for n, system in _alternating(list(systems), rounds):
            peer = systems[system]
            jobs = _cap(peer, count)
            with bench.progress.step(f"(f) drain {jobs:,}, {label}, round {n + 1}: {system}") as out:
                drained = runner.drain(
                    peer, dsns[system], bench.new_queue_name(key), jobs, tuned=tuned, processes=processes
                )
                out.append(f"{drained.rate:,.0f} msg/s")
                if not drained.complete:
                    result.warnings.append(
                        f"{system}, {label}: cut short after {drained.handled:,} of {jobs:,} jobs"
                    )
            rates[system].append(drained.rate)
        caps = {system: _cap(systems[system], count) for system in systems}
        capped = [f"{system} {jobs:,}" for system, jobs in caps.items() if jobs != count]
        step = f"drain {count:,}, {label}" + (f" ({', '.join(capped)})" if capped else "")
        means = {system: sum(found) / len(found) if found else None for system, found in rates.items()}
        result.rows.append(_rate_row(key, step, means))
        if rounds > 1:
            result.extra[f"{key}-rounds"] = rates


def _flows(bench: Bench, result: ScenarioResult, systems: dict[str, Peer], dsns: dict[str, str]) -> None:
    config = bench.config
    rate, seconds = config.peer_steady_rate, config.peer_steady_seconds
    steady: dict[str, runner.Flow] = {}
    idle: dict[str, runner.Flow] = {}
    for system, peer in systems.items():
        with bench.progress.step(f"(f) steady {rate:,}/s for {seconds:g} s, tuned worker: {system}") as out:
            steady[system] = runner.steady(
                peer, dsns[system], bench.new_queue_name("steady"), rate=rate, seconds=seconds
            )
            out.append(f"{steady[system].rate:,.0f} msg/s handled")
        with bench.progress.step(f"(f) idle latency, {config.peer_latency_samples} jobs: {system}") as out:
            idle[system] = runner.idle_latency(
                peer,
                dsns[system],
                bench.new_queue_name("idle"),
                samples=config.peer_latency_samples,
                gap=IDLE_GAP,
            )
            out.append(f"p50 {_ms(idle[system].latencies, 50)} ms")
    label = f"steady {rate:,}/s, 1 worker"
    result.rows.append(_rate_row("steady", label, {k: f.rate for k, f in steady.items()}))
    for q in (50, 95):
        result.rows.append(
            Row(label, f"p{q} ms", {k: _ms(f.latencies, q) for k, f in steady.items()}, key=f"steady-p{q}")
        )
    for q in (50, 95):
        result.rows.append(
            Row(
                "idle queue, send -> handler start",
                f"p{q} ms",
                {k: _ms(f.latencies, q) for k, f in idle.items()},
                key=f"idle-p{q}",
            )
        )


def _ms(samples: list[float], q: float) -> float | None:
    found = percentile(samples, q)
    return None if found is None else found * 1000


def _alternating(systems: list[str], rounds: int) -> list[tuple[int, str]]:
    from bench.harness import alternating_rounds

    return list(alternating_rounds(systems, rounds))


def _description(result: ScenarioResult) -> str:
    settings = result.extra.get("settings", {})
    parts = [f"{key}: defaults {s['defaults']}; tuned {s['tuned']}" for key, s in settings.items()]
    return (
        "Each system in its own database on this server, workers in processes of their own, a no-op "
        "handler. Drains count from the first handler call until the system reports no job left "
        "(handled and acknowledged). Settings: " + " | ".join(parts) + "."
    )
