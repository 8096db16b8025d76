"""Where a micro-batch on a stream ends in each partition: every row up to the safe id, or, under
maxRowsPerBatch, a share of the rows of each partition.

The limit is shared by water-filling: a partition with fewer rows waiting than an even share takes
them all, and what it leaves goes to the others. An even split alone would cut the batches to the
busiest partition's share when keys are skewed (one key's partition holding most of the backlog).
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from pgbroker import _sql
from pgbroker.spark.connect import Connection


def share(available: Sequence[int], limit: int) -> list[int]:
    """How many rows each partition gives to a batch of at most ``limit`` rows, given how many
    each has waiting: all of them when they fit, else a fair share (earlier partitions take the
    remainder's extra rows)."""
    taken = [0] * len(available)
    left = limit
    open_parts = [p for p, n in enumerate(available) if n > 0]
    while left > 0 and open_parts:
        each, extra = divmod(left, len(open_parts))
        if each == 0:
            for p in open_parts[:extra]:
                taken[p] += 1
            break
        still = []
        for p in open_parts:
            give = min(each, available[p] - taken[p])
            taken[p] += give
            left -= give
            if taken[p] < available[p]:
                still.append(p)
        if len(still) == len(open_parts):
            # Everyone took a full share: hand out the remainder and stop.
            for p in still[:extra]:
                taken[p] += 1
            break
        open_parts = still
    return taken


def batch_ends(
    conn: Connection, table: str, starts: Sequence[int], bound: int, limit: int | None
) -> list[int]:
    """Per partition p: the last id of the next batch (starts[p] when it has no row there)."""
    log = sql.Identifier("pgbroker", table)
    partitions = list(range(len(starts)))
    # Rows waiting per partition, counted on the (partition, id) index up to the limit.
    counted = conn.execute(
        sql.SQL(_sql.queries("spark_stream")["spark_stream_waiting"]).format(log=log),
        (bound, 1 if limit is None else limit, partitions, list(starts)),
    ).fetchall()
    available = [int(r[0]) for r in counted]
    if limit is None:
        return [bound if n else a for a, n in zip(starts, available, strict=True)]
    taken = share(available, limit)
    ends = [bound if t and t == n else a for a, n, t in zip(starts, available, taken, strict=True)]
    cut = [p for p in partitions if 0 < taken[p] < available[p]]
    if cut:
        # The taken-th row after the start: the last of the partition's share.
        rows = conn.execute(
            sql.SQL(_sql.queries("spark_stream")["spark_stream_kth_after"]).format(log=log),
            (bound, cut, [starts[p] for p in cut], [taken[p] for p in cut]),
        ).fetchall()
        for p, end in rows:
            ends[int(p)] = int(end)
    return ends
