"""How the failover traffic (tests/support/failover.py) judges a stream group's deliveries and a
schedule's ticks, from what the handler recorded and what the primary at the end holds.

- Order per key (docs/streams.md, "Order per key"): a key's messages are handled in the log's
  order. A redelivery (a batch handed out again) goes back to an earlier message of the key and
  repeats from there in order: the deliveries of a key step to its next message or back, never
  over one.
- An answered ack is never undone: a group's positions are appended, never updated
  (pgbroker.stream_position), so the primary at the end holds each partition's history of
  acked_id, which must never go back. A message delivered again after an ack that covered it
  had committed would need the cursor to go back; at-least-once allows redeliveries only of
  what no ack covered yet.
- No partition changes hands across a failover in which no consumer died: the consumers' leases
  outlast it, and each is seen reading again on the new primary.
- Each tick of a schedule once: every tick the schedule was given is sent once, never twice (the
  x-pgbroker-schedule header names the tick).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg
from psycopg import sql


@dataclass(frozen=True)
class Handled:
    """One delivery to the stream handler: the message's place in the log and in the traffic."""

    partition: int
    id: int
    key: str
    n: int  # the traffic's number of the send
    sent_at: float  # wall time of the send
    at: float  # wall time of the delivery
    pid: int  # the worker process's


def out_of_order_keys(handled: Iterable[Handled], log_order: dict[str, list[int]]) -> dict[str, list[int]]:
    """The keys whose deliveries stepped over a message of the key, or began after its first;
    for each, its deliveries (numbers, in handling order). ``log_order``: each key's numbers in
    the log's order on the primary at the end (a message handled from a primary that died
    without it is skipped: it is missing, which the traffic counts apart)."""
    delivered: dict[str, list[int]] = defaultdict(list)
    for delivery in handled:
        delivered[delivery.key].append(delivery.n)
    wrong = {}
    for key, numbers in delivered.items():
        place = {n: i for i, n in enumerate(log_order.get(key, []))}
        before = -1
        for n in numbers:
            at = place.get(n)
            if at is None:  # gone with the old primary (asynchronous): counted as missing, not here
                continue
            if at > before + 1:
                wrong[key] = numbers
                break
            before = at
    return wrong


def log_order(dsn: str, stream: str) -> dict[str, list[int]]:
    """Each key's numbers in the order of the stream's log on the server ``dsn`` reaches."""
    query = sql.SQL("SELECT key, (message->>'n')::bigint FROM {} ORDER BY id").format(
        sql.Identifier("pgbroker", f"s_{stream}")
    )
    order: dict[str, list[int]] = defaultdict(list)
    with psycopg.connect(dsn) as conn:
        for key, n in conn.execute(query):
            order[key].append(n)
    return dict(order)


def acks_undone(dsn: str, stream: str, group: str) -> int:
    """How many times a partition's acked_id went back, in the positions the group appended."""
    query = """
        SELECT count(*) FROM (
            SELECT acked_id < max(acked_id) OVER (PARTITION BY partition ORDER BY seq
                                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS back
            FROM pgbroker.stream_position WHERE stream_name = %s AND group_name = %s
        ) p WHERE back
    """
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query, (stream, group)).fetchone()
    assert row is not None
    return int(row[0])


def partition_owners(dsn: str, stream: str, group: str) -> dict[int, tuple[str | None, int]]:
    """Each partition of the group: its owner and the epoch it reads under (which goes up
    whenever the partition changes hands)."""
    query = """
        SELECT partition, owner, epoch FROM pgbroker.stream_cursor WHERE stream_name = %s AND group_name = %s
    """
    with psycopg.connect(dsn) as conn:
        return {p: (owner, epoch) for p, owner, epoch in conn.execute(query, (stream, group))}


def ticks_sent(dsn: str, queue: str) -> Counter[str]:
    """How many messages the primary holds for each tick (the x-pgbroker-schedule header's)."""
    query = sql.SQL("SELECT headers->'x-pgbroker-schedule'->>'tick' FROM {}").format(
        sql.Identifier("pgmq", f"q_{queue}")
    )
    with psycopg.connect(dsn) as conn:
        return Counter(tick for (tick,) in conn.execute(query))
