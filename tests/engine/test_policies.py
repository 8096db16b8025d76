"""Per-queue policy in SQL (0008): settings and their checks, retry back-off, fail -> retry or
dead letter, dead-lettering at read time, dead-letter replay and purge, backpressure (max_depth)
and archive retention. Effects are checked in the queue tables themselves."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import astuple
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgbroker import Broker, InvalidArgument, Message, Queue, QueueFull, QueueNotFound, StaleReceipt
from pgbroker.queues._client_async import AsyncBroker
from tests.support.tables import Conn, a_ids, a_rows, q_ids, q_rows

DEAD = "x-pgbroker-dead-letter"


@pytest.fixture
def conn(module_conn: Conn) -> Conn:
    """Every test of this module shares one database and works on queues of its own."""
    return module_conn


@pytest.fixture
def broker(module_broker: Broker) -> Broker:
    return module_broker


@pytest.fixture
def new_queue(broker: Broker) -> Callable[[], Queue]:
    return lambda: broker.create_queue(f"q{uuid.uuid4().hex[:16]}")


@pytest.fixture
def queue(new_queue: Callable[[], Queue]) -> Queue:
    return new_queue()


@pytest.fixture
def dlq(new_queue: Callable[[], Queue]) -> Queue:
    return new_queue()


def lease(queue: Queue, vt: int = 300) -> Message:
    message = queue.read(vt=vt)
    assert message is not None
    assert message.receipt is not None
    return message


def make_visible(conn: Conn, queue: Queue) -> None:
    """End every lease and back-off now (instead of sleeping through them)."""
    conn.execute(
        sql.SQL("UPDATE pgmq.{} SET vt = clock_timestamp() - interval '1 ms'").format(
            sql.Identifier(f"q_{queue.name}")
        )
    )


# -- settings -------------------------------------------------------------------------------------


def test_a_queue_without_a_policy_has_the_defaults(queue: Queue, broker: Broker) -> None:
    policy = queue.policy()
    assert (policy.queue_name, policy.max_deliveries, policy.dead_letter_queue, policy.max_depth) == (
        queue.name,
        None,
        None,
        None,
    )
    assert (
        policy.backoff,
        policy.backoff_base_seconds,
        policy.backoff_max_seconds,
        policy.backoff_jitter,
    ) == (
        "exponential",
        1,
        300,
        True,
    )
    assert (policy.ack_mode, policy.archive_retention_seconds, policy.archive_max_rows) == (
        "archive",
        None,
        None,
    )
    assert queue.name in [p.queue_name for p in broker.policies()]


def test_set_policy_changes_what_is_given_and_zero_turns_a_limit_off(queue: Queue, dlq: Queue) -> None:
    queue.set_policy(max_deliveries=5, max_depth=100, dead_letter_queue=dlq.name, archive_max_rows=10)
    policy = queue.set_policy(backoff="fixed", backoff_base_seconds=7)
    assert (policy.max_deliveries, policy.max_depth, policy.dead_letter_queue) == (5, 100, dlq.name)
    assert (policy.backoff, policy.backoff_base_seconds, policy.archive_max_rows) == ("fixed", 7, 10)
    policy = queue.set_policy(max_deliveries=0, max_depth=0, dead_letter_queue="", archive_max_rows=0)
    assert (policy.max_deliveries, policy.max_depth, policy.dead_letter_queue, policy.archive_max_rows) == (
        None,
        None,
        None,
        None,
    )
    assert queue.policy() == policy


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"max_deliveries": -1}, "max_deliveries must be >= 0"),
        ({"backoff": "linear"}, "backoff must be 'fixed' or 'exponential'"),
        ({"backoff_base_seconds": -1}, "backoff_base_seconds must be >= 0"),
        ({"backoff_max_seconds": -5}, "backoff_max_seconds must be >= 0"),
        ({"backoff_base_seconds": 10, "backoff_max_seconds": 5}, r"backoff_max_seconds \(5\) must be >="),
        ({"ack_mode": "drop"}, "ack_mode must be 'archive' or 'delete'"),
        ({"max_depth": -1}, "max_depth must be >= 0"),
        ({"archive_retention_seconds": -1}, "archive_retention_seconds must be >= 0"),
        ({"archive_max_rows": -1}, "archive_max_rows must be >= 0"),
    ],
)
def test_set_policy_refuses_bad_settings_and_changes_nothing(
    queue: Queue, changes: dict[str, Any], fragment: str
) -> None:
    before = queue.set_policy(max_deliveries=3)
    with pytest.raises(InvalidArgument, match=fragment) as info:
        queue.set_policy(**changes)
    assert info.value.sqlstate == "PB007"
    assert queue.policy() == before


def test_a_dead_letter_queue_must_exist_and_not_be_the_queue_itself(broker: Broker, queue: Queue) -> None:
    with pytest.raises(QueueNotFound):
        queue.set_policy(dead_letter_queue="no_such_queue")
    with pytest.raises(InvalidArgument, match="its own dead-letter queue"):
        queue.set_policy(dead_letter_queue=queue.name.upper())
    with pytest.raises(QueueNotFound):
        broker.queue("no_such_queue").set_policy(max_depth=1)


@pytest.mark.parametrize(
    "changes",
    [
        {"max_deliveries": True},
        {"max_depth": 2**63},
        {"backoff": 1},
        {"backoff_jitter": "yes"},
        {"colour": 1},
    ],
)
def test_settings_of_the_wrong_type_are_refused_before_sending(queue: Queue, changes: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        queue.set_policy(**changes)


def test_dropping_a_dead_letter_queue_sends_dead_letters_to_the_archive(
    broker: Broker, queue: Queue, dlq: Queue
) -> None:
    queue.set_policy(dead_letter_queue=dlq.name)
    broker.drop_queue(dlq.name)
    assert queue.policy().dead_letter_queue is None


# -- back-off -------------------------------------------------------------------------------------


def retry_delays(conn: Conn, policy: dict[str, Any], read_ct: int, samples: int = 1) -> list[int]:
    row = {
        "queue_name": "x",
        "max_deliveries": None,
        "backoff": "exponential",
        "backoff_base_seconds": 1,
        "backoff_max_seconds": 300,
        "backoff_jitter": False,
        "dead_letter_queue": None,
        "ack_mode": "archive",
        "max_depth": None,
        "archive_retention_seconds": None,
        "archive_max_rows": None,
        "updated_at": datetime.now(UTC),
        "codec": "json",
        "priorities": False,
        "dedup_window_seconds": 300,
        "dedup_mode": "window",
        "max_in_flight": None,
        "max_in_flight_per_key": None,
        "rate_limit_per_second": None,
        "paused": False,
        **policy,
    }
    columns = sql.SQL(", ").join(sql.Placeholder(k) for k in row)
    query = sql.SQL(
        "SELECT pgbroker.retry_delay(ROW({})::pgbroker.queue_policy, %(read_ct)s)"
        " FROM generate_series(1, %(n)s)"
    ).format(columns)
    return [r[0] for r in conn.execute(query, {**row, "read_ct": read_ct, "n": samples}).fetchall()]


def test_fixed_backoff_is_the_base_every_time(conn: Conn) -> None:
    assert [retry_delays(conn, {"backoff": "fixed", "backoff_base_seconds": 7}, n)[0] for n in (1, 2, 9)] == [
        7,
        7,
        7,
    ]


def test_exponential_backoff_doubles_from_the_base_up_to_the_max(conn: Conn) -> None:
    policy = {"backoff_base_seconds": 2, "backoff_max_seconds": 60}
    assert [retry_delays(conn, policy, n)[0] for n in range(1, 8)] == [2, 4, 8, 16, 32, 60, 60]
    # A huge delivery count neither overflows nor passes the max.
    assert retry_delays(conn, policy, 2_000_000_000) == [60]


def test_jitter_draws_from_the_upper_half_of_the_delay(conn: Conn) -> None:
    delays = retry_delays(conn, {"backoff_base_seconds": 10, "backoff_jitter": True}, 3, samples=300)
    assert min(delays) >= 20
    assert max(delays) <= 40
    assert len(set(delays)) > 5  # spread out, not one value
    assert retry_delays(conn, {"backoff": "fixed", "backoff_base_seconds": 0, "backoff_jitter": True}, 1) == [
        0
    ]


# -- fail, dead letters ---------------------------------------------------------------------------


def test_fail_gives_the_message_back_after_the_backoff(conn: Conn, queue: Queue) -> None:
    queue.set_policy(backoff="fixed", backoff_base_seconds=60, backoff_jitter=False)
    queue.send({"n": 1})
    message = lease(queue)
    started = datetime.now(UTC)
    assert queue.fail(message, error="boom") == "retry"
    [(msg_id, read_ct, vt, _, headers)] = q_rows(conn, queue.name)
    assert (msg_id, read_ct) == (message.msg_id, 1)
    assert [(a["delivery"], a["error"]) for a in headers["x-pgbroker-attempts"]] == [(1, "boom")]
    assert timedelta(seconds=59) < vt - started < timedelta(seconds=62)
    assert queue.read() is None


def test_a_message_is_dead_lettered_after_exactly_max_deliveries(
    conn: Conn, queue: Queue, dlq: Queue
) -> None:
    queue.set_policy(max_deliveries=3, backoff="fixed", backoff_base_seconds=0, dead_letter_queue=dlq.name)
    sent = queue.send({"order": 7}, headers={"trace": "abc"})
    outcomes = []
    for delivery in (1, 2, 3):
        message = lease(queue)
        assert (message.msg_id, message.read_ct) == (sent, delivery)
        outcomes.append(queue.fail(message, error=f"boom {delivery}"))
        make_visible(conn, queue)
    assert outcomes == ["retry", "retry", "dead_lettered"]
    assert q_ids(conn, queue.name) == []
    [letter] = dlq.peek()
    assert letter.message == {"order": 7}
    assert letter.read_ct == 0  # a new message of the dead-letter queue
    assert letter.headers is not None
    assert letter.headers["trace"] == "abc"
    why = letter.headers[DEAD]
    assert (why["queue"], why["msg_id"], why["deliveries"], why["error"]) == (queue.name, sent, 3, "boom 3")
    assert {"enqueued_at", "dead_lettered_at"} <= why.keys()
    # A peek gives the letter its state too (PeekedMessage): the fields of Message are the same.
    assert [astuple(m) for m in queue.dead_letters()] == [astuple(letter)[:-1]]


def test_without_a_dead_letter_queue_dead_letters_go_to_the_archive(conn: Conn, queue: Queue) -> None:
    queue.set_policy(max_deliveries=1)
    sent = queue.send({"n": 1})
    assert queue.fail(lease(queue), error="no") == "dead_lettered"
    assert q_ids(conn, queue.name) == []
    [(msg_id, read_ct, message, _)] = a_rows(conn, queue.name)
    assert (msg_id, read_ct, message) == (sent, 1, {"n": 1})  # the archive keeps its msg_id
    [letter] = queue.dead_letters()
    assert letter.headers is not None
    assert letter.headers[DEAD]["error"] == "no"


def test_a_long_error_is_cut_in_the_header(queue: Queue, dlq: Queue) -> None:
    queue.set_policy(max_deliveries=1, dead_letter_queue=dlq.name)
    queue.send(1)
    queue.fail(lease(queue), error="x" * 10_000)
    [letter] = queue.dead_letters()
    assert letter.headers is not None
    assert len(letter.headers[DEAD]["error"]) == 2000


def test_fail_with_a_stale_receipt_raises_and_changes_nothing(conn: Conn, queue: Queue, dlq: Queue) -> None:
    queue.set_policy(max_deliveries=1, dead_letter_queue=dlq.name)
    queue.send(1)
    message = lease(queue)
    queue.nack(message)  # the receipt is spent
    before = (q_rows(conn, queue.name), q_rows(conn, dlq.name))
    with pytest.raises(StaleReceipt, match="lease was changed"):
        queue.fail(message, error="late")
    assert (q_rows(conn, queue.name), q_rows(conn, dlq.name)) == before
    # The SQL batch form skips it; the single form raises PB003.
    assert (
        conn.execute(
            "SELECT * FROM pgbroker.fail(%s, ARRAY[%s], 'x')", [queue.name, str(message.receipt)]
        ).fetchall()
        == []
    )
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT pgbroker.fail(%s, %s::text, 'x')", [queue.name, str(message.receipt)])
    assert info.value.sqlstate == "PB003"


def test_fail_many_reports_each_outcome(conn: Conn, queue: Queue) -> None:
    queue.set_policy(max_deliveries=2, backoff="fixed", backoff_base_seconds=0)
    queue.send_many([1, 2])
    first = lease(queue)
    queue.fail(first)
    make_visible(conn, queue)
    receipts = [str(m.receipt) for m in queue.read_many(2)]
    rows = conn.execute("SELECT * FROM pgbroker.fail(%s, %s::text[], 'e')", [queue.name, receipts]).fetchall()
    assert sorted(rows) == [(first.msg_id, "dead_lettered"), (first.msg_id + 1, "retry")]


def test_fail_takes_the_callers_max_deliveries_when_the_policy_sets_none(conn: Conn, queue: Queue) -> None:
    # The worker's finite default (pgbroker.runtime): pgbroker.fail's default_max_deliveries, used
    # only while the queue's policy sets no max_deliveries; the three-argument form is unchanged.
    queue.set_policy(backoff="fixed", backoff_base_seconds=0)
    sent = queue.send({"n": 1})
    call = "SELECT * FROM pgbroker.fail(%s, ARRAY[%s], 'e', default_max_deliveries => %s)"
    outcomes = []
    for _ in range(2):
        message = lease(queue)
        outcomes += conn.execute(call, [queue.name, str(message.receipt), 2]).fetchall()
        make_visible(conn, queue)
    assert outcomes == [(sent, "retry"), (sent, "dead_lettered")]
    [letter] = queue.dead_letters()  # no dead-letter queue: in the archive, with the header
    assert letter.headers is not None
    assert (letter.headers[DEAD]["msg_id"], letter.headers[DEAD]["deliveries"]) == (sent, 2)
    # The policy's own limit wins over the caller's; NULL is no limit of the caller's.
    queue.set_policy(max_deliveries=3)
    queue.send(2)
    for expected in ("retry", "retry", "dead_lettered"):
        message = lease(queue)
        [(_, outcome)] = conn.execute(call, [queue.name, str(message.receipt), 1]).fetchall()
        assert outcome == expected
        make_visible(conn, queue)
    queue.set_policy(max_deliveries=0)
    queue.send(3)
    message = lease(queue)
    rows = conn.execute(call, [queue.name, str(message.receipt), None]).fetchall()
    assert rows == [(message.msg_id, "retry")]


def test_fail_refuses_a_callers_max_deliveries_below_one(conn: Conn, queue: Queue) -> None:
    queue.send(1)
    message = lease(queue)
    refused = "SELECT * FROM pgbroker.fail(%s, ARRAY[%s], 'e', default_max_deliveries => 0)"
    with pytest.raises(psycopg.Error) as info:
        conn.execute(refused, [queue.name, str(message.receipt)])
    assert info.value.sqlstate == "PB007"
    assert q_ids(conn, queue.name) == [message.msg_id]


def test_a_read_dead_letters_a_message_its_consumers_never_finished(
    conn: Conn, queue: Queue, dlq: Queue
) -> None:
    queue.set_policy(max_deliveries=2, dead_letter_queue=dlq.name)
    poison, other = queue.send_many(["poison", "other"])
    for _ in range(2):  # two consumers die holding it: nobody acks, nobody fails it
        assert lease(queue, vt=0).msg_id == poison
    found = queue.read_many(10)
    assert [m.msg_id for m in found] == [other]  # the batch goes on without it
    assert q_ids(conn, queue.name) == [other]
    [letter] = dlq.peek()
    assert letter.headers is not None
    why = letter.headers[DEAD]
    assert (why["msg_id"], why["deliveries"]) == (poison, 2)
    assert "without an ack" in why["error"]


def test_read_with_poll_honours_max_deliveries(conn: Conn, queue: Queue) -> None:
    queue.set_policy(max_deliveries=1)
    queue.send("poison")
    conn.execute("SELECT * FROM pgbroker.read(%s, 0, 1)", [queue.name])
    rows = conn.execute("SELECT * FROM pgbroker.read_with_poll(%s, 30, 1, 1, 50)", [queue.name]).fetchall()
    assert rows == []
    assert len(queue.dead_letters()) == 1


def test_replay_sends_dead_letters_back_as_fresh_messages(conn: Conn, queue: Queue, dlq: Queue) -> None:
    queue.set_policy(max_deliveries=1, dead_letter_queue=dlq.name)
    queue.send_many(["a", "b", "c"], headers=[{"h": 1}, None, None])
    for message in queue.read_many(3):
        queue.fail(message, error="bad")
    letters = queue.dead_letters()
    assert [m.message for m in letters] == ["a", "b", "c"]
    replayed = queue.replay_dead_letters([letters[0].msg_id, letters[2].msg_id])
    assert list(replayed) == [letters[0].msg_id, letters[2].msg_id]
    rows = {r[0]: r for r in q_rows(conn, queue.name)}
    assert [(rows[i][1], rows[i][3], rows[i][4]) for i in replayed.values()] == [
        (0, "a", {"h": 1}),
        (0, "c", None),
    ]
    assert [m.message for m in queue.dead_letters()] == ["b"]
    assert len(queue.replay_dead_letters()) == 1
    assert queue.dead_letters() == []
    assert queue.replay_dead_letters() == {}


def test_a_shared_dead_letter_queue_keeps_each_queues_letters_apart(
    new_queue: Callable[[], Queue], dlq: Queue
) -> None:
    first, second = new_queue(), new_queue()
    for queue in (first, second):
        queue.set_policy(max_deliveries=1, dead_letter_queue=dlq.name)
        queue.send(queue.name)
        queue.fail(lease(queue))
    assert [m.message for m in first.dead_letters()] == [first.name]
    assert first.purge_dead_letters() == 1
    assert [m.message for m in second.dead_letters()] == [second.name]
    assert list(second.replay_dead_letters().values()) == [m.msg_id for m in second.peek()]


def test_dead_letters_are_listed_in_pages_and_purged_by_msg_id(queue: Queue) -> None:
    queue.set_policy(max_deliveries=1)
    queue.send_many(list(range(5)))
    for message in queue.read_many(5):
        queue.fail(message)
    page = queue.dead_letters(2)
    assert [m.message for m in page] == [0, 1]
    assert [m.message for m in queue.dead_letters(2, after=page[-1].msg_id)] == [2, 3]
    assert queue.purge_dead_letters([page[0].msg_id, 999_999]) == 1
    assert [m.message for m in queue.dead_letters()] == [1, 2, 3, 4]


def test_dead_letters_are_never_refused_by_the_dead_letter_queues_depth(queue: Queue, dlq: Queue) -> None:
    queue.set_policy(max_deliveries=1, dead_letter_queue=dlq.name)
    dlq.set_policy(max_depth=1)
    queue.send_many([1, 2])
    for message in queue.read_many(2):
        assert queue.fail(message) == "dead_lettered"
    assert len(dlq.peek()) == 2


def test_complete_acks_by_the_queues_ack_mode(conn: Conn, queue: Queue) -> None:
    first, _ = queue.send_many([1, 2])
    assert queue.complete_many([lease(queue)]) == [first]
    assert len(a_ids(conn, queue.name)) == 1
    queue.set_policy(ack_mode="delete")
    message = lease(queue)
    assert queue.complete_many([message, message]) == [message.msg_id]
    assert len(a_ids(conn, queue.name)) == 1
    assert q_ids(conn, queue.name) == []


def test_peek_shows_messages_without_leasing_them(conn: Conn, queue: Queue) -> None:
    ids = queue.send_many(["a", "b", "c"])
    assert [m.msg_id for m in queue.peek(2)] == ids[:2]
    assert [m.msg_id for m in queue.peek(10, after=ids[0])] == ids[1:]
    assert [r[1] for r in q_rows(conn, queue.name)] == [0, 0, 0]
    assert all(m.receipt is None for m in queue.peek())


# -- backpressure ---------------------------------------------------------------------------------


def test_a_send_past_max_depth_fails_fast_and_sends_nothing(conn: Conn, queue: Queue) -> None:
    queue.set_policy(max_depth=3)
    queue.send_many([1, 2])
    lease(queue)  # in flight still counts: it is in the queue
    with pytest.raises(QueueFull, match="max_depth of 3") as info:
        queue.send_many([3, 4])  # all or nothing
    assert info.value.sqlstate == "PB006"
    assert info.value.hint
    assert len(q_ids(conn, queue.name)) == 2
    queue.send(3)
    with pytest.raises(psycopg.Error) as raw:
        conn.execute("SELECT pgmq.send(%s, '4')", [queue.name])  # pgmq's own functions too
    assert raw.value.sqlstate == "PB006"
    queue.set_policy(max_depth=0)
    queue.send(4)


def test_the_depth_is_counted_even_when_old_ids_make_the_estimate_large(conn: Conn, queue: Queue) -> None:
    queue.set_policy(max_depth=5)
    old = queue.send("old")  # stays: the queue spans many ids
    for _ in range(10):
        queue.delete_many(queue.send_many([1, 2, 3]))
    queue.send_many([1, 2, 3])
    with pytest.raises(QueueFull):
        queue.send_many([4, 5])
    queue.delete(old)
    queue.send_many([4, 5])


def test_a_waiting_send_goes_through_once_a_consumer_makes_room(broker: Broker, queue: Queue) -> None:
    queue.set_policy(max_depth=1)
    queue.send("first")

    def consume() -> None:
        time.sleep(0.3)
        queue.archive(queue.peek()[0].msg_id)

    consumer = threading.Thread(target=consume)
    consumer.start()
    started = time.monotonic()
    queue.send("second", wait=10)
    waited = time.monotonic() - started
    consumer.join()
    assert 0.25 < waited < 5
    assert [m.message for m in queue.peek()] == ["second"]


def test_a_waiting_send_gives_up_with_queue_full(queue: Queue) -> None:
    queue.set_policy(max_depth=1)
    queue.send(1)
    started = time.monotonic()
    with pytest.raises(QueueFull):
        queue.send(2, wait=0.4)
    assert 0.35 < time.monotonic() - started < 2


def test_a_waiting_send_in_a_transaction_leaves_the_transaction_usable(broker: Broker, queue: Queue) -> None:
    queue.set_policy(max_depth=1)
    queue.send(1)
    with broker.transaction() as tx:
        tx.connection.execute("CREATE TEMP TABLE mine (x int) ON COMMIT DROP")
        tx.connection.execute("INSERT INTO mine VALUES (1)")
        with pytest.raises(QueueFull):
            tx.queue(queue.name).send(2, wait=0.1)
        assert tx.connection.execute("SELECT count(*) FROM mine").fetchone() == (1,)


def test_an_async_waiting_send_goes_through_once_a_consumer_makes_room(dsn: str) -> None:
    async def scenario() -> list[Any]:
        async with AsyncBroker(dsn, max_connections=3) as broker:
            queue = await broker.create_queue("full")
            await queue.set_policy(max_depth=1)
            await queue.send("first")

            async def consume() -> None:
                await asyncio.sleep(0.3)
                await queue.archive((await queue.peek())[0].msg_id)

            consumer = asyncio.create_task(consume())
            with pytest.raises(QueueFull):
                await queue.send("never", wait=0)
            await queue.send("second", wait=10)
            await consumer
            return [m.message for m in await queue.peek()]

    assert asyncio.run(scenario()) == ["second"]


# -- retention ------------------------------------------------------------------------------------


def archive_at(conn: Conn, queue: Queue, ages_seconds: list[int]) -> None:
    """Archived messages as old as given (the archive as acks would have left it)."""
    conn.execute(
        sql.SQL(
            "INSERT INTO pgmq.{} (msg_id, vt, message, archived_at)"
            " SELECT 1000 + n, now(), to_jsonb(n), now() - make_interval(secs => age)"
            " FROM unnest(%s::int[]) WITH ORDINALITY AS a(age, n)"
        ).format(sql.Identifier(f"a_{queue.name}")),
        [ages_seconds],
    )


def archived_messages(conn: Conn, queue: Queue) -> list[int]:
    return sorted(r[2] for r in a_rows(conn, queue.name))


def test_without_retention_trim_deletes_nothing(conn: Conn, queue: Queue) -> None:
    archive_at(conn, queue, [10, 100_000])
    assert queue.trim_archive() == 0
    assert len(a_ids(conn, queue.name)) == 2


def test_trim_by_age_deletes_older_archived_messages_in_batches(conn: Conn, queue: Queue) -> None:
    archive_at(conn, queue, [5000, 4000, 3000, 2000, 10, 5])
    queue.set_policy(archive_retention_seconds=1000)
    assert [queue.trim_archive(batch_size=3), queue.trim_archive(batch_size=3), queue.trim_archive(3)] == [
        3,
        1,
        0,
    ]
    assert archived_messages(conn, queue) == [5, 6]  # message n is the n-th age: the two youngest stay


def test_trim_by_count_keeps_the_newest_rows(conn: Conn, queue: Queue) -> None:
    archive_at(conn, queue, [60, 50, 40, 30, 20, 10])
    queue.set_policy(archive_max_rows=2)
    assert [queue.trim_archive(batch_size=3), queue.trim_archive(batch_size=3), queue.trim_archive()] == [
        3,
        1,
        0,
    ]
    assert archived_messages(conn, queue) == [5, 6]


def test_trim_applies_age_and_count_together(conn: Conn, queue: Queue) -> None:
    archive_at(conn, queue, [5000, 40, 30, 20, 10])
    queue.set_policy(archive_retention_seconds=1000, archive_max_rows=3)
    assert queue.trim_archive() == 2
    assert archived_messages(conn, queue) == [3, 4, 5]


def test_trim_checks_its_batch_size(queue: Queue) -> None:
    with pytest.raises(InvalidArgument):
        queue.trim_archive(batch_size=0)


def test_a_worker_keeps_an_owners_notify_throttle(conn: Conn, broker: Broker, queue: Queue) -> None:
    queue.enable_notify(1000)
    queue.enable_notify(keep_existing=True)
    queue.enable_notify(0, keep_existing=True)
    rows = conn.execute(
        "SELECT throttle_interval_ms FROM pgmq.list_notify_insert_throttles() WHERE queue_name = %s",
        [queue.name],
    ).fetchall()
    assert rows == [(1000,)]
    with pytest.raises(QueueNotFound):
        broker.queue("no_such_queue").enable_notify(keep_existing=True)
