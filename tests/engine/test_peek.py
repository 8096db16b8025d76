"""Peek (sql/functions/77_peek.sql): every message of a queue with its state, or its dead letters,
filtered and paged by msg_id, without changing anything: no read count, no lease, no lock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from pgbroker import Broker, Queue
from pgbroker.errors import InvalidArgument
from tests.support.tables import Conn, q_rows


def states(queue: Queue, **filters: object) -> list[tuple[object, str]]:
    return [(m.message, m.state) for m in queue.peek(100, **filters)]  # type: ignore[arg-type]


def test_peek_tells_the_state_of_every_message(broker: Broker, queue: Queue) -> None:
    queue.send_many(["leased", "nacked"])
    _leased, nacked = queue.read_many(2, vt=300)
    queue.nack(nacked, delay=300)
    queue.send("expired")
    [expired] = queue.read_many(1, vt=0)  # visible again at once
    assert expired.message == "expired"
    queue.send("waiting")
    queue.send("delayed", delay=300)
    assert states(queue) == [
        ("leased", "in_flight"),
        ("nacked", "in_flight"),
        ("expired", "waiting"),
        ("waiting", "waiting"),
        ("delayed", "delayed"),
    ]
    assert states(queue, state="delayed") == [("delayed", "delayed")]
    assert states(queue, state="in_flight") == [("leased", "in_flight"), ("nacked", "in_flight")]
    assert states(queue, state="waiting") == [("expired", "waiting"), ("waiting", "waiting")]


def test_peek_changes_nothing_and_takes_no_lock(dsn: str, conn: Conn, queue: Queue) -> None:
    queue.send_many(["a", "b"])
    queue.read_many(1, vt=300)
    before = q_rows(conn, queue.name)
    with psycopg.connect(dsn) as holder:
        # Another session holds every row locked (as a read in progress does): a peek neither
        # waits for it nor is refused.
        holder.execute("SELECT * FROM pgmq.q_jobs FOR UPDATE")
        conn.execute("SET lock_timeout = '100ms'")
        assert [m.message for m in queue.peek()] == ["a", "b"]
        holder.rollback()
    assert q_rows(conn, queue.name) == before
    [message] = queue.read_many(1)
    assert (message.message, message.read_ct) == ("b", 1)  # the peek was no delivery


def test_peek_pages_by_msg_id_and_filters(queue: Queue) -> None:
    ids = queue.send_many(
        range(10), headers=[{"tenant": "acme" if i % 2 else "globex", "n": i} for i in range(10)]
    )
    first = queue.peek(4)
    assert [m.msg_id for m in first] == ids[:4]
    assert [m.msg_id for m in queue.peek(4, after=first[-1].msg_id)] == ids[4:8]
    assert [m.msg_id for m in queue.peek(100, after=ids[2], before=ids[5])] == ids[3:6]
    assert [m.message for m in queue.peek(100, header="tenant", header_value="acme")] == [1, 3, 5, 7, 9]
    assert [m.message for m in queue.peek(100, header="n", header_value="4")] == [4]  # compared as text
    assert len(queue.peek(100, header="tenant")) == 10
    assert queue.peek(100, header="absent") == []
    now = datetime.now(UTC)
    assert len(queue.peek(100, enqueued_after=now - timedelta(minutes=1))) == 10
    assert queue.peek(100, enqueued_before=now - timedelta(minutes=1)) == []


def test_peek_finds_messages_by_body_fields(queue: Queue) -> None:
    bodies = [{"sku": f"A-{n:03}", "qty": n % 3, "tags": ["x", str(n)]} for n in range(9)]
    ids = queue.send_many([*bodies, "text"])
    assert [m.msg_id for m in queue.peek(100, contains={"sku": "A-004"})] == [ids[4]]
    assert [m.message["qty"] for m in queue.peek(100, contains={"qty": 2})] == [2, 2, 2]
    assert [m.msg_id for m in queue.peek(100, contains={"tags": ["7"]})] == [ids[7]]
    assert queue.peek(100, contains={"sku": "nope"}) == []
    assert len(queue.peek(100, contains={})) == 9  # every object body
    with pytest.raises(InvalidArgument, match="contains must be a mapping"):
        queue.peek(contains="sku=A-001")  # type: ignore[arg-type]


@pytest.mark.parametrize("dead_letter_queue", [None, "jobs_dlq"])
def test_peek_shows_dead_letters_where_the_policy_put_them(
    broker: Broker, queue: Queue, dead_letter_queue: str | None
) -> None:
    if dead_letter_queue:
        broker.create_queue(dead_letter_queue)
        queue.set_policy(max_deliveries=1, dead_letter_queue=dead_letter_queue)
    else:
        queue.set_policy(max_deliveries=1)
    queue.send_many(["poison", "fine"])
    [poison] = queue.read_many(1)
    assert queue.fail(poison, error="boom") == "dead_lettered"
    [letter] = queue.peek(state="dead")
    assert (letter.message, letter.state) == ("poison", "dead")
    assert letter.headers is not None
    assert letter.headers["x-pgbroker-dead-letter"]["error"] == "boom"
    assert [m.message for m in queue.peek()] == ["fine"]  # dead letters only when asked for
    assert queue.replay_dead_letters([letter.msg_id]) != {}
    assert queue.peek(state="dead") == []


@pytest.mark.parametrize(
    ("filters", "problem"),
    [
        ({"state": "gone"}, "unknown message state 'gone'"),
        ({"header_value": "x"}, "header_value needs header"),
        ({"enqueued_after": datetime(2024, 1, 1)}, "timezone-aware"),
        ({"after": -1}, "msg_id must be an integer"),
    ],
)
def test_bad_peek_filters_are_refused(queue: Queue, filters: dict[str, object], problem: str) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        queue.peek(**filters)  # type: ignore[arg-type]


def test_sql_callers_get_the_same_checks(conn: Conn, queue: Queue) -> None:
    with pytest.raises(psycopg.Error, match="unknown message state 'gone'"):
        conn.execute("SELECT * FROM pgbroker.peek('jobs', 10, 0, 'gone')")
    conn.rollback()
    with pytest.raises(psycopg.Error, match="header_value needs header_key"):
        conn.execute("SELECT * FROM pgbroker.peek('jobs', 10, 0, NULL, NULL, NULL, 'x')")
