"""Plain-text tables for people: aligned columns, ages and local times, and the queue metrics
table that both `pgbroker metrics` and the demo print.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pgbroker.cli.support.output import shown
from pgbroker.queues._records import Metrics

__all__ = ["age", "local_time", "metrics_table", "table"]


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right_aligned: Sequence[int] = ()) -> str:
    """``header`` and ``rows`` in columns two spaces apart; the columns in ``right_aligned`` (by
    index) are aligned right, as numbers read best. Control characters in a cell are shown as
    escapes (``shown``): a cell is a line of its column."""
    rows = [[shown(cell) for cell in row] for row in rows]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if i in right_aligned else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    return "\n".join(line(row) for row in [header, *rows])


def age(seconds: int | None) -> str:
    """A duration in its two largest units (``45s``, ``3m07s``, ``2h05m``, ``1d03h``); ``-`` for none."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def local_time(value: datetime) -> str:
    """A timestamp in the local time zone, to the second."""
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def metrics_table(metrics: Sequence[Metrics]) -> str:
    """An aligned table of queue metrics, as `pgbroker metrics` prints it."""
    rows = [
        [
            m.queue_name,
            f"{m.queue_length:,}",
            f"{m.queue_visible_length:,}",
            age(m.oldest_msg_age_sec),
            age(m.newest_msg_age_sec),
            f"{m.total_messages:,}",
        ]
        for m in metrics
    ]
    header = ["QUEUE", "LENGTH", "VISIBLE", "OLDEST", "NEWEST", "TOTAL SENT"]
    return table(header, rows, right_aligned=range(1, len(header)))
