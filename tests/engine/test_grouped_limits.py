"""FIFO grouped reads (70_fifo_groups.sql) under a queue's limits: max_in_flight and the rate limit
cap how many messages a grouped read takes, never which ones (pgmq's FIFO order stays); priorities
and the per-key limit are not followed there (docs/job-features.md says why)."""

from __future__ import annotations

import pytest
from psycopg import sql

from tests.support.tables import Conn, jsonb_array

GROUPED_READS = ["read_grouped", "read_grouped_rr", "read_grouped_head"]


def _send_groups(conn: Conn, groups: list[str], headers: dict[str, object] | None = None) -> None:
    conn.execute(
        "SELECT pgmq.send_batch('q', %s::jsonb[], %s::jsonb[])",
        [
            jsonb_array([{"n": i} for i in range(len(groups))]),
            jsonb_array([{"x-pgmq-group": g, **(headers or {})} for g in groups]),
        ],
    )


def _read(conn: Conn, function: str, qty: int) -> list[int]:
    query = sql.SQL("SELECT msg_id FROM pgmq.{}('q', 30, %s)").format(sql.Identifier(function))
    rows = conn.execute(query, [qty]).fetchall()
    return [r[0] for r in rows]


@pytest.mark.parametrize("function", GROUPED_READS)
def test_max_in_flight_caps_grouped_reads(conn: Conn, function: str) -> None:
    conn.execute("SELECT pgmq.create('q')")
    _send_groups(conn, ["a", "b", "c", "d", "e", "a", "b", "c", "d", "e"])
    conn.execute("SELECT pgbroker.set_policy('q', max_in_flight => 3)")
    first = _read(conn, function, 10)
    assert first == [1, 2, 3] if function != "read_grouped" else first == [1, 6, 2]
    assert _read(conn, function, 10) == []
    conn.execute("SELECT pgmq.delete('q', %s)", [first[0]])
    assert len(_read(conn, function, 10)) == 1


def test_rate_limit_caps_grouped_reads_and_is_shared_with_plain_reads(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('q')")
    _send_groups(conn, [f"g{i}" for i in range(10)])
    conn.execute("SELECT pgbroker.set_policy('q', rate_limit_per_second => 3)")
    assert len(_read(conn, "read_grouped_rr", 10)) == 3
    assert _read(conn, "read_grouped_rr", 10) == []
    assert conn.execute("SELECT count(*) FROM pgmq.read('q', 30, 10)").fetchone() == (0,)


def test_grouped_reads_keep_fifo_order_whatever_the_priorities(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('q')")
    _send_groups(conn, ["a", "b"])
    _send_groups(conn, ["a", "b"], {"x-pgbroker-priority": 9})
    assert _read(conn, "read_grouped", 10) == [1, 3, 2, 4]  # group a's run, then group b's
