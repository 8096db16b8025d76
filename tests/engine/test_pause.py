"""Pause and resume (20_policies.sql): every read of a paused queue returns nothing, sends go on."""

from __future__ import annotations

import psycopg
import pytest

from pgbroker import Broker, Queue
from tests.support.tables import Conn

READS = [
    "SELECT * FROM pgmq.read('q', 30, 5)",
    "SELECT * FROM pgmq.read('q', 30, 5, '{\"n\": 1}')",
    "SELECT * FROM pgmq.read_with_poll('q', 30, 5, 1, 100)",
    "SELECT * FROM pgmq.pop('q', 5)",
    "SELECT * FROM pgmq.read_grouped('q', 30, 5)",
    "SELECT * FROM pgmq.read_grouped_rr('q', 30, 5)",
    "SELECT * FROM pgmq.read_grouped_head('q', 30, 5)",
    "SELECT * FROM pgmq.read_grouped_with_poll('q', 30, 5, 1, 100)",
    "SELECT * FROM pgmq.read_grouped_rr_with_poll('q', 30, 5, 1, 100)",
    "SELECT * FROM pgbroker.read('q', 30, 5)",
    "SELECT * FROM pgbroker.read_with_poll('q', 30, 5, 1, 100)",
]


@pytest.fixture
def paused(conn: Conn) -> Conn:
    conn.execute("SELECT pgmq.create('q')")
    conn.execute("SELECT pgmq.send_batch('q', ARRAY['{\"n\": 1}', '{\"n\": 2}']::jsonb[])")
    assert conn.execute("SELECT pgbroker.pause('q')").fetchone() == (True,)
    return conn


@pytest.mark.parametrize("read", READS)
def test_every_read_of_a_paused_queue_returns_nothing(paused: Conn, read: str) -> None:
    assert paused.execute(read).fetchall() == []
    assert paused.execute("SELECT count(*) FROM pgmq.q_q WHERE read_ct = 0").fetchone() == (2,)


@pytest.mark.parametrize("max_deliveries", [None, 3])
def test_pause_holds_for_queues_with_policies_and_for_queues_past_the_routes(
    dsn: str, paused: Conn, max_deliveries: int | None
) -> None:
    paused.execute("SELECT pgbroker.set_policy('q', max_deliveries => %s)", [max_deliveries])
    assert paused.execute("SELECT * FROM pgbroker.read('q', 30, 5)").fetchall() == []
    # A session whose routes hold no queue takes the dynamic path.
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("SET pgbroker.route_limit = 0")
        other.execute("SELECT pgbroker._write_routes()")
        assert other.execute("SELECT * FROM pgmq.read('q', 30, 5)").fetchall() == []
        assert other.execute("SELECT * FROM pgmq.pop('q')").fetchall() == []
        assert other.execute("SELECT * FROM pgbroker.read('q', 30, 5)").fetchall() == []


def test_sends_succeed_while_paused_and_resume_hands_everything_out(paused: Conn) -> None:
    paused.execute("SELECT pgmq.send('q', '{\"n\": 3}')")
    assert paused.execute("SELECT pgbroker.pause('q')").fetchone() == (False,)  # already paused
    assert paused.execute("SELECT paused FROM pgbroker.policy('q')").fetchone() == (True,)
    assert paused.execute("SELECT pgbroker.resume('q')").fetchone() == (True,)
    assert paused.execute("SELECT pgbroker.resume('q')").fetchone() == (False,)
    got = paused.execute("SELECT message->>'n' FROM pgmq.read('q', 30, 5)").fetchall()
    assert got == [("1",), ("2",), ("3",)]


def test_a_pause_rolled_back_changes_nothing(dsn: str, conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('q')")
    conn.execute("SELECT pgmq.send('q', '{}')")
    with psycopg.connect(dsn) as other:
        other.execute("SELECT pgbroker.pause('q')")
        other.rollback()
    assert len(conn.execute("SELECT * FROM pgmq.read('q', 30, 1)").fetchall()) == 1


def test_pausing_a_missing_queue_names_it(conn: Conn) -> None:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT pgbroker.pause('nope')")
    assert caught.value.sqlstate == "PB002"


def test_the_clients_pause_and_resume(broker: Broker, queue: Queue) -> None:
    queue.send({"n": 1})
    assert queue.pause() is True
    assert queue.read() is None
    assert queue.policy().paused is True
    assert queue.resume() is True
    assert queue.read() is not None
