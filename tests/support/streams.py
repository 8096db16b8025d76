"""Raw-SQL helpers for the stream tests: a batch read and its ack, as any client in any language
would make them, so that the engine is tested without the Python client in between."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class Batch:
    rows: list[tuple[Any, ...]]  # (partition, id, epoch, key, enqueued_at, headers, message)

    @property
    def ids(self) -> list[int]:
        return [r[1] for r in self.rows]

    @property
    def messages(self) -> list[Any]:
        return [r[6] for r in self.rows]

    def ack_args(self) -> tuple[list[int], list[int], list[int]]:
        """(partitions, epochs, last ids): what stream_ack takes for this batch."""
        last: dict[int, tuple[int, int]] = {}
        for partition, msg_id, epoch, *_ in self.rows:
            last[partition] = (epoch, max(msg_id, last.get(partition, (0, 0))[1]))
        parts = sorted(last)
        return parts, [last[p][0] for p in parts], [last[p][1] for p in parts]


def send(conn: Conn, stream: str, messages: list[Any], keys: Sequence[str | None] | None = None) -> list[int]:
    rows = conn.execute(
        "SELECT pgbroker.stream_send_many(%s, %s::jsonb[], NULL, %s)",
        (stream, [Jsonb(m) for m in messages], keys),
    ).fetchall()
    return [r[0] for r in rows]


def read(
    conn: Conn,
    stream: str,
    group: str,
    consumer: str,
    qty: int = 100,
    lease: int = 30,
    generation: int | None = None,
) -> Batch:
    """A read, under the consumer's ``generation``; without one, the argument is left out, as a
    client of any release calls it (the upgrade tests read from schemas older than it)."""
    args: tuple[Any, ...] = (stream, group, consumer, qty, lease)
    if generation is None:
        rows = conn.execute("SELECT * FROM pgbroker.stream_read(%s, %s, %s, %s, %s)", args).fetchall()
    else:
        fenced = "SELECT * FROM pgbroker.stream_read(%s, %s, %s, %s, %s, generation => %s)"
        rows = conn.execute(fenced, (*args, generation)).fetchall()
    return Batch(rows)


def ack(
    conn: Conn,
    stream: str,
    group: str,
    consumer: str,
    batch: Batch,
    failed: list[int] | None = None,
    errors: list[str] | None = None,
) -> dict[int, bool]:
    parts, epochs, last = batch.ack_args()
    rows = conn.execute(
        "SELECT * FROM pgbroker.stream_ack(%s, %s, %s, %s, %s, %s, %s, %s)",
        (stream, group, consumer, parts, epochs, last, failed, errors),
    ).fetchall()
    return dict(rows)


def drain(conn: Conn, stream: str, group: str, consumer: str, qty: int = 100) -> list[int]:
    """Read and ack until a read comes back empty; the ids in the order read."""
    seen: list[int] = []
    while True:
        batch = read(conn, stream, group, consumer, qty)
        if not batch.rows:
            return seen
        seen.extend(batch.ids)
        ack(conn, stream, group, consumer, batch)
