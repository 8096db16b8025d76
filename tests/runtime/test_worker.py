"""The worker runtime in process: handlers, concurrency, outcomes by policy, leases and heartbeats,
graceful stop, wake-ups, and what an idle worker costs the server."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from pgbroker import App, Broker, DatabaseError, InvalidArgument, Message, Queue, QueueNotFound, Worker
from pgbroker._db.listen_async import AsyncSubscription
from pgbroker._db.wakeups import WAKE_BURST, WAKE_RATE
from pgbroker.embedded import EmbeddedPostgres
from pgbroker.queues._client_async import AsyncBroker, AsyncQueue
from pgbroker.runtime import _registration, _worker
from pgbroker.runtime._app import serve
from pgbroker.runtime._worker import DEFAULT_MAX_DELIVERIES
from pgbroker.runtime._worker_stats import WorkerStats
from pgbroker.schedules._scheduler import Scheduler
from tests.support.faults import freezable, impatient, listener_pid, sessions_frozen, table_locked
from tests.support.roles import role_logins
from tests.support.servers import free_port
from tests.support.tables import Conn, a_rows, q_rows
from tests.support.worker import run_until, while_serving

DEAD = "x-pgbroker-dead-letter"


def test_sync_and_async_handlers_consume_every_message(broker: Broker, dsn: str, conn: Conn) -> None:
    sync_queue, async_queue = broker.create_queue("sync_jobs"), broker.create_queue("async_jobs")
    sent = sync_queue.send_many(list(range(50)))
    async_queue.send_many(list(range(50)))
    seen: dict[str, list[int]] = {"sync": [], "async": []}
    threads: set[str] = set()

    def handle_sync(message: Message) -> None:
        threads.add(threading.current_thread().name)
        seen["sync"].append(message.message)

    async def handle_async(message: Message) -> None:
        await asyncio.sleep(0)
        seen["async"].append(message.message)

    workers = [
        Worker("sync_jobs", handle_sync, concurrency=4),
        Worker("async_jobs", handle_async, concurrency=4),
    ]
    asyncio.run(run_until(dsn, workers, lambda: all(w.stats.completed == 50 for w in workers)))
    assert sorted(seen["sync"]) == sorted(seen["async"]) == list(range(50))
    assert all(name.startswith("pgbroker-sync_jobs") for name in threads)  # sync handlers ran on threads
    assert [r[0] for r in a_rows(conn, "sync_jobs")] == sent
    assert q_rows(conn, "sync_jobs") == q_rows(conn, "async_jobs") == []


def _run_by_a_sync_wrapper(handler: Callable[[Message], Awaitable[None]]) -> Callable[[Message], Any]:
    """A decorator written for functions, as many are (logging, retries): the wrapper is sync, and
    returns the async handler's coroutine."""

    @functools.wraps(handler)
    def wrapper(message: Message) -> Any:
        return handler(message)

    return wrapper


def test_an_async_handler_behind_a_sync_wrapper_runs_and_its_failure_is_a_failure(
    broker: Broker, dsn: str, conn: Conn
) -> None:
    # The worker ran the wrapper on a thread and dropped the coroutine it returned: the handler
    # never ran, its message was acked as handled (a RuntimeWarning 'never awaited' the only sign),
    # and a handler that would have raised was acked too.
    queue = broker.create_queue("jobs")
    sent = queue.send_many([{"fail": False}, {"fail": True}])
    ran: list[int] = []

    @_run_by_a_sync_wrapper
    async def handle(message: Message) -> None:
        await asyncio.sleep(0)
        ran.append(message.msg_id)
        if message.message["fail"]:
            raise ValueError("handled, and failed")

    worker = Worker("jobs", handle, max_deliveries=1)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.completed + worker.stats.dead_lettered == 2))
    assert sorted(ran) == sent
    assert (worker.stats.completed, worker.stats.dead_lettered) == (1, 1)


def test_concurrency_is_the_number_of_messages_in_flight(broker: Broker, dsn: str) -> None:
    broker.create_queue("jobs").send_many(list(range(40)))
    running = peak = 0

    async def handle(message: Message) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1

    worker = Worker("jobs", handle, concurrency=5)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.completed == 40))
    assert peak == 5
    assert worker.stats.reads < 40  # reads are shared by several messages


def test_the_read_ahead_of_many_fast_slots_covers_three_read_round_trips() -> None:
    """64 handlers of 2 ms go through 32 messages a millisecond; with reads of 10 ms (scenario (g)
    at W = 64 on two cores) three round trips are 960 messages. Held to 500, the slots waited for
    reads: none ran for a tenth of the time, and W = 64 made 0.8x of the rate it makes now."""

    async def handle(message: Message) -> None:
        await asyncio.sleep(0.002)

    worker = Worker("jobs", handle, concurrency=64)
    assert worker._held_most == 64  # before any handler has finished: no read-ahead
    worker._handler_seconds, worker._read_seconds = 0.002, 0.010
    worker._size_capacity()
    assert worker._held_most - worker.concurrency >= 3 * 0.010 * 64 / 0.002
    # A machine whose reads took 25 ms and whose handlers' 1 ms sleeps lasted 2.4: three round
    # trips are 2,000 messages. Held to 1,000, the slots were 75-77% busy (94-97% now).
    worker._handler_seconds, worker._read_seconds = 0.0024, 0.025
    worker._size_capacity()
    assert worker._held_most - worker.concurrency >= 2000
    worker._handler_seconds = 5.0  # slow handlers: none read ahead
    worker._size_capacity()
    assert worker._held_most == 64


def test_room_that_goes_while_the_worker_subscribes_does_not_stop_it(
    broker: Broker, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker subscribes to wake-ups (again after a lost connection) between seeing room for a
    # read and sizing it. What it may hold follows the handlers' pace and so can shrink meanwhile:
    # a read was then asked for a negative count, InvalidArgument left the loop, and the worker
    # exited with an error (seen after a Postgres restart in tests/system/test_worker_chaos.py).
    broker.create_queue("jobs").send_many(list(range(30)))
    shrunk = False

    class PacedWorker(Worker):
        def _size_capacity(self) -> None:
            super()._size_capacity()
            if shrunk:
                self._held_most = -5

    real_listen = AsyncQueue.listen

    async def listen(self: AsyncQueue, timeout: float = 5.0) -> AsyncSubscription:
        nonlocal shrunk
        subscription = await real_listen(self, timeout)
        shrunk = True  # the handlers' pace moved while the subscription was made
        worker._size_capacity()
        asyncio.get_running_loop().call_later(0.2, unshrink)
        return subscription

    def unshrink() -> None:
        nonlocal shrunk
        shrunk = False
        worker._size_capacity()
        worker._changed.set()  # as a handler finishing tells the loop

    monkeypatch.setattr(AsyncQueue, "listen", listen)
    worker = PacedWorker("jobs", lambda message: None, concurrency=4)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.completed == 30))
    assert worker.stats.completed == 30


def test_a_running_worker_has_a_row_with_what_it_holds_and_its_row_goes_when_it_stops(
    broker: Broker, dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_registration, "BEAT_SECONDS", 0.2)
    broker.create_queue("jobs").send_many(list(range(3)))
    release = threading.Event()
    seen: list[tuple[Any, ...]] = []

    def handle(message: Message) -> None:
        release.wait(120)

    def done() -> bool:
        if not release.is_set():
            seen[:] = conn.execute(
                "SELECT queue_name, pid, concurrency, in_flight, heartbeat_age_sec < 60"
                " FROM pgbroker.queue_workers()"
            ).fetchall()
            if seen and seen[0][3] == 3:  # its heartbeat told what it holds
                release.set()
        return worker.stats.completed == 3

    worker = Worker("jobs", handle, concurrency=4)
    asyncio.run(run_until(dsn, [worker], done, timeout=120))
    assert seen == [("jobs", os.getpid(), 4, 3, True)]
    assert conn.execute("SELECT count(*) FROM pgbroker.queue_workers").fetchone() == (0,)  # gone at stop


def test_a_registration_cancelled_as_a_pooled_connection_comes_free_ends(broker: Broker, dsn: str) -> None:
    """A worker's stop cancels its registration's beats, and waits for them. A beat waiting for
    the pool's connection, cancelled as that connection came free, went on: psycopg_pool waits
    for a connection with asyncio.wait_for, which on Python 3.11 returns the result instead of
    raising when the result and the cancellation come together (CPython gh-86296), so the beat
    ran, slept until the next one, and beat for ever; the stop waited for it for good (a `pgbroker
    worker --processes 2` stop hung, its process idle, its row still beating). Every turn of the
    event loop between the hand-over and the cancellation is tried."""
    broker.create_queue("jobs")

    async def scenario() -> list[int]:
        stuck = []
        async with AsyncBroker(dsn, min_connections=1, max_connections=1) as broker:
            pool = broker._pool
            assert pool is not None
            for turns in range(12):
                registration = _registration.Registration("jobs", 1)
                async with broker.connection():  # the pool's only connection, held
                    beats = asyncio.create_task(registration.keep(broker, lambda: (0, WorkerStats())))
                    while pool.get_stats().get("requests_waiting", 0) == 0:
                        await asyncio.sleep(0.01)
                for _ in range(turns):  # the connection, given back, goes to the waiting beat
                    await asyncio.sleep(0)
                beats.cancel()
                done, _ = await asyncio.wait([beats], timeout=10)
                if not done:
                    stuck.append(turns)
                    beats.cancel()
                    await asyncio.wait([beats])
        return stuck

    assert asyncio.run(scenario()) == [], "beats that went on after their cancellation (turns)"


def test_an_always_failing_handler_dead_letters_after_exactly_max_deliveries(
    broker: Broker, dsn: str, conn: Conn
) -> None:
    queue = broker.create_queue("jobs")
    broker.create_queue("jobs_dlq")
    queue.set_policy(max_deliveries=3, backoff="fixed", backoff_base_seconds=0, dead_letter_queue="jobs_dlq")
    sent = queue.send({"order": 1})
    deliveries: list[int] = []

    def handle(message: Message) -> None:
        deliveries.append(message.read_ct)
        raise ValueError(f"cannot ship order {message.message['order']}")

    worker = Worker("jobs", handle)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.dead_lettered == 1))
    assert deliveries == [1, 2, 3]
    assert (worker.stats.retried, worker.stats.dead_lettered, worker.stats.completed) == (2, 1, 0)
    assert q_rows(conn, "jobs") == []
    [letter] = queue.dead_letters()
    assert letter.headers is not None
    why = letter.headers[DEAD]
    assert (why["msg_id"], why["deliveries"]) == (sent, 3)
    assert why["error"] == "ValueError: cannot ship order 1"
    # Every attempt is kept, with the handler's traceback (the worker logged the same msg_id).
    assert letter.msg_id == sent
    attempts = letter.headers["x-pgbroker-attempts"]
    assert [a["delivery"] for a in attempts] == [1, 2, 3]
    assert all(a["error"] == "ValueError: cannot ship order 1" for a in attempts)
    assert all("in handle" in a["traceback"] for a in attempts)
    assert all(a["traceback"].endswith("cannot ship order 1\n") for a in attempts)


def test_a_worker_dead_letters_at_its_own_limit_when_the_queue_has_no_policy(
    broker: Broker, dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    # No policy at all: the worker's limit ends the retries (instead of for ever), the message
    # goes to the queue's archive as a dead letter, and a WARNING says where to find it.
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    queue = broker.create_queue("jobs")
    sent = queue.send({"order": 1})
    deliveries: list[int] = []

    def handle(message: Message) -> None:
        deliveries.append(message.read_ct)
        raise ValueError("cannot ship")

    worker = Worker("jobs", handle, max_deliveries=2)  # the back-off of the default policy: 1 s
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.dead_lettered == 1))
    assert deliveries == [1, 2]
    assert q_rows(conn, "jobs") == []
    [letter] = queue.dead_letters()
    assert letter.msg_id == sent
    assert letter.headers is not None
    assert letter.headers[DEAD]["deliveries"] == 2
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("worker.dead_lettered")]
    assert "delivery=2" in line
    assert '"pgbroker dlq list jobs"' in line


def test_a_queues_policy_wins_over_the_workers_limit(broker: Broker, dsn: str) -> None:
    queue = broker.create_queue("jobs")
    queue.set_policy(max_deliveries=2, backoff="fixed", backoff_base_seconds=0)
    queue.send({"order": 1})
    deliveries: list[int] = []

    def handle(message: Message) -> None:
        deliveries.append(message.read_ct)
        raise ValueError("cannot ship")

    worker = Worker("jobs", handle, max_deliveries=5)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.dead_lettered == 1))
    assert deliveries == [1, 2]


def test_a_workers_limit_is_finite_by_default_and_none_turns_it_off(broker: Broker, dsn: str) -> None:
    assert Worker("jobs", print).max_deliveries == DEFAULT_MAX_DELIVERIES == 25
    queue = broker.create_queue("jobs")
    queue.set_policy(backoff="fixed", backoff_base_seconds=0)
    queue.send({"order": 1})
    deliveries: list[int] = []

    def handle(message: Message) -> None:
        deliveries.append(message.read_ct)
        raise ValueError("cannot ship")

    worker = Worker("jobs", handle, max_deliveries=None)
    asyncio.run(run_until(dsn, [worker], lambda: len(deliveries) >= 4))
    assert worker.stats.dead_lettered == 0
    assert worker.stats.retried >= 3


def test_a_handler_s_failure_is_logged_at_warning_with_its_traceback(
    broker: Broker, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    # WARNING is what the CLI shows without -v: a buggy handler must not look like an idle worker.
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    queue = broker.create_queue("jobs")
    queue.set_policy(max_deliveries=1)
    sent = queue.send({"order": 1})

    def handle(message: Message) -> None:
        raise ValueError("cannot ship")

    worker = Worker("jobs", handle)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.dead_lettered == 1))
    [failed] = [r for r in caplog.records if r.getMessage().startswith("worker.handler_failed")]
    assert failed.levelno == logging.WARNING
    assert f"msg_id={sent}" in failed.getMessage()
    assert 'error="ValueError: cannot ship"' in failed.getMessage()
    assert failed.exc_info is not None
    assert failed.exc_info[0] is ValueError


def test_a_handler_that_raises_cancelled_error_fails_its_message_and_the_worker_goes_on(
    broker: Broker, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An async handler awaiting something cancelled elsewhere (a client library's inner task
    cancelled as its connection drops) raises CancelledError though the worker cancelled nothing:
    that is the handler's failure (logged, retried by the policy), not a stop. Its outcome used to
    go unrecorded and unlogged: the message came back only after its vt, and one that always did
    so was never dead-lettered."""
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    queue = broker.create_queue("jobs")
    queue.set_policy(backoff="fixed", backoff_base_seconds=0, backoff_jitter=False)
    queue.send_many(list(range(5)))
    attempts: dict[int, int] = {}

    async def handle(message: Message) -> None:
        attempts[message.message] = attempts.get(message.message, 0) + 1
        if message.message == 2 and attempts[2] == 1:
            gone = asyncio.get_running_loop().create_future()
            gone.cancel()
            await gone

    worker = Worker("jobs", handle, vt=120)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.completed == 5, timeout=60))
    assert attempts == {0: 1, 1: 1, 2: 2, 3: 1, 4: 1}
    assert worker.stats.retried == 1
    [failed] = [r for r in caplog.records if r.getMessage().startswith("worker.handler_failed")]
    assert "CancelledError" in failed.getMessage()


def test_a_handler_slower_than_its_lease_cannot_ack_and_the_consumer_that_took_over_acks(
    broker: Broker, dsn: str, conn: Conn
) -> None:
    queue = broker.create_queue("jobs")
    sent = queue.send("slow")
    handled: list[tuple[str, int]] = []
    slow_started = threading.Event()

    def slow(message: Message) -> None:
        handled.append(("slow", message.read_ct))
        slow_started.set()
        time.sleep(2.5)  # the lease is 1 s, and nothing extends it

    def fast(message: Message) -> None:
        handled.append(("fast", message.read_ct))

    slow_worker = Worker("jobs", slow, vt=1, heartbeat=False)
    fast_worker = Worker("jobs", fast, vt=30, poll_max=0.2)

    def both_done() -> bool:
        return slow_worker.stats.stale == 1 and fast_worker.stats.completed == 1

    async def scenario() -> None:
        async def start_fast_after_slow() -> None:
            while not slow_started.is_set():
                await asyncio.sleep(0.01)
            await run_until(dsn, [fast_worker], both_done)

        second = asyncio.create_task(start_fast_after_slow())
        await run_until(dsn, [slow_worker], both_done)
        await second

    asyncio.run(scenario())
    assert handled == [("slow", 1), ("fast", 2)]
    assert (slow_worker.stats.completed, slow_worker.stats.stale) == (0, 1)
    assert (fast_worker.stats.completed, fast_worker.stats.stale) == (1, 0)
    [(msg_id, read_ct, _, _)] = a_rows(conn, "jobs")
    assert (msg_id, read_ct) == (sent, 2)


def test_the_heartbeat_keeps_the_lease_of_a_slow_handler(broker: Broker, dsn: str, conn: Conn) -> None:
    queue = broker.create_queue("jobs")
    queue.send("slow")
    deliveries: list[int] = []

    async def slow(message: Message) -> None:
        deliveries.append(message.read_ct)
        await asyncio.sleep(3)

    worker = Worker("jobs", slow, vt=2, concurrency=2, poll_max=0.1)  # free to take a redelivery
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.completed == 1))
    assert deliveries == [1]
    assert worker.stats.stale == 0
    assert [r[1] for r in a_rows(conn, "jobs")] == [1]


def test_success_follows_the_queues_ack_mode(broker: Broker, dsn: str, conn: Conn) -> None:
    queue = broker.create_queue("jobs")
    queue.set_policy(ack_mode="delete")
    queue.send_many([1, 2, 3])
    worker = Worker("jobs", lambda message: None, concurrency=3)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.completed == 3))
    assert q_rows(conn, "jobs") == a_rows(conn, "jobs") == []


def test_stop_lets_handlers_in_flight_finish_within_the_grace_period(
    broker: Broker, dsn: str, conn: Conn
) -> None:
    broker.create_queue("jobs").send_many([1, 2])
    started = 0

    async def handle(message: Message) -> None:
        nonlocal started
        started += 1
        await asyncio.sleep(0.5)

    worker = Worker("jobs", handle, concurrency=2, grace_period=10)
    asyncio.run(run_until(dsn, [worker], lambda: started == 2))  # stops as soon as both started
    assert (worker.stats.completed, worker.stats.released) == (2, 0)
    assert q_rows(conn, "jobs") == []


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_stop_gives_back_what_cannot_finish_within_the_grace_period(
    broker: Broker, dsn: str, conn: Conn, kind: str
) -> None:
    queue = broker.create_queue("jobs")
    sent = queue.send("stuck")
    started = threading.Event()
    unblock = threading.Event()

    async def stuck_async(message: Message) -> None:
        started.set()
        await asyncio.sleep(60)

    def stuck_sync(message: Message) -> None:
        started.set()
        unblock.wait(60)

    worker = Worker("jobs", stuck_async if kind == "async" else stuck_sync, vt=300, grace_period=0.3)
    began = time.monotonic()
    asyncio.run(run_until(dsn, [worker], started.is_set))
    unblock.set()
    assert time.monotonic() - began < 10
    assert (worker.stats.completed, worker.stats.released) == (0, 1)
    [(msg_id, read_ct, _, _, _)] = q_rows(conn, "jobs")
    assert (msg_id, read_ct) == (sent, 1)
    assert queue.read() is not None  # visible again at once, not after its 300 s lease


def _ack_across_killed_connections(dsn: str, conn: Conn, pg_admin_dsn: str) -> Worker:
    """A handler runs while every other session of the database is terminated; returns the
    worker once it has acked the message."""
    handling = threading.Event()
    connections_killed = threading.Event()

    def handle(message: Message) -> None:
        handling.set()
        assert connections_killed.wait(10)

    def kill_connections() -> None:
        handling.wait(10)
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(
                # With a timeout it waits until they are gone (PostgreSQL 14+): the sockets then
                # hold the server's goodbye when the handler returns.
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> %s",
                [conn.info.dbname, conn.info.backend_pid],
            )
        connections_killed.set()

    killer = threading.Thread(target=kill_connections)
    killer.start()
    worker = Worker("jobs", handle)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.completed == 1))
    killer.join()
    return worker


def test_acks_are_retried_when_the_connection_is_lost(
    broker: Broker,
    dsn: str,
    conn: Conn,
    pg_admin_dsn: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="pgbroker.worker")
    broker.create_queue("jobs").send("survives")
    # A connection cut without a word (a network partition) looks alive to the check the pool
    # makes (pgbroker._db.liveness): the ack meets it dead.
    monkeypatch.setattr("pgbroker.queues._client_async.server_has_written", lambda conn: False)
    worker = _ack_across_killed_connections(dsn, conn, pg_admin_dsn)
    assert (worker.stats.completed, worker.stats.stale) == (1, 0)
    # The ack met a dead connection, and was tried again.
    assert any(r.getMessage().startswith("worker.retrying") for r in caplog.records)
    with psycopg.connect(dsn) as fresh:
        assert [r[1] for r in a_rows(fresh, "jobs")] == [1]  # acked on its first delivery


def test_acks_pass_over_connections_the_server_closed(
    broker: Broker, dsn: str, conn: Conn, pg_admin_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgbroker.worker")
    broker.create_queue("jobs").send("survives")
    worker = _ack_across_killed_connections(dsn, conn, pg_admin_dsn)
    assert (worker.stats.completed, worker.stats.stale) == (1, 0)
    # The terminated sessions said so before the ack: it took a new connection, no retry needed.
    assert not any(r.getMessage().startswith("worker.retrying") for r in caplog.records)
    with psycopg.connect(dsn) as fresh:
        assert [r[1] for r in a_rows(fresh, "jobs")] == [1]  # acked on its first delivery


def _sleeping_worker_woken_by_a_send(worker_dsn: str, queue: Queue) -> float:
    """Serve a worker of ``queue`` on ``worker_dsn`` (polling every 10 s) until it handles a
    message sent once it sleeps; how long after the send it handled it."""
    handled_at: list[float] = []
    worker = Worker(queue.name, lambda message: handled_at.append(time.monotonic()), poll_min=10, poll_max=10)

    async def scenario() -> float:
        async def send_when_asleep() -> float:
            await asyncio.sleep(1.0)  # the worker read, found nothing, and sleeps for 10 s
            sent_at = time.monotonic()
            await asyncio.to_thread(queue.send, "wake up")
            return sent_at

        sender = asyncio.create_task(send_when_asleep())
        await run_until(worker_dsn, [worker], lambda: bool(handled_at), timeout=8)
        return await sender

    sent_at = asyncio.run(scenario())
    return handled_at[0] - sent_at


def test_a_sleeping_worker_wakes_on_a_send(broker: Broker, dsn: str) -> None:
    queue = broker.create_queue("jobs")
    assert _sleeping_worker_woken_by_a_send(dsn, queue) < 1.0  # a notification, not the 10 s poll


def test_a_consumer_s_worker_on_a_queue_with_notify_on_says_nothing_of_notify_and_wakes_on_a_send(
    broker: Broker, dsn: str, conn: Conn, pg_admin_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker running as a consumer (docs/security.md) asked whether notify was on by reading
    pgmq.notify_insert_throttle, which a consumer may not: it warned worker.notify_unavailable
    ('permission denied for table notify_insert_throttle') on a queue its owner had turned notify
    on for, and a send did wake it."""
    queue = broker.create_queue("jobs")
    queue.enable_notify()
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    with role_logins(dsn, conn, pg_admin_dsn) as logins:
        woken_after = _sleeping_worker_woken_by_a_send(logins["consumer"], queue)
    assert woken_after < 1.0  # a notification, not the 10 s poll
    assert [r.getMessage() for r in caplog.records if "notify_unavailable" in r.getMessage()] == []


def test_a_consumer_s_worker_on_a_queue_without_notify_says_how_it_is_turned_on(
    broker: Broker, dsn: str, conn: Conn, pg_admin_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    broker.create_queue("jobs")
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    worker = Worker("jobs", lambda message: None, poll_min=0.1, poll_max=0.5)

    def warned() -> list[str]:
        return [
            r.getMessage() for r in caplog.records if r.getMessage().startswith("worker.notify_unavailable")
        ]

    with role_logins(dsn, conn, pg_admin_dsn) as logins:
        asyncio.run(run_until(logins["consumer"], [worker], lambda: bool(warned()), timeout=30))
    [warning] = warned()
    assert "SELECT pgmq.enable_notify_insert('jobs', 5)" in warning
    assert "0.5 s at most" in warning


def test_a_sleeping_worker_whose_listen_session_is_terminated_still_wakes_on_a_send(
    broker: Broker, dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """The LISTEN session ends under an idle worker (pg_terminate_backend: a restart, a failover, an
    idle_session_timeout cut it the same way): the listener says so, connects again and LISTENs
    anew, and the next send still wakes the worker at once, not at its next poll (30 s here)."""
    caplog.set_level(logging.WARNING, logger="pgbroker.listen")
    queue = broker.create_queue("jobs")
    handled_at: list[float] = []
    worker = Worker("jobs", lambda message: handled_at.append(time.monotonic()), poll_min=30, poll_max=30)

    async def scenario() -> float:
        async def cut_then_send() -> float:
            first = await asyncio.to_thread(listener_pid, conn)
            await asyncio.sleep(1.0)  # the worker read, found nothing, and sleeps for 30 s
            await asyncio.to_thread(conn.execute, "SELECT pg_terminate_backend(%s)", [first])
            await asyncio.to_thread(listener_pid, conn, first)  # connected and LISTENing again
            await asyncio.sleep(1.0)  # woken by the new LISTEN, the worker read again and sleeps
            sent_at = time.monotonic()
            await asyncio.to_thread(queue.send, "wake up")
            return sent_at

        sender = asyncio.create_task(cut_then_send())
        await run_until(dsn, [worker], lambda: bool(handled_at), timeout=25)
        return await sender

    sent_at = asyncio.run(scenario())
    assert handled_at[0] - sent_at < 1.0  # a notification on the new session, not the 30 s poll
    assert any("listener lost its connection" in r.getMessage() for r in caplog.records)


def test_a_send_soon_after_an_announced_one_wakes_the_worker_too(broker: Broker, dsn: str) -> None:
    """The worker turns notify on with a throttle of milliseconds, not pgmq's 250: a send 100 ms
    after one that woke it is announced as well (it was not, and waited for the 10 s poll)."""
    queue = broker.create_queue("jobs")
    handled_at: list[float] = []
    worker = Worker("jobs", lambda message: handled_at.append(time.monotonic()), poll_min=10, poll_max=10)

    async def scenario() -> list[float]:
        async def send_twice_when_asleep() -> list[float]:
            sent_at = []
            for pause in (1.0, 0.1):  # asleep; then handled the first and asleep again
                await asyncio.sleep(pause)
                sent_at.append(time.monotonic())
                await asyncio.to_thread(queue.send, "wake up")
            return sent_at

        sender = asyncio.create_task(send_twice_when_asleep())
        await run_until(dsn, [worker], lambda: len(handled_at) == 2, timeout=8)
        return await sender

    sent_at = asyncio.run(scenario())
    assert [handled - sent < 1.0 for handled, sent in zip(handled_at, sent_at, strict=True)] == [True, True]


class CountingConnection(psycopg.AsyncConnection[Any]):
    """Counts every statement sent through the pool's connections (the executor's only door)."""

    sent: list[str] = []

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        CountingConnection.sent.append(str(query).split("(")[0])
        return await super().execute(query, params, **kwargs)


READ = "SELECT * FROM pgbroker.read"


def test_an_idle_worker_sends_nothing_but_rare_polls(
    broker: Broker, dsn: str, conn: Conn, pg_admin_dsn: str
) -> None:
    """Counted at the client: every statement through the worker's pool (its LISTEN connection
    only LISTENs). Checked at the server: pg_stat_user_functions counts the calls of
    pgbroker.read in the test's database, which must be exactly the reads the client counted,
    so the client-side count missed nothing. (Transaction counts would include autovacuum's.)
    """
    broker.create_queue("jobs")
    dbname = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} SET track_functions = 'pl'").format(sql.Identifier(dbname)))
    poll_max, window = 1.5, 6.0
    worker = Worker("jobs", lambda message: None, poll_min=0.05, poll_max=poll_max)
    idle: list[str] = []

    async def measure() -> None:
        await asyncio.sleep(3.0)  # started, LISTENing, and down to one poll every poll_max
        start = len(CountingConnection.sent)
        await asyncio.sleep(window)
        idle.extend(CountingConnection.sent[start:])

    async def scenario() -> None:
        pool = AsyncConnectionPool(
            dsn,
            connection_class=CountingConnection,
            kwargs={"autocommit": True, "application_name": "idle-worker"},
            min_size=2,
            open=False,
        )
        await pool.open(wait=True)
        try:
            async with AsyncBroker(pool=pool) as async_broker:
                measurer = asyncio.create_task(measure())
                await run_until(dsn, [worker], measurer.done, broker=async_broker)
                await measurer
        finally:
            await pool.close()

    CountingConnection.sent = []
    asyncio.run(scenario())
    assert set(idle) == {READ}
    assert len(idle) <= window / (0.8 * poll_max) + 1  # jitter shortens a pause by up to a fifth
    # A backend reports its counts when it ends, at the latest.
    deadline = time.monotonic() + 10
    while conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idle-worker'"
    ).fetchone() != (0,):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    row = conn.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
        " WHERE schemaname = 'pgbroker' AND funcname = 'read'"
    ).fetchone()
    assert row == (CountingConnection.sent.count(READ),)
    assert row == (worker.stats.reads,)


def test_a_notify_flood_by_any_login_does_not_make_an_idle_worker_spin(
    broker: Broker, dsn: str, conn: Conn, pg_admin_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL has no privilege on channels: a login with no pgbroker role at all NOTIFYs a
    queue's channel as often as it likes. Every wake-up cost the worker a read: under a flood of
    some thousand NOTIFY a second an idle worker polling every 10 s read back to back, hundreds of
    empty reads a second. Wake-ups by news are budgeted now (pgbroker._db.wakeups.WakeBudget), and
    a real send still reaches the handler during the flood."""
    queue = broker.create_queue("jobs")
    outsider = f"outsider_{uuid.uuid4().hex[:10]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(outsider)))
    handled: list[Any] = []
    worker = Worker("jobs", lambda message: handled.append(message.message), poll_min=10, poll_max=10)
    flooding, stop = threading.Event(), threading.Event()
    window = 3.0

    def flood() -> None:
        with psycopg.connect(make_conninfo(dsn, user=outsider), autocommit=True) as hostile:
            while not stop.is_set():
                hostile.execute(b'NOTIFY "pgmq.q_jobs.INSERT"')
                flooding.set()

    async def scenario() -> int:
        async def measure() -> int:
            await asyncio.to_thread(listener_pid, conn)
            await asyncio.sleep(1.0)  # it read, found nothing, and sleeps for 10 s
            flooder.start()
            await asyncio.to_thread(flooding.wait, 10)
            before = worker.stats.reads
            await asyncio.sleep(window)
            during = worker.stats.reads - before
            # Said once no read has found messages for a while (10 s since it subscribed, here).
            deadline = time.monotonic() + 60
            while not held() and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.to_thread(queue.send, "real")
            return during

        measurer = asyncio.create_task(measure())
        await run_until(dsn, [worker], lambda: bool(handled), timeout=30)
        return await measurer

    def held() -> list[str]:
        return [r.getMessage() for r in caplog.records if "listen.wakeups_held" in r.getMessage()]

    flooder = threading.Thread(target=flood)
    try:
        with caplog.at_level(logging.WARNING, logger="pgbroker.listen"):
            reads = asyncio.run(scenario())
    finally:
        stop.set()
        if flooder.is_alive():
            flooder.join()
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(outsider)))
    assert handled == ["real"]
    assert reads <= WAKE_BURST + window * WAKE_RATE + 1, f"{reads} reads in {window} s of NOTIFY flood"
    # Said, once: the operator learns that someone floods the channel.
    assert len(held()) == 1, held()
    assert 'channel="pgmq.q_jobs.INSERT"' in held()[0]


@pytest.mark.parametrize("workers", [1, 8], ids=["one-worker", "eight-competing"])
def test_sends_at_a_hundred_a_second_wake_idle_workers_without_holding_a_wake_up(
    broker: Broker, dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture, workers: int
) -> None:
    """The wake-up budget that stops a NOTIFY flood counts only wake-ups that bring nothing.
    Workers kept idle between sends arriving 100 a second (each its own wake-up: 1,000 jobs a
    second sent 10 a call) are woken by each at once. One worker: a budget charged for every
    wake-up held them to 20 a second, each send waiting up to 50 ms. Eight (processes, in
    production): each send wakes them all and seven find its message taken; a budget that took
    those empty wake-ups for a flood held them and warned the operator of another login NOTIFYing
    the channel (two worker processes at 1,500 jobs a second did, in the bench). Reads that find
    messages now earn their competitors' wake-ups (wakeups.NEWS_CREDIT), and the warning waits
    for 10 s without any."""
    queue = broker.create_queue("jobs")
    sends = 150
    handled: list[Any] = []
    waiting = [
        Worker("jobs", lambda message: handled.append(message.message), poll_min=10, poll_max=10)
        for _ in range(workers)
    ]

    def produce() -> None:
        for i in range(sends):
            queue.send(i)
            time.sleep(0.01)

    async def scenario() -> None:
        async def paced() -> None:
            await asyncio.to_thread(listener_pid, conn)
            await asyncio.sleep(0.5)  # each read, found nothing, and sleeps until a send
            await asyncio.to_thread(produce)

        producer = asyncio.create_task(paced())
        await run_until(dsn, waiting, lambda: len(handled) == sends, timeout=120)
        await producer

    with caplog.at_level(logging.WARNING, logger="pgbroker.listen"):
        asyncio.run(scenario())
    assert sorted(handled) == list(range(sends))
    reads = sum(worker.stats.reads for worker in waiting)
    # Else the sends came faster than the workers napped, or they did not compete: no test.
    assert reads >= (sends / 2 if workers == 1 else 2 * sends), reads
    held = [r.getMessage() for r in caplog.records if "listen.wakeups_held" in r.getMessage()]
    assert held == []


def test_workers_run_an_apps_handlers_together(broker: Broker, dsn: str) -> None:
    app = App()
    handled: list[str] = []

    @app.handler("orders", concurrency=2)
    def ship(message: Message) -> None:
        handled.append(f"orders:{message.message}")

    @app.handler("emails")
    async def send_email(message: Message) -> None:
        handled.append(f"emails:{message.message}")

    assert app.queues == ["orders", "emails"]
    broker.create_queue("orders").send_many([1, 2])
    broker.create_queue("emails").send(3)
    workers = app.workers(vt=60)
    assert [(w.queue, w.concurrency, w.vt) for w in workers] == [("orders", 2, 60), ("emails", 1, 60)]
    asyncio.run(run_until(dsn, workers, lambda: len(handled) == 3))
    assert sorted(handled) == ["emails:3", "orders:1", "orders:2"]


def test_handler_registration_and_options_are_checked() -> None:
    app = App()
    app.handler("orders")(print)
    with pytest.raises(InvalidArgument, match="already has a handler"):
        app.handler("orders")(print)
    with pytest.raises(InvalidArgument, match="no handler for queue 'emails'") as caught:
        app.workers(["emails"])
    assert caught.value.hint == "Queue handlers: orders."
    # An App of stream handlers alone was told 'Registered: none.', as if it had no handler.
    streams = App()
    streams.stream_handler("clicks", "billing")(print)
    with pytest.raises(InvalidArgument) as caught:
        streams.workers(["clicks"])
    said = "Queue handlers: none; stream handlers, chosen by no queue name: clicks/billing."
    assert caught.value.hint == said
    with pytest.raises(InvalidArgument, match="concurrency"):
        Worker("orders", print, concurrency=0)
    with pytest.raises(InvalidArgument, match="poll_max"):
        Worker("orders", print, poll_max=float("nan"))
    with pytest.raises(InvalidArgument, match="callable"):
        Worker("orders", "print")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="max_deliveries"):
        Worker("orders", print, max_deliveries=0)


def test_serve_on_a_server_that_cannot_be_reached_fails_at_once_with_its_cause() -> None:
    """Not a PoolTimeout after 30 s that hides why (App.run and serve open a pool of their own)."""
    nobody = f"postgresql://postgres@127.0.0.1:{free_port()}/x"  # a port nothing listens on
    with pytest.raises(DatabaseError, match="Connection refused"):
        asyncio.run(serve([Worker("jobs", print)], dsn=nobody, handle_signals=False, connect_timeout=5))
    app = App()
    app.handler("jobs")(print)
    with pytest.raises(InvalidArgument, match="pool_timeout"):
        app.run(nobody, pool_timeout=0)


def test_serve_stops_with_queue_not_found(dsn: str) -> None:
    with pytest.raises(QueueNotFound):
        asyncio.run(serve([Worker("missing", print)], dsn=dsn, handle_signals=False))


def test_a_worker_can_apply_the_archive_retention(broker: Broker, dsn: str, conn: Conn) -> None:
    queue = broker.create_queue("jobs")
    queue.set_policy(archive_max_rows=2)
    queue.send_many(list(range(5)))
    # Slower than the read-ahead's 50 ms: one message at a time, so each ack is a statement of its
    # own (rows archived by one statement tie, and ties with the cutoff are kept).
    worker = Worker("jobs", lambda message: time.sleep(0.06), maintain_every=0.1)
    asyncio.run(
        run_until(dsn, [worker], lambda: len(a_rows(conn, "jobs")) == 2 and worker.stats.completed == 5)
    )


def test_a_worker_whose_listen_set_up_times_out_reads_again(broker: Broker, dsn: str) -> None:
    """A maintenance transaction locks pgmq.meta while a worker on a role with a short
    statement_timeout starts: its LISTEN set-up times out (a transient error), and it must wait
    a while and try again, not stop reading for good."""
    broker.create_queue("jobs").send_many(list(range(200)))
    impatient = make_conninfo(dsn, options="-c statement_timeout=200")
    handled: list[int] = []
    worker = Worker("jobs", lambda message: handled.append(message.message), notify=False)
    locked, release = threading.Event(), threading.Event()

    def maintain() -> None:
        with psycopg.connect(dsn) as maintenance:
            maintenance.execute("LOCK TABLE pgmq.meta IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(3)

    locker = threading.Thread(target=maintain)
    locker.start()
    assert locked.wait(30)

    async def scenario() -> None:
        async with AsyncBroker(impatient, max_connections=4) as abroker:
            await run_until(impatient, [worker], lambda: len(handled) == 200, timeout=60, broker=abroker)

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        locker.join()
    assert sorted(handled) == list(range(200))
    assert worker.stats.connection_errors >= 1  # the lock was met


def test_a_worker_on_a_server_gone_read_only_waits_for_one_that_takes_writes(
    broker: Broker, dsn: str, conn: Conn
) -> None:
    """A switchover leaves the worker's sessions on a server that takes no writes (25006, as a
    standby answers): the worker counts it as a lost connection, not a reason to stop, its pooled
    connections are replaced, and once new sessions take writes it handles every message."""
    broker.create_queue("jobs").send_many(list(range(50)))
    handled: list[int] = []
    worker = Worker("jobs", lambda message: handled.append(message.message), notify=False)
    read_only = sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = {}")
    database = sql.Identifier(conn.info.dbname)
    conn.execute(read_only.format(database, sql.SQL("on")))

    async def scenario() -> None:
        async with AsyncBroker(dsn, max_connections=4) as abroker:

            async def writable_again() -> None:
                await asyncio.sleep(2)
                await asyncio.to_thread(conn.execute, read_only.format(database, sql.SQL("off")))

            writable = asyncio.create_task(writable_again())
            await run_until(dsn, [worker], lambda: len(handled) == 50, timeout=60, broker=abroker)
            await writable

    asyncio.run(scenario())
    assert sorted(handled) == list(range(50))
    assert worker.stats.connection_errors >= 1  # the read-only server was met


def test_a_worker_whose_start_meets_the_database_away_waits_for_it(
    cluster: EmbeddedPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    """The database goes away, for longer than the pool waits for a connection, just as a
    worker starts (after its process connected: a restart, a failover): the worker's first call,
    turning notify on, waits it out as its reads do, then turns notify on and handles the
    queue. It stopped with PoolTimeout (so `pgbroker worker` exited 5, and a StreamWorker whose
    retry queue's worker this is stopped too); a shorter outage left it without notify."""
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    dsn = cluster.dsn()
    with Broker(dsn) as broker:
        broker.create_queue("jobs").send_many(list(range(10)))
    handled: list[int] = []
    worker = Worker("jobs", lambda message: handled.append(message.message), poll_max=0.5)

    def waited_out() -> bool:
        return any(r.getMessage().startswith("worker.database_unavailable") for r in caplog.records)

    async def scenario() -> None:
        async with AsyncBroker(dsn, max_connections=4, pool_timeout=1) as abroker:
            await asyncio.to_thread(cluster.stop)
            task = asyncio.create_task(serve([worker], broker=abroker, handle_signals=False, schedules=False))
            deadline = time.monotonic() + 60
            while not (waited_out() or task.done()):  # a PoolTimeout met
                assert time.monotonic() < deadline, "no call failed in 60 s"
                await asyncio.sleep(0.05)
            await asyncio.to_thread(cluster.start)
            try:
                await while_serving(task, lambda: len(handled) == 10, "not every message handled")
            finally:
                worker.stop()
                await asyncio.wait_for(task, 60)

    asyncio.run(scenario())
    assert sorted(handled) == list(range(10))
    with psycopg.connect(dsn) as conn:
        notifying = conn.execute("SELECT queue_name FROM pgmq.list_notify_insert_throttles()").fetchall()
    assert notifying == [("jobs",)]


def test_a_worker_whose_calls_keep_failing_says_so_again_while_it_lasts(
    broker: Broker, dsn: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read fails for as long as a maintenance transaction holds the queue's table (a role
    with a short lock_timeout: 55P03; a statement_timeout every read exceeds fails the same way,
    for good). The worker warns again every so often while that lasts, so that a worker that never
    gets through does not look idle; it warned once, then retried at DEBUG for ever."""
    monkeypatch.setattr(_worker, "_UNAVAILABLE_REMINDER", 0.5)
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    broker.create_queue("jobs").send_many(list(range(10)))
    handled: list[int] = []
    worker = Worker("jobs", lambda message: handled.append(message.message), notify=False)

    def warnings() -> int:
        return sum(r.getMessage().startswith("worker.database_unavailable") for r in caplog.records)

    async def scenario() -> None:
        with table_locked(dsn, "pgmq.q_jobs"):
            task = asyncio.create_task(serve([worker], dsn=impatient(dsn), handle_signals=False))
            await while_serving(task, lambda: warnings() >= 3, "fewer than 3 warnings")
        try:
            await while_serving(task, lambda: len(handled) == 10, "not every message handled")
        finally:
            worker.stop()
            await asyncio.wait_for(task, 60)

    asyncio.run(scenario())
    assert sorted(handled) == list(range(10))
    assert any(r.getMessage().startswith("worker.database_available") for r in caplog.records)


# The messages of the hang tests below: the first, handled before the hang, and ten sent during it.
ALL = {-1, *range(10)}


def first_acked(worker: Worker) -> Callable[[], bool]:
    """Whether the worker has recorded its first outcome. A test that freezes the worker's sessions
    waits for it, not for the handler alone: the ack goes out up to 50 ms after the handler returns,
    and an ack met by a frozen session is given up only after the lease, too late for a retry, so
    that message came again (at-least-once) and was handled twice (-1 twice in a run under load)."""
    return lambda: worker.stats.completed >= 1


def test_a_worker_whose_start_meets_a_lock_timeout_turns_notify_on_once_it_passes(
    broker: Broker, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A maintenance transaction holds the queue's table as the worker starts (its role's
    lock_timeout: 55P03): turning notify on fails, the worker reads meanwhile (by polls) and
    turns notify on once the lock is gone. It went without notify for good: every send waited
    for a poll, up to poll_max, until a restart."""
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    broker.create_queue("jobs")
    worker = Worker("jobs", print, poll_max=1.0)

    def notifying() -> bool:
        with psycopg.connect(dsn) as conn:
            return bool(conn.execute("SELECT queue_name FROM pgmq.list_notify_insert_throttles()").fetchall())

    async def scenario() -> None:
        with table_locked(dsn, "pgmq.q_jobs"):
            task = asyncio.create_task(serve([worker], dsn=impatient(dsn), handle_signals=False))
            refused = "worker.notify_unavailable"
            await while_serving(task, lambda: any(refused in r.getMessage() for r in caplog.records), refused)
        try:
            await while_serving(task, notifying, "notify never turned on", seconds=30)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 60)

    asyncio.run(scenario())


def test_a_worker_whose_connections_hang_gives_up_on_them_and_goes_on(
    broker: Broker, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every session the worker holds stops answering (its backends frozen with SIGSTOP, as a hung
    server, a stuck pooler or a network that drops packets without a word would leave them). A
    call unanswered within the lease is of no use: the worker gives up on it as on a lost
    connection (warned), and goes on with new sessions. It waited for the answers for as long as
    the hang lasted (for good behind a stuck pooler), saying nothing."""
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    queue = broker.create_queue("jobs")
    handled: list[int] = []
    worker = Worker("jobs", lambda message: handled.append(message.message), vt=2, notify=False, poll_max=0.2)

    async def scenario() -> None:
        task = asyncio.create_task(serve([worker], dsn=freezable(dsn), handle_signals=False, schedules=False))
        try:
            await asyncio.to_thread(queue.send, -1)
            await while_serving(task, first_acked(worker), "the first message not acked")
            with sessions_frozen(dsn) as frozen:
                assert frozen
                await asyncio.to_thread(queue.send_many, list(range(10)))
                await while_serving(task, lambda: set(handled) >= ALL, "not every message handled")
        finally:
            worker.stop()
            await asyncio.wait_for(task, 60)

    asyncio.run(scenario())
    assert sorted(handled) == sorted(ALL)
    assert any(r.getMessage().startswith("worker.database_unavailable") for r in caplog.records)


@pytest.mark.parametrize("notify", [True, False], ids=["notify", "no-notify"])
def test_a_worker_that_starts_on_sessions_that_hang_gives_them_up_and_starts(
    broker: Broker, dsn: str, caplog: pytest.LogCaptureFixture, notify: bool
) -> None:
    """Every session of the worker's pool stops answering before it starts (frozen with SIGSTOP):
    its first call, turning notify on, is given up within the lease (warned) and made again on a
    new session, and the worker handles the queue while the old sessions still hang. The call
    waited for as long as the hang lasted (for good behind a stuck pooler): the worker never
    started, saying nothing. Without notify, the first call is the LISTEN's set-up, which asks the
    server for the queue's channel. That question was not bounded: on a frozen session the worker
    waited for good, never read, and no stop could end it (the bridges' reads and the stream worker
    ask it too). It is given up within the lease, as every other call."""
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    queue = broker.create_queue("jobs")
    queue.send(1)
    handled: list[int] = []
    worker = Worker(
        "jobs", lambda message: handled.append(message.message), vt=2, poll_max=0.2, notify=notify
    )

    async def scenario() -> None:
        # Every connection the pool will hand out is open before the hang, so the first call meets it.
        async with AsyncBroker(freezable(dsn), min_connections=2, max_connections=2) as frozen_pool:
            await asyncio.gather(*(frozen_pool.metrics("jobs") for _ in range(4)))
            with sessions_frozen(dsn) as frozen:
                assert len(frozen) >= 2
                task = asyncio.create_task(
                    serve([worker], broker=frozen_pool, handle_signals=False, schedules=False)
                )
                try:
                    await while_serving(task, lambda: handled == [1], "not handled while the sessions hang")
                finally:
                    worker.stop()
                    await asyncio.wait_for(task, 60)  # the stop too, while they hang

    asyncio.run(scenario())
    if notify:
        assert any(r.getMessage().startswith("worker.database_unavailable") for r in caplog.records)


def test_a_worker_whose_maintenance_hangs_gives_the_round_up_and_maintains_again(
    broker: Broker, dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """Every session of the worker's pool stops answering (frozen with SIGSTOP) while it applies
    the archive retention every half second: the round on a frozen session is given up within its
    bound (the lease here), warned, and a later round, on a new session, trims the archive while
    the old sessions still hang; the messages sent meanwhile are handled. The round waited for its
    answer for as long as the hang lasted (for good behind a stuck pooler), saying nothing, and no
    round came after it."""
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    queue = broker.create_queue("jobs")
    old = [queue.send(n) for n in range(5)]
    for msg_id in old:  # archived one statement at a time: no ties at the retention's cutoff
        queue.archive(msg_id)
    handled: list[int] = []
    worker = Worker(
        "jobs",
        lambda message: handled.append(message.message),
        vt=2,
        notify=False,
        poll_max=0.2,
        maintain_every=0.5,
    )

    def trimmed() -> bool:
        return not {row[0] for row in a_rows(conn, "jobs")} & set(old)

    async def scenario() -> None:
        # Every connection the pool will hand out is open before the hang, so the next round meets it.
        async with AsyncBroker(freezable(dsn), min_connections=5, max_connections=5) as frozen_pool:
            task = asyncio.create_task(
                serve([worker], broker=frozen_pool, handle_signals=False, schedules=False)
            )
            try:
                await asyncio.to_thread(queue.send, -1)
                await while_serving(task, first_acked(worker), "the first message not acked")
                with sessions_frozen(dsn) as frozen:
                    assert len(frozen) >= 5
                    await asyncio.to_thread(queue.set_policy, archive_max_rows=2)
                    await asyncio.to_thread(queue.send_many, list(range(10)))
                    await while_serving(task, trimmed, "the archive not trimmed while the sessions hang", 120)
                    await while_serving(task, lambda: set(handled) >= ALL, "not every message handled")
            finally:
                worker.stop()
                await asyncio.wait_for(task, 60)

    asyncio.run(scenario())
    assert sorted(handled) == sorted(ALL)
    assert any(r.getMessage().startswith("worker.maintenance_failed") for r in caplog.records)


@pytest.mark.parametrize("handler_done", [True, False], ids=["handler-done", "handler-running"])
def test_a_worker_stopped_while_its_connections_hang_stops(
    broker: Broker, dsn: str, caplog: pytest.LogCaptureFixture, handler_done: bool
) -> None:
    """Every session the worker holds stops answering (frozen with SIGSTOP) while a handler runs,
    and the worker is stopped (SIGTERM), the handler done by then or not: it gives up the calls of
    its shutdown (the outcome, or giving back the message it holds; deleting its registration
    row) as unanswered, warned, and returns; what it held comes back when its lease runs out. It
    waited for their answers for as long as the hang lasted, so the process did not exit (for
    good behind a stuck pooler): the release and the registration's delete each hung."""
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    queue = broker.create_queue("jobs")
    started, release = threading.Event(), threading.Event()

    def handler(message: Message) -> None:
        started.set()
        release.wait(60)

    worker = Worker("jobs", handler, vt=2, notify=False, poll_max=0.2, grace_period=0.5)

    async def scenario() -> None:
        task = asyncio.create_task(serve([worker], dsn=freezable(dsn), handle_signals=False, schedules=False))
        try:
            await asyncio.to_thread(queue.send, 1)
            await while_serving(task, started.is_set, "the message not handed to the handler")
            with sessions_frozen(dsn) as frozen:
                assert frozen
                worker.stop()
                if handler_done:
                    release.set()
                await asyncio.wait_for(asyncio.shield(task), 60)
        finally:
            worker.stop()
            release.set()
            await asyncio.wait_for(task, 60)

    asyncio.run(scenario())
    assert any(r.getMessage().startswith("worker.registration_failed") for r in caplog.records)


def test_a_worker_s_helper_that_dies_of_a_bug_says_so_at_once(
    broker: Broker, dsn: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat (like the other helpers: the ack sender, the registration, maintenance)
    catches what it meets; anything else is a bug, which ended it without a word while the worker
    ran on, its slow handlers' leases left to run out."""
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    broker.create_queue("jobs").send("slow")

    async def broken(*args: object) -> None:
        raise RuntimeError("a bug in the heartbeat")

    monkeypatch.setattr(_worker, "extend_leases", broken)

    async def slow(message: Message) -> None:
        await asyncio.sleep(2)

    def said() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("worker.bug")]

    worker = Worker("jobs", slow, vt=3)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.completed == 1 and bool(said())))
    [bug] = said()
    assert bug.levelno == logging.ERROR
    assert "task=pgbroker-beat-jobs" in bug.getMessage()
    assert bug.exc_info is not None
    assert bug.exc_info[0] is RuntimeError


def test_a_scheduler_that_dies_of_a_bug_beside_workers_says_so_at_once(
    broker: Broker, dsn: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve()'s scheduler catches what it meets; anything else ended it without a word (its
    error swallowed at the stop) while the workers ran on and no schedule was sent."""
    caplog.set_level(logging.WARNING)
    broker.create_queue("jobs")

    async def broken(*args: object) -> None:
        raise RuntimeError("a bug in the scheduler")

    monkeypatch.setattr(Scheduler, "_send_due", broken)

    def said() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("scheduler.failed")]

    worker = Worker("jobs", lambda message: None)
    asyncio.run(run_until(dsn, [worker], lambda: bool(said())))
    [failed] = said()
    assert failed.levelno == logging.ERROR
    assert failed.exc_info is not None
    assert failed.exc_info[0] is RuntimeError
