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


def test_a_consumer_keeping_up_does_not_scan_the_lock_table(conn: Conn) -> None:
    """The safe id's advance looked at pg_locks at every read that found new ids: a scan of the
    whole lock table, whose cost grows with every lock of the cluster (90 idle sessions holding
    30 locks each doubled a consumer's read, 1.0 -> 2.1 ms). When no transaction writes the log,
    a probe of its lock now decides, and the messages are read at once all the same."""
    conn.execute("SELECT pgbroker.create_stream('probe', 2)")
    conn.execute("SELECT pgbroker.create_stream_group('probe', 'g', 'start')")
    capture = PlanCapture(conn)
    assert capture.enable(), "auto_explain needs a superuser session"
    read = "SELECT id FROM pgbroker.stream_read('probe', 'g', 'c', 100)"
    for n in range(1, 4):
        sent = conn.execute(
            "SELECT * FROM pgbroker.stream_send_many('probe', array_fill('{}'::jsonb, ARRAY[%s]))", [n]
        ).fetchall()
        plans = capture.call(read, [])
        assert sorted(r[0] for r in plans.rows) == sorted(r[0] for r in sent)
        scans = [p.text for p in plans.nested if "pg_locks" in p.text or "pgbroker._writers(" in p.text]
        assert not scans, scans


def test_a_read_walks_every_partition_of_a_segment_in_one_statement(conn: Conn) -> None:
    """The read of a batch called the stream's read function once a partition (35-40 us a call,
    most of it the call itself): 8 calls for a batch from 8 partitions. It now reads every
    partition of the segment in one statement, an index walk each, an even share each."""
    conn.execute("SELECT pgbroker.create_stream('wide', 8)")
    conn.execute("SELECT pgbroker.create_stream_group('wide', 'g', 'start')")
    conn.execute(
        "SELECT count(*) FROM pgbroker.stream_send_many('wide', array_fill('{}'::jsonb, ARRAY[800]))"
    )
    capture = PlanCapture(conn)
    assert capture.enable(), "auto_explain needs a superuser session"
    plans = capture.call("SELECT partition, id FROM pgbroker.stream_read('wide', 'g', 'c', 400)", [])
    by_partition: dict[int, list[int]] = {}
    for partition, msg_id in plans.rows:
        by_partition.setdefault(partition, []).append(msg_id)
    assert {p: len(ids) for p, ids in by_partition.items()} == {p: 50 for p in range(8)}
    assert all(ids == sorted(ids) for ids in by_partition.values())
    reads = [p for p in plans.nested if "pgbroker.s_wide_" in p.text and "WITH r AS" in p.text]
    assert len(reads) == 1, [p.text[:120] for p in reads]
    nodes = set(reads[0].node_types)
    assert not {"Seq Scan", "Bitmap Heap Scan", "Sort"} & nodes, nodes
