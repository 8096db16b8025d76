"""Each failed delivery is kept with the message (65_failures.sql): its error and traceback, the
latest ten, in the header x-pgbroker-attempts; a dead letter carries them, and is found, shown,
replayed and purged by the msg_id its consumers saw (and logged), wherever it went."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from psycopg import sql

from pgbroker import Broker, Message, Queue
from tests.support.tables import Conn, q_rows

ATTEMPTS = "x-pgbroker-attempts"
DEAD = "x-pgbroker-dead-letter"


@pytest.fixture
def conn(module_conn: Conn) -> Conn:
    return module_conn


@pytest.fixture
def new_queue(module_broker: Broker) -> Callable[[], Queue]:
    return lambda: module_broker.create_queue(f"q{uuid.uuid4().hex[:16]}")


@pytest.fixture
def queue(new_queue: Callable[[], Queue]) -> Queue:
    return new_queue()


@pytest.fixture
def dlq(new_queue: Callable[[], Queue]) -> Queue:
    return new_queue()


def fail_again(conn: Conn, queue: Queue, error: str, traceback: str | None = None) -> str:
    """Lease the queue's message at once (its back-off ended by hand) and fail it."""
    conn.execute(
        sql.SQL("UPDATE pgmq.{} SET vt = clock_timestamp() - interval '1 ms'").format(
            sql.Identifier(f"q_{queue.name}")
        )
    )
    message = queue.read(vt=300)
    assert message is not None
    return queue.fail(message, error=error, traceback=traceback)


def attempts(message: Message) -> list[dict[str, Any]]:
    assert message.headers is not None
    found: list[dict[str, Any]] = message.headers[ATTEMPTS]
    return found


def test_each_failed_delivery_is_kept_with_its_error_and_traceback(conn: Conn, queue: Queue) -> None:
    queue.set_policy(max_deliveries=5, backoff="fixed", backoff_base_seconds=0)
    queue.send({"n": 1}, headers={"trace": "abc"})
    assert fail_again(conn, queue, "KeyError: 'sku'", "Traceback ...\nKeyError: 'sku'") == "retry"
    assert fail_again(conn, queue, "TimeoutError: upstream") == "retry"
    [(_, _, _, _, headers)] = q_rows(conn, queue.name)
    assert headers["trace"] == "abc"
    kept = headers[ATTEMPTS]
    assert [(a["delivery"], a["error"]) for a in kept] == [
        (1, "KeyError: 'sku'"),
        (2, "TimeoutError: upstream"),
    ]
    assert kept[0]["traceback"] == "Traceback ...\nKeyError: 'sku'"
    assert "traceback" not in kept[1]  # none given
    assert kept[0]["failed_at"] <= kept[1]["failed_at"]
    # The next delivery shows the handler what went wrong before.
    message = queue.read()
    assert message is not None
    assert [a["delivery"] for a in attempts(message)] == [1, 2]


def test_only_the_latest_ten_attempts_are_kept_and_each_is_bounded(conn: Conn, queue: Queue) -> None:
    queue.set_policy(backoff="fixed", backoff_base_seconds=0)
    queue.send(1)
    for n in range(1, 13):
        fail_again(conn, queue, f"error {n}" + "x" * 3000, "frame\n" * 2000 + f"cause {n}")
    [(_, _, _, _, headers)] = q_rows(conn, queue.name)
    kept = headers[ATTEMPTS]
    assert [a["delivery"] for a in kept] == list(range(3, 13))
    assert all(len(a["error"]) == 2000 for a in kept)
    # A traceback keeps its end, where the cause is.
    assert all(len(a["traceback"]) == 8000 for a in kept)
    assert all(a["traceback"].endswith(f"cause {a['delivery']}") for a in kept)


def test_a_dead_letter_carries_every_attempt_and_keeps_its_original_msg_id(
    conn: Conn, queue: Queue, dlq: Queue
) -> None:
    queue.set_policy(max_deliveries=3, backoff="fixed", backoff_base_seconds=0, dead_letter_queue=dlq.name)
    dlq.send("another message first, so that the ids differ")
    sent = queue.send({"order": 7})
    outcomes = [fail_again(conn, queue, f"boom {n}", f"tb {n}") for n in (1, 2, 3)]
    assert outcomes == ["retry", "retry", "dead_lettered"]
    [letter] = queue.dead_letters()
    assert letter.msg_id == sent  # the id the worker logged, not the dead-letter queue's own
    assert [(a["delivery"], a["error"], a["traceback"]) for a in attempts(letter)] == [
        (1, "boom 1", "tb 1"),
        (2, "boom 2", "tb 2"),
        (3, "boom 3", "tb 3"),
    ]
    assert letter.headers is not None
    assert letter.headers[DEAD]["msg_id"] == sent
    assert queue.dead_letter(sent) == letter
    assert queue.dead_letter(sent + 1000) is None
    [peeked] = queue.peek(state="dead")
    assert peeked.msg_id == sent


def test_dead_letters_are_replayed_and_purged_by_their_original_msg_id(
    conn: Conn, queue: Queue, dlq: Queue
) -> None:
    queue.set_policy(max_deliveries=1, dead_letter_queue=dlq.name)
    dlq.send_many(["padding"] * 5)
    first, second = queue.send_many(["a", "b"])
    for message in queue.read_many(2):
        queue.fail(message, error="bad", traceback="tb")
    assert [m.msg_id for m in queue.dead_letters()] == [first, second]
    replayed = queue.replay_dead_letters([second])
    assert list(replayed) == [second]
    [fresh] = [m for m in queue.peek() if m.msg_id == replayed[second]]
    assert fresh.headers is None  # a fresh start: no dead-letter header, no attempts
    assert queue.purge_dead_letters([first]) == 1
    assert queue.dead_letters() == []
    assert len(dlq.peek()) == 5  # the dead-letter queue's own messages untouched


def test_dead_letters_in_the_archive_are_addressed_by_the_same_id(conn: Conn, queue: Queue) -> None:
    queue.set_policy(max_deliveries=1)
    sent = queue.send("x")
    message = queue.read()
    assert message is not None
    queue.fail(message, error="no", traceback="tb")
    letter = queue.dead_letter(sent)
    assert letter is not None
    assert [a["error"] for a in attempts(letter)] == ["no"]
    assert list(queue.replay_dead_letters([sent])) == [sent]
