"""NOTIFY on insert (migration 0003) and the wake-ups of waiting reads (pgbroker._db.listen).

Notifications are observed on a raw LISTEN connection, never through pgbroker. Wake-up tests
use a poll interval far longer than any plausible delivery delay, so that a read returning
soon after a send can only have been woken by its notification.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgbroker import Broker, InvalidArgument, InvalidQueueName, Message, QueueNotFound
from pgbroker._db.wakeups import conninfo_of, reconnect_delay
from pgbroker.embedded import EmbeddedPostgres
from pgbroker.errors import from_postgres
from pgbroker.queues._client_async import AsyncBroker
from tests.support.faults import listener_pid
from tests.support.replication import wait_caught_up
from tests.support.tables import describe

Conn = psycopg.Connection[Any]

CHANNEL = "pgmq.q_jobs.INSERT"
# Waiting reads in the wake-up tests poll this rarely: a wake-up sooner is a notification's.
SLOW_POLL = 30.0
# How soon after a send a notified reader must have its message (generous for a loaded CI box).
WOKEN_WITHIN = 5.0
HOUR_MS = 3_600_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@pytest.fixture
def listening(dsn: str) -> Iterator[Conn]:
    """A raw connection LISTENing on the channel of queue 'jobs'."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        yield c


def heard(listener: Conn, timeout: float = 0.5) -> list[tuple[str, str]]:
    """(channel, payload) of every notification that arrives within ``timeout`` seconds."""
    return [(n.channel, n.payload) for n in listener.notifies(timeout=timeout)]


def heard_one(listener: Conn) -> tuple[str, str]:
    """The next notification; fails if none comes within WOKEN_WITHIN seconds."""
    got = [(n.channel, n.payload) for n in listener.notifies(timeout=WOKEN_WITHIN, stop_after=1)]
    assert got, "no notification"
    return got[0]


def send(conn: Conn, queue: str = "jobs") -> None:
    conn.execute("SELECT pgmq.send(%s, '{}')", [queue])


def throttles(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT * FROM pgmq.list_notify_insert_throttles()").fetchall()


def expire_throttle(conn: Conn, queue: str = "jobs") -> None:
    """Make the throttle interval of ``queue`` be over, as if an hour had passed."""
    conn.execute(
        "UPDATE pgmq.notify_insert_throttle SET last_notified_at = now() - interval '2 hours'"
        " WHERE queue_name = %s",
        [queue],
    )


def notify_triggers(conn: Conn, table: str = "q_jobs") -> list[str]:
    rows = conn.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
        [f"pgmq.{table}"],
    ).fetchall()
    return [row[0] for row in rows]


@pytest.fixture
def jobs(conn: Conn) -> str:
    conn.execute("SELECT pgmq.create('jobs')")
    return "jobs"


# -- the trigger --------------------------------------------------------------------------------


def test_a_committed_send_notifies_and_a_rolled_back_one_never_does(
    conn: Conn, jobs: str, listening: Conn
) -> None:
    conn.execute("SELECT pgmq.enable_notify_insert('jobs', 0)")
    with conn.transaction(force_rollback=True):
        send(conn)
    assert heard(listening) == []
    send(conn)
    assert heard_one(listening) == (CHANNEL, "")


def test_nothing_is_notified_before_notify_is_enabled(conn: Conn, jobs: str, listening: Conn) -> None:
    send(conn)
    assert heard(listening) == []


def test_a_batch_send_notifies_once(conn: Conn, jobs: str, listening: Conn) -> None:
    conn.execute("SELECT pgmq.enable_notify_insert('jobs', 0)")
    conn.execute("SELECT pgmq.send_batch('jobs', array_fill('{}'::jsonb, ARRAY[500]))")
    assert heard(listening, 1.0) == [(CHANNEL, "")]
    with conn.transaction():  # several sends, one transaction: Postgres folds them into one
        for _ in range(3):
            send(conn)
    assert heard(listening, 1.0) == [(CHANNEL, "")]


def test_throttle_allows_one_notification_per_interval(conn: Conn, jobs: str, listening: Conn) -> None:
    conn.execute("SELECT pgmq.enable_notify_insert('jobs', %s)", [HOUR_MS])
    for _ in range(5):
        send(conn)
    assert heard(listening, 1.0) == [(CHANNEL, "")]
    [(_, _, notified_at)] = throttles(conn)
    assert notified_at > EPOCH
    expire_throttle(conn)
    send(conn)
    send(conn)
    assert heard(listening, 1.0) == [(CHANNEL, "")]


def test_a_mixed_case_queue_notifies_on_its_name_as_stored(conn: Conn, dsn: str) -> None:
    """pgmq 1.13.1's channel: "pgmq.q_<name as in pgmq.meta>.INSERT", whatever spelling is passed."""
    conn.execute("SELECT pgmq.create('BigOrders')")
    conn.execute("SELECT pgmq.enable_notify_insert('bigorders', 0)")
    assert [row[0] for row in throttles(conn)] == ["BigOrders"]
    channel = conn.execute("SELECT pgbroker.notify_channel('BIGORDERS')").fetchone()
    assert channel == ("pgmq.q_BigOrders.INSERT",)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute('LISTEN "pgmq.q_BigOrders.INSERT"')
        send(conn, "BigOrders")
        assert heard_one(listener) == ("pgmq.q_BigOrders.INSERT", "")


def test_a_trigger_made_before_the_channel_followed_the_name_notifies_on_the_new_channel(
    conn: Conn, dsn: str
) -> None:
    """Triggers made by 0.1.0 carry a second argument, the lower-cased channel: it is not used."""
    conn.execute("SELECT pgmq.create('BigOrders')")
    conn.execute("SELECT pgmq.enable_notify_insert('BigOrders', 0)")
    conn.execute("DROP TRIGGER pgbroker_notify_insert ON pgmq.q_bigorders")
    conn.execute(
        "CREATE TRIGGER pgbroker_notify_insert AFTER INSERT ON pgmq.q_bigorders FOR EACH STATEMENT"
        " EXECUTE FUNCTION pgbroker._notify_insert('BigOrders', 'pgmq.q_bigorders.INSERT')"
    )
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute('LISTEN "pgmq.q_BigOrders.INSERT"')
        send(conn, "BigOrders")
        assert heard_one(listener) == ("pgmq.q_BigOrders.INSERT", "")


@pytest.mark.parametrize("throttle_ms", [0, HOUR_MS])
def test_a_sender_never_waits_for_another_senders_claim(
    conn: Conn, jobs: str, listening: Conn, dsn: str, throttle_ms: int
) -> None:
    """pgmq makes the second sender wait for the first one's commit; here it goes on.

    Its message is announced by the first sender's notification, when that one commits.
    """
    conn.execute("SELECT pgmq.enable_notify_insert('jobs', %s)", [throttle_ms])
    with psycopg.connect(dsn) as first, psycopg.connect(dsn, autocommit=True) as second:
        send(first)  # claims the notification; its transaction stays open
        second.execute("SET statement_timeout = '10s'")  # fail rather than hang
        send(second)
        assert heard(listening) == []
        first.commit()
        assert heard(listening, 1.0) == [(CHANNEL, "")]


def test_after_a_rolled_back_claim_the_next_send_announces(
    conn: Conn, jobs: str, listening: Conn, dsn: str
) -> None:
    """The documented loss: a send covered by a claim that rolls back waits for the next one."""
    conn.execute("SELECT pgmq.enable_notify_insert('jobs', 0)")
    with psycopg.connect(dsn) as first:
        send(first)
        send(conn)
        first.rollback()
    assert heard(listening) == []
    send(conn)
    assert heard(listening, 1.0) == [(CHANNEL, "")]


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_sender_in_a_snapshot_transaction_is_never_failed_by_the_throttle(
    conn: Conn, jobs: str, listening: Conn, dsn: str, isolation: str
) -> None:
    """Updating a throttle row another sender updated after the snapshot would fail the send."""
    conn.execute("SELECT pgmq.enable_notify_insert('jobs', 0)")
    with psycopg.connect(dsn) as snap:
        snap.execute(sql.SQL("SET TRANSACTION ISOLATION LEVEL {}").format(sql.SQL(isolation)))
        snap.execute("SELECT 1")  # takes the snapshot
        send(conn)  # updates the throttle row after it
        assert heard_one(listening) == (CHANNEL, "")
        send(snap)
        snap.commit()
    assert heard_one(listening) == (CHANNEL, "")


# -- enable, update, disable, list --------------------------------------------------------------


def test_enable_is_idempotent_and_resets_the_throttle(conn: Conn, jobs: str) -> None:
    conn.execute("SELECT pgmq.enable_notify_insert('jobs')")
    assert throttles(conn) == [("jobs", 250, EPOCH)]
    send(conn)
    conn.execute("SELECT pgmq.enable_notify_insert(queue_name => 'JOBS', throttle_interval_ms => 10)")
    assert throttles(conn) == [("jobs", 10, EPOCH)]
    assert notify_triggers(conn) == ["pgbroker_notify_insert"]


def test_update_changes_the_interval_and_resets_last_notified(conn: Conn, jobs: str, listening: Conn) -> None:
    conn.execute("SELECT pgmq.enable_notify_insert('jobs', %s)", [HOUR_MS])
    send(conn)
    assert heard_one(listening) == (CHANNEL, "")
    conn.execute("SELECT pgmq.update_notify_insert(queue_name => 'jobs', throttle_interval_ms => 0)")
    assert throttles(conn) == [("jobs", 0, EPOCH)]
    send(conn)
    assert heard_one(listening) == (CHANNEL, "")


def test_disable_stops_notifications_and_is_idempotent(conn: Conn, jobs: str, listening: Conn) -> None:
    conn.execute("SELECT pgmq.enable_notify_insert('jobs', 0)")
    conn.execute("SELECT pgmq.disable_notify_insert('jobs')")
    conn.execute("SELECT pgmq.disable_notify_insert('Jobs')")
    send(conn)
    assert heard(listening) == []
    assert throttles(conn) == []
    assert notify_triggers(conn) == []


def test_list_is_ordered_by_name_with_the_contract_columns(conn: Conn) -> None:
    for name, ms in [("b", 5), ("A", 0), ("c", 250)]:
        conn.execute("SELECT pgmq.create(%s)", [name])
        conn.execute("SELECT pgmq.enable_notify_insert(%s, %s)", [name, ms])
    cur = conn.execute("SELECT * FROM pgmq.list_notify_insert_throttles()")
    assert describe(conn, cur) == [
        ("queue_name", "text"),
        ("throttle_interval_ms", "integer"),
        ("last_notified_at", "timestamp with time zone"),
    ]
    assert [row[:2] for row in cur.fetchall()] == [("A", 0), ("b", 5), ("c", 250)]


def test_drop_queue_removes_the_throttle_and_a_new_queue_starts_without_notify(
    conn: Conn, jobs: str, listening: Conn
) -> None:
    conn.execute("SELECT pgmq.enable_notify_insert('jobs', 0)")
    assert conn.execute("SELECT pgmq.drop_queue('jobs')").fetchone() == (True,)
    assert throttles(conn) == []
    conn.execute("SELECT pgmq.create('jobs')")
    send(conn)
    assert heard(listening) == []


# (call, SQLSTATE, pgbroker's code in DETAIL): the functions of schema pgmq fail as pgmq's do
# (P0001, or Postgres' NOT NULL for a NULL throttle), with pgbroker's code for its client.
BAD_CALLS: list[Any] = [
    pytest.param("SELECT pgmq.enable_notify_insert('jobs', -1)", "P0001", "PB007", id="enable-negative"),
    pytest.param("SELECT pgmq.enable_notify_insert('jobs', NULL)", "23502", None, id="enable-null"),
    pytest.param("SELECT pgmq.update_notify_insert('jobs', -5)", "P0001", "PB007", id="update-negative"),
    pytest.param("SELECT pgmq.update_notify_insert('jobs', 10)", "P0001", "PB007", id="update-not-enabled"),
    pytest.param("SELECT pgmq.enable_notify_insert('nope')", "P0001", "PB002", id="enable-missing"),
    pytest.param("SELECT pgmq.update_notify_insert('nope', 10)", "P0001", "PB002", id="update-missing"),
    pytest.param("SELECT pgbroker.notify_channel('nope')", "PB002", "PB002", id="channel-missing"),
    pytest.param("SELECT pgmq.enable_notify_insert('a;b')", "P0001", "PB001", id="enable-bad-name"),
]


@pytest.mark.parametrize(("query", "sqlstate", "code"), BAD_CALLS)
def test_bad_arguments_are_refused_with_pgmqs_error_and_pgbrokers_code(
    conn: Conn, jobs: str, query: str, sqlstate: str, code: str | None
) -> None:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(query)
    assert caught.value.diag.sqlstate == sqlstate
    if code is not None:
        assert from_postgres(caught.value).code == code
        assert caught.value.diag.message_hint
    assert throttles(conn) == []
    assert notify_triggers(conn) == []


def test_disabling_a_missing_queue_is_pgmqs_notice(conn: Conn, jobs: str) -> None:
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    conn.execute("SELECT pgmq.disable_notify_insert('nope')")
    assert notices == ['relation "pgmq.q_nope" does not exist, skipping']
    assert throttles(conn) == []


# -- the clients --------------------------------------------------------------------------------


def test_client_enables_and_disables_notify(dsn: str, conn: Conn) -> None:
    with Broker(dsn) as broker:
        queue = broker.create_queue("jobs", notify=True)
        assert throttles(conn) == [("jobs", 250, EPOCH)]
        queue.enable_notify(0)
        assert throttles(conn) == [("jobs", 0, EPOCH)]
        queue.disable_notify()
        assert throttles(conn) == []
        with pytest.raises(InvalidArgument, match="throttle_ms"):
            queue.enable_notify(-1)
        with pytest.raises(QueueNotFound):
            broker.queue("nope").enable_notify()
        with pytest.raises(InvalidQueueName):
            broker.queue("a;b").disable_notify()


def test_bad_poll_interval_is_an_invalid_argument(dsn: str) -> None:
    for bad in (0, -1, float("nan"), True):
        with pytest.raises(InvalidArgument, match="poll_interval"):
            Broker(dsn, poll_interval=bad)


class Reader:
    """A sync read_many(wait=...) on a thread, timing when it returns."""

    def __init__(self, read: Callable[[], list[Message]]) -> None:
        self.result: list[Message] | None = None
        self.returned_at = 0.0
        self._thread = threading.Thread(target=self._run, args=(read,), daemon=True)
        self._thread.start()

    def _run(self, read: Callable[[], list[Message]]) -> None:
        self.result = read()
        self.returned_at = time.monotonic()

    def join(self) -> list[Message]:
        self._thread.join(SLOW_POLL * 2)
        assert self.result is not None, "the reader did not return"
        return self.result


@pytest.mark.parametrize("own_connection", [False, True], ids=["pool", "connection"])
def test_a_waiting_sync_reader_wakes_on_a_send_and_holds_no_connection(
    dsn: str, conn: Conn, own_connection: bool
) -> None:
    with psycopg.connect(dsn, autocommit=True) as own:
        broker = (
            Broker(connection=own, poll_interval=SLOW_POLL)
            if own_connection
            # One connection: the send below could not run while the reader held it.
            else Broker(dsn, max_connections=1, poll_interval=SLOW_POLL)
        )
        with broker:
            queue = broker.create_queue("jobs")
            queue.enable_notify(0)
            reader = Reader(lambda: queue.read_many(5, wait=SLOW_POLL * 1.5))
            listener_pid(conn)  # the reader has subscribed
            time.sleep(0.2)
            sent_at = time.monotonic()
            queue.send({"n": 1})
            [message] = reader.join()
            assert reader.returned_at - sent_at < WOKEN_WITHIN
            queue.ack(message)


def test_a_waiting_reader_of_a_mixed_case_queue_wakes_on_its_channel(dsn: str, conn: Conn) -> None:
    """pgbroker's own listener follows the channel of the name as given (pgmq 1.13.1's), whatever
    spelling the reader uses."""
    with Broker(dsn, max_connections=1, poll_interval=SLOW_POLL) as broker:
        broker.create_queue("MixedJobs").enable_notify(0)
        queue = broker.queue("mixedjobs")
        reader = Reader(lambda: queue.read_many(5, wait=SLOW_POLL * 1.5))
        listener_pid(conn)
        time.sleep(0.2)
        sent_at = time.monotonic()
        broker.queue("MIXEDJOBS").send({"n": 1})
        [message] = reader.join()
        assert reader.returned_at - sent_at < WOKEN_WITHIN
        queue.ack(message)


def test_a_waiting_async_reader_and_consumer_wake_on_a_send(dsn: str) -> None:
    async def scenario() -> list[float]:
        async with AsyncBroker(dsn, max_connections=1, poll_interval=SLOW_POLL) as broker:
            queue = await broker.create_queue("jobs")
            await queue.enable_notify(0)

            async def read() -> float:
                [message] = await queue.read_many(5, wait=SLOW_POLL * 1.5)
                await queue.ack(message)
                return time.monotonic()

            async def consume() -> float:
                async for message in queue.consume(idle_wait=SLOW_POLL * 1.5):
                    await queue.ack(message)
                    return time.monotonic()
                raise AssertionError("consume() ended")

            delays = []
            for waiter in (read, consume):
                task = asyncio.create_task(waiter())
                await asyncio.sleep(0.5)  # it reads, subscribes and sleeps
                assert not task.done()
                sent_at = time.monotonic()
                await queue.send({})
                delays.append(await task - sent_at)
            return delays

    read_delay, consume_delay = asyncio.run(scenario())
    assert read_delay < WOKEN_WITHIN
    assert consume_delay < WOKEN_WITHIN


def test_a_sync_reader_is_woken_again_after_its_listener_connection_is_terminated(
    dsn: str, conn: Conn
) -> None:
    with Broker(dsn, poll_interval=SLOW_POLL) as broker:
        queue = broker.create_queue("jobs")
        queue.enable_notify(0)
        reader = Reader(lambda: queue.read_many(1, wait=SLOW_POLL * 1.5))
        first = listener_pid(conn)
        conn.execute("SELECT pg_terminate_backend(%s)", [first])
        listener_pid(conn, exclude=first)  # reconnected and LISTENing again
        time.sleep(1.0)  # the reader has re-read and sleeps again
        sent_at = time.monotonic()
        send(conn)
        assert len(reader.join()) == 1
        assert reader.returned_at - sent_at < WOKEN_WITHIN


def test_an_async_reader_is_woken_again_after_its_listener_connection_is_terminated(
    dsn: str, conn: Conn
) -> None:
    async def scenario() -> float:
        async with AsyncBroker(dsn, poll_interval=SLOW_POLL) as broker:
            queue = await broker.create_queue("jobs")
            await queue.enable_notify(0)

            async def read() -> float:
                assert len(await queue.read_many(1, wait=SLOW_POLL * 1.5)) == 1
                return time.monotonic()

            task = asyncio.create_task(read())
            first = await asyncio.to_thread(listener_pid, conn)
            await asyncio.to_thread(conn.execute, "SELECT pg_terminate_backend(%s)", [first])
            await asyncio.to_thread(listener_pid, conn, first)
            await asyncio.sleep(1.0)
            assert not task.done()
            sent_at = time.monotonic()
            await queue.send({})
            return await task - sent_at

    assert asyncio.run(scenario()) < WOKEN_WITHIN


def test_a_listener_on_a_server_that_refuses_listen_backs_off(
    replicated: tuple[EmbeddedPostgres, EmbeddedPostgres], caplog: pytest.LogCaptureFixture
) -> None:
    """A standby (the DSN names the old primary after a switchover) takes the listener's
    connection but refuses its LISTEN. The listener tries again later each time, as after a
    connection refused: it used to reconnect every 0.1 s for as long as that lasted, a new
    session and a warning ten times a second from each process."""
    primary, standby = replicated
    with Broker(primary.dsn()) as broker:
        broker.create_queue("jobs", notify=True)
    wait_caught_up(primary, standby)
    caplog.set_level(logging.WARNING, logger="pgbroker.listen")

    def attempts() -> list[float]:
        return [r.created for r in caplog.records if r.name == "pgbroker.listen"]

    async def scenario() -> None:
        async with AsyncBroker(standby.dsn()) as on_standby:
            queue = on_standby.queue("jobs")
            await queue.listen(0.5)  # starts the listener; its LISTEN never takes
            deadline = time.monotonic() + 120
            while len(attempts()) < 6:
                assert time.monotonic() < deadline, f"{len(attempts())} attempts in 120 s"
                await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert "cannot execute LISTEN during recovery" in caplog.records[0].getMessage()
    tried = attempts()[:6]
    # The pauses double from reconnect_delay(0): the fifth is at least reconnect_delay(4).
    assert tried[5] - tried[4] >= reconnect_delay(4)


def test_a_queue_without_notify_is_polled(dsn: str, conn: Conn) -> None:
    with Broker(dsn, poll_interval=0.2) as broker:
        queue = broker.create_queue("jobs")
        started = time.monotonic()
        assert queue.read_many(1, wait=0.5) == []
        assert time.monotonic() - started >= 0.5
        reader = Reader(lambda: queue.read_many(1, wait=SLOW_POLL))
        time.sleep(0.5)
        sent_at = time.monotonic()
        send(conn)
        assert len(reader.join()) == 1
        assert reader.returned_at - sent_at < WOKEN_WITHIN


def test_the_listener_conninfo_keeps_the_password_and_adds_keepalives(dsn: str) -> None:
    with psycopg.connect(dsn) as c:
        params = conninfo_to_dict(conninfo_of(c.info))
    assert params["keepalives"] == "1"
    assert params["dbname"] == conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(make_conninfo(dsn, password="secret", keepalives_idle="7")) as c:
        params = conninfo_to_dict(conninfo_of(c.info))
    assert (params["password"], params["keepalives_idle"]) == ("secret", "7")


def test_the_listener_connects_with_the_dsn_as_given(dsn: str) -> None:
    """Every host of a multi-host DSN, and target_session_attrs: after a failover the listener
    reconnects to the new primary, as the pool does (not to the server that answered first)."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    params = conninfo_to_dict(dsn)
    multi_host = make_conninfo(
        dsn,
        host=f"127.0.0.1,{params['host']}",
        port=f"{closed_port},{params['port']}",
        target_session_attrs="read-write",
    )
    with Broker(multi_host) as broker:
        queue = broker.create_queue("jobs", notify=True)
        assert queue.read_many(1, wait=0.2) == []  # a waiting read starts the listener
        listener = conninfo_to_dict(broker._listen_conninfo())
    given = conninfo_to_dict(multi_host)
    assert (listener["host"], listener["port"]) == (given["host"], given["port"])
    assert listener["target_session_attrs"] == "read-write"
