"""The PNG charts of ``archive-report``, drawn with matplotlib from the (small) aggregated rows."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from pgbroker.spark.requirements import INSTALL_HINT, MissingRequirement

Rows = Sequence[dict[str, Any]]
BUCKET = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1), "day": timedelta(days=1)}


def check_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingRequirement(
            "matplotlib is not installed: archive-report draws its charts with it", hint=INSTALL_HINT
        ) from None


def _pyplot() -> Any:
    import matplotlib

    # No display needed: the jobs run on servers.
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def throughput(rows: Rows, bucket: str, path: Path, queue: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    times = [r["bucket"] for r in rows]
    ax.plot(times, [r["enqueued"] for r in rows], label="enqueued", marker=".")
    ax.plot(times, [r["archived"] for r in rows], label="archived", marker=".")
    _time_axis(ax, times, bucket)
    ax.set_title(f"{queue}: messages per {bucket} (UTC)")
    ax.set_ylabel(f"messages / {bucket}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    return _save(plt, fig, path)


def latency(rows: Rows, bucket: str, path: Path, queue: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    times = [r["bucket"] for r in rows]
    for key, label in (("p50_ms", "p50"), ("p90_ms", "p90"), ("p99_ms", "p99"), ("max_ms", "max")):
        ax.plot(times, [max(r[key], 0.001) for r in rows], label=label, marker=".")
    _time_axis(ax, times, bucket)
    ax.set_yscale("log")
    ax.set_title(f"{queue}: end-to-end latency (enqueued -> archived) per {bucket} (UTC)")
    ax.set_ylabel("milliseconds (log scale)")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    fig.autofmt_xdate()
    return _save(plt, fig, path)


def read_ct(rows: Rows, path: Path, queue: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar([str(r["read_ct"]) for r in rows], [r["messages"] for r in rows])
    ax.set_yscale("log")
    ax.set_title(f"{queue}: deliveries per archived message (read_ct)")
    ax.set_xlabel("read_ct (0: archived without being read)")
    ax.set_ylabel("messages (log scale)")
    ax.grid(alpha=0.3, axis="y")
    return _save(plt, fig, path)


def _time_axis(ax: Any, times: Sequence[Any], bucket: str) -> None:
    # A single bucket would otherwise get an axis spanning years.
    if times and min(times) == max(times):
        ax.set_xlim(times[0] - BUCKET[bucket], times[0] + BUCKET[bucket])


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
