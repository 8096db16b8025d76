"""Query-plan regression test of stream reads: the statement that reads a partition walks the
(partition, id) index of one child table, and touches a number of buffers set by the batch, not
by the backlog (seen through auto_explain with nested statements, bench.buffers.PlanCapture)."""

from __future__ import annotations

import statistics
from typing import Any

import psycopg
from bench.buffers import PlanCapture

Conn = psycopg.Connection[Any]

BATCH = 100
#: Shared buffers the read of one batch of 100 small messages may touch (5-7 measured): index descents, the
#: pages holding the rows, the cursor row.
READ_BOUND = 30


def _read_buffers(conn: Conn, stream: str, backlog: int) -> tuple[int, set[str], set[str]]:
    conn.execute("SELECT pgbroker.create_stream(%s, 2)", (stream,))
    conn.execute("SELECT pgbroker.create_stream_group(%s, 'g', 'start')", (stream,))
    for _ in range(0, backlog, 50_000):
        conn.execute(
            "SELECT count(*) FROM pgbroker.stream_send_many(%s,"
            " array_fill('{\"n\": 1}'::jsonb, ARRAY[50000]))",
            (stream,),
        )
    conn.execute("VACUUM ANALYZE")
    capture = PlanCapture(conn)
    assert capture.enable(), "auto_explain needs a superuser session"
    # Well into the backlog, as a consumer catching up would be.
    conn.execute(
        "SELECT pgbroker._stream_positions_append(stream_name, group_name, array_agg(partition),"
        " array_fill(%s::bigint, ARRAY[count(*)::int]), array_fill(%s::bigint, ARRAY[count(*)::int]),"
        " array_fill(NULL::timestamptz, ARRAY[count(*)::int]))"
        " FROM pgbroker.stream_cursor GROUP BY stream_name, group_name",
        (backlog // 2, backlog // 2),
    )
    buffers, indexes, nodes = [], set(), set()
    for _ in range(6):
        plans = capture.call("SELECT * FROM pgbroker.stream_read(%s, 'g', 'c', %s)", [stream, BATCH])
        assert len(plans.rows) == BATCH
        reads = [p for p in plans.nested if f"pgbroker.s_{stream}_" in p.text and "WITH r AS" in p.text]
        assert reads, [p.text[:80] for p in plans.nested]
        buffers.append(sum(p.buffers for p in reads))
        for p in reads:
            indexes |= set(p.indexes)
            nodes |= set(p.node_types)
    return int(statistics.median(buffers[1:])), indexes, nodes


def test_a_read_touches_buffers_for_its_batch_not_the_backlog(conn: Conn) -> None:
    small, small_indexes, small_nodes = _read_buffers(conn, "small", 20_000)
    big, big_indexes, big_nodes = _read_buffers(conn, "big", 400_000)
    for indexes, nodes in ((small_indexes, small_nodes), (big_indexes, big_nodes)):
        assert any(i.endswith("partition_id_idx") for i in indexes), indexes
        # (the tiny cursor table is scanned whole: a page)
        assert not {"Bitmap Heap Scan", "Sort"} & nodes, nodes
    assert small <= READ_BOUND, f"a read of {BATCH} touched {small} buffers"
    assert big <= READ_BOUND, f"a read of {BATCH} touched {big} buffers with a backlog of 400,000"
