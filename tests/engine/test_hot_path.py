"""The hot path: session-prepared statements, pgbroker.consume, and where reads start (queue_head).

The prepared statements must survive what a session can do to them (DEALLOCATE ALL, DISCARD ALL, a
queue dropped and created again); consume must ack exactly as pgbroker.ack does; and ready_from,
the msg_id reads start at, must never pass a message that is or can become ready: not one sent by
a transaction still open while reads advance it, and not one that set_vt makes ready again.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.support.tables import Conn, a_ids, advance_head, q_ids


@pytest.fixture
def conn(module_conn: Conn) -> Conn:
    return module_conn


@pytest.fixture
def q(module_conn: Conn) -> str:
    name = f"h{uuid.uuid4().hex[:16]}"
    module_conn.execute("SELECT pgmq.create(%s)", [name])
    return name


def _send(conn: Conn, q: str, n: int) -> list[int]:
    msgs = [json.dumps({"n": i}) for i in range(n)]
    return [r[0] for r in conn.execute("SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])", [q, msgs])]


def _read(conn: Conn, q: str, qty: int, vt: int = 30) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT msg_id, receipt FROM pgbroker.read(%s, %s, %s)", [q, vt, qty]).fetchall()


def _advance(dsn: str, q: str, times: int = 3) -> int:
    """Advance q's ready_from ``times`` times, each in a transaction of its own; return it."""
    return int(advance_head(dsn, q, times)["ready_from"])


def _dsn(conn: Conn) -> str:
    return conn.info.dsn


# -- prepared statements -------------------------------------------------------------------------


def test_reads_survive_deallocate_and_discard(conn: Conn, q: str) -> None:
    ids = _send(conn, q, 6)
    assert [r[0] for r in _read(conn, q, 2)] == ids[:2]
    conn.execute("DEALLOCATE ALL")
    assert [r[0] for r in _read(conn, q, 2)] == ids[2:4]
    conn.execute("DISCARD ALL")
    assert [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.pop(%s, 2)", [q])] == ids[4:]


def test_a_queue_dropped_and_created_again_is_found_again(conn: Conn, q: str) -> None:
    _send(conn, q, 2)
    assert len(_read(conn, q, 1)) == 1  # prepares the session's statements for q
    conn.execute("SELECT pgmq.drop_queue(%s)", [q])
    with pytest.raises(psycopg.Error) as missing:
        _read(conn, q, 1)
    assert missing.value.sqlstate == "PB002"
    conn.execute("SELECT pgmq.create(%s)", [q])
    ids = _send(conn, q, 3)
    assert [r[0] for r in _read(conn, q, 3)] == ids


def test_statements_run_generic_plans_on_the_partial_indexes(conn: Conn, q: str) -> None:
    # Enough rows that a scan of the whole table is the dearer plan (on a page or two it is not).
    _send(conn, q, 5000)
    conn.execute(sql.SQL("ANALYZE pgmq.{}").format(sql.Identifier(f"q_{q}")))
    for _ in range(3):
        _read(conn, q, 2)
    # The statement a route runs for q, prepared here as the dynamic path prepares it.
    name = conn.execute("SELECT pgbroker._statement_name(%s, 'deliver')", [f"q_{q}"]).fetchone()
    statement = conn.execute("SELECT pgbroker._statement(%s, 'deliver')", [f"q_{q}"]).fetchone()
    assert name is not None
    assert statement is not None
    conn.execute(statement[0].encode())
    with conn.transaction():
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        explain = sql.SQL("EXPLAIN EXECUTE {} (10, NULL, clock_timestamp(), 30, 0, NULL)")
        plan = conn.execute(explain.format(sql.Identifier(name[0]))).fetchall()
    text = "\n".join(r[0] for r in plan)
    assert f"q_{q}_ready_idx" in text
    assert "msg_id >= $5" in text
    assert f"q_{q}_vt_idx" in text
    assert "Seq Scan" not in text


# -- consume -------------------------------------------------------------------------------------


def test_consume_acks_the_batch_before_and_reads_the_next(conn: Conn, q: str) -> None:
    ids = _send(conn, q, 5)
    first = conn.execute("SELECT msg_id, receipt FROM pgbroker.consume(%s, 30, 2)", [q]).fetchall()
    assert [r[0] for r in first] == ids[:2]
    second = conn.execute(
        "SELECT msg_id, receipt FROM pgbroker.consume(%s, 30, 2, %s::text[])", [q, [r[1] for r in first]]
    ).fetchall()
    assert [r[0] for r in second] == ids[2:4]
    # archive NULL follows the policy's ack_mode: archive by default.
    assert a_ids(conn, q) == ids[:2]
    conn.execute("SELECT pgbroker.set_policy(%s, ack_mode => 'delete')", [q])
    third = conn.execute(
        "SELECT msg_id FROM pgbroker.consume(%s, 30, 5, %s::text[])", [q, [r[1] for r in second]]
    ).fetchall()
    assert [r[0] for r in third] == ids[4:]
    assert a_ids(conn, q) == ids[:2]
    assert q_ids(conn, q) == ids[4:]


def test_consume_skips_stale_receipts_and_checks_them(conn: Conn, q: str) -> None:
    ids = _send(conn, q, 2)
    held = _read(conn, q, 1, vt=0)  # its lease has already run out: the receipt is stale
    query = "SELECT msg_id FROM pgbroker.consume(%s, 30, 1, %s::text[], false)"
    rows = conn.execute(query, [q, [held[0][1]]])
    assert [r[0] for r in rows] == ids[:1]  # redelivered, not acked
    assert q_ids(conn, q) == ids
    with pytest.raises(psycopg.Error) as bad:
        conn.execute("SELECT * FROM pgbroker.consume(%s, 30, 1, ARRAY['nonsense'])", [q])
    assert bad.value.sqlstate == "PB007"
    with pytest.raises(psycopg.Error) as missing:
        conn.execute("SELECT * FROM pgbroker.consume('no_such_queue', 30, 1)")
    assert missing.value.sqlstate == "PB002"


# -- ready_from ----------------------------------------------------------------------------------


def test_ready_from_moves_past_consumed_messages(conn: Conn, q: str) -> None:
    ids = _send(conn, q, 30)
    for _ in range(2):
        batch = _read(conn, q, 10)
        conn.execute("SELECT pgbroker.ack(%s, %s::text[], false)", [q, [r[1] for r in batch]])
    ready_from = _advance(_dsn(conn), q)
    assert ready_from == ids[20]
    assert [r[0] for r in _read(conn, q, 10)] == ids[20:]
    # An empty queue: ready_from passes every msg_id taken so far.
    _read(conn, q, 10)
    assert _advance(_dsn(conn), q) == ids[-1] + 1
    assert [r[0] for r in _read(conn, q, 10)] == []
    more = _send(conn, q, 2)
    assert [r[0] for r in _read(conn, q, 10)] == more


def test_ready_from_waits_for_a_send_still_open(conn: Conn, q: str) -> None:
    with psycopg.connect(_dsn(conn)) as sender:  # not autocommit: the send stays open
        (early,) = _send(sender, q, 1)
        later = _send(conn, q, 3)  # committed, with larger msg_ids
        batch = _read(conn, q, 3)
        assert [r[0] for r in batch] == later
        conn.execute("SELECT pgbroker.ack(%s, %s::text[], false)", [q, [r[1] for r in batch]])
        assert _advance(_dsn(conn), q, times=5) <= early
        sender.commit()
    assert [r[0] for r in _read(conn, q, 10)] == [early]


def test_ready_from_waits_for_an_open_send_holding_the_newest_transaction_id(conn: Conn, q: str) -> None:
    # Nothing finishes between the send taking its id and the advances: a snapshot's xmax is then
    # the send's own id, which 0012 took for "every older transaction has ended" (migration 0013).
    consumed = _send(conn, q, 3)
    batch = _read(conn, q, 3)
    conn.execute("SELECT pgbroker.ack(%s, %s::text[], false)", [q, [r[1] for r in batch]])
    assert _advance(_dsn(conn), q) == consumed[-1] + 1
    with psycopg.connect(_dsn(conn)) as sender:  # not autocommit: the send stays open
        (open_send,) = _send(sender, q, 1)
        assert _advance(_dsn(conn), q, times=5) <= open_send
        sender.commit()
    assert [r[0] for r in _read(conn, q, 10)] == [open_send]


@contextmanager
def _horizon_held(dsn: str) -> Iterator[None]:
    """A session idle in transaction with a transaction id (in the cluster's first database, not
    the queue's: the xmin horizon is the cluster's), as an application that left one open."""
    with psycopg.connect(make_conninfo(dsn, dbname="postgres")) as idle:
        idle.execute("SELECT pg_current_xact_id()")
        yield


#: How long a candidate waits for the horizon before the queue's writers decide (50_reads.sql).
PATIENCE = 1.0


def test_ready_from_moves_on_while_an_idle_transaction_holds_the_horizon(conn: Conn, q: str) -> None:
    # Before, the bound waited for every older transaction of the cluster: an application's
    # session left idle in transaction kept it where it was, and reads walked the dead entries of
    # everything consumed meanwhile.
    with _horizon_held(_dsn(conn)):
        ids = _send(conn, q, 20)
        batch = _read(conn, q, 20)
        conn.execute("SELECT pgbroker.ack(%s, %s::text[], false)", [q, [r[1] for r in batch]])
        _advance(_dsn(conn), q)  # the candidate, then held back by the horizon
        time.sleep(PATIENCE + 0.2)
        assert _advance(_dsn(conn), q) == ids[-1] + 1
        more = _send(conn, q, 2)
        assert [r[0] for r in _read(conn, q, 10)] == more


def test_ready_from_waits_for_an_open_send_while_the_horizon_is_held(conn: Conn, q: str) -> None:
    # The queue's writers decide then, and a send still open is one of them.
    with _horizon_held(_dsn(conn)), psycopg.connect(_dsn(conn)) as sender:
        (open_send,) = _send(sender, q, 1)
        later = _send(conn, q, 3)
        batch = _read(conn, q, 3)
        assert [r[0] for r in batch] == later
        conn.execute("SELECT pgbroker.ack(%s, %s::text[], false)", [q, [r[1] for r in batch]])
        _advance(_dsn(conn), q)
        time.sleep(PATIENCE + 0.2)
        assert _advance(_dsn(conn), q, times=5) <= open_send
        sender.commit()
        assert _advance(_dsn(conn), q) <= open_send
        assert [r[0] for r in _read(conn, q, 10)] == [open_send]


def test_timed_from_moves_on_while_an_idle_transaction_holds_the_horizon(conn: Conn, q: str) -> None:
    with _horizon_held(_dsn(conn)):
        _send(conn, q, 5)
        batch = _read(conn, q, 5, vt=1)  # leases ending in a second: timed rows
        conn.execute("SELECT pgbroker.ack(%s, %s::text[], false)", [q, [r[1] for r in batch]])
        before = advance_head(_dsn(conn), q)["timed_from"]
        time.sleep(PATIENCE + 1.2)  # past the candidate's margin and the patience
        after = advance_head(_dsn(conn), q)["timed_from"]
        assert after is not None
        assert before is None or after > before


def test_set_vt_making_an_old_message_ready_lowers_ready_from(conn: Conn, q: str) -> None:
    (delayed,) = [r[0] for r in conn.execute("SELECT * FROM pgmq.send(%s, '{}'::jsonb, 3600)", [q])]
    _send(conn, q, 3)
    batch = _read(conn, q, 3)
    conn.execute("SELECT pgbroker.ack(%s, %s::text[], false)", [q, [r[1] for r in batch]])
    assert _advance(_dsn(conn), q) > delayed
    # vt at its enqueued_at: ready again, as if sent without delay.
    conn.execute(
        sql.SQL("SELECT pgmq.set_vt(%s, %s, (SELECT enqueued_at FROM pgmq.{} WHERE msg_id = %s))").format(
            sql.Identifier(f"q_{q}")
        ),
        [q, delayed, delayed],
    )
    assert [r[0] for r in _read(conn, q, 10)] == [delayed]


def test_set_vt_waiting_for_an_advance_lowers_the_bounds_it_wrote(conn: Conn, q: str) -> None:
    # An advance appends the queue's bounds and removes the row it replaced. A set_vt that makes
    # an old message ready while an advance is open must lower the bounds that advance writes,
    # not the row it removes (the message would then stay below ready_from for good).
    (delayed,) = [r[0] for r in conn.execute("SELECT * FROM pgmq.send(%s, '{}'::jsonb, 3600)", [q])]
    for _ in range(2):
        sent = _send(conn, q, 3)
        batch = _read(conn, q, 3)
        assert [r[0] for r in batch] == sent
        conn.execute("SELECT pgbroker.ack(%s, %s::text[], false)", [q, [r[1] for r in batch]])
        assert _advance(_dsn(conn), q) > delayed
    seq = "SELECT (pgbroker._queue_bounds(%s)).seq"
    ready_again = sql.SQL(
        "SELECT pgmq.set_vt(%s, %s, (SELECT enqueued_at FROM pgmq.{} WHERE msg_id = %s))"
    ).format(sql.Identifier(f"q_{q}"))
    with (
        psycopg.connect(_dsn(conn)) as advancer,  # not autocommit: the advance stays open
        psycopg.connect(_dsn(conn), autocommit=True) as lowerer,
    ):
        before = conn.execute(seq, [q]).fetchone()
        advancer.execute("SELECT pgbroker._advance_head(%s, %s)", [q, f"q_{q}"])
        assert advancer.execute(seq, [q]).fetchone() != before, "the advance wrote no bounds"
        lowered = threading.Thread(target=lowerer.execute, args=(ready_again, [q, delayed, delayed]))
        lowered.start()
        waits = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s"
        deadline = time.monotonic() + 30
        while conn.execute(waits, [lowerer.info.backend_pid]).fetchone() != ("Lock",):
            assert time.monotonic() < deadline, "the lowering did not wait for the advance"
            time.sleep(0.01)
        advancer.commit()
        lowered.join(30)
        assert not lowered.is_alive()
    assert [r[0] for r in _read(conn, q, 10)] == [delayed]
