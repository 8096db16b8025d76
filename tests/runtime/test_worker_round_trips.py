"""The worker's few round trips: outcomes that ride with the next read in one pipelined
transaction, failures inside such a batch, the read-ahead of fast handlers given back at stop,
and one heartbeat call for every lease that is due."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgbroker import Broker, Message, Worker
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.runtime._worker import _MOST_AHEAD
from tests.support.tables import Conn, a_rows, q_rows
from tests.support.worker import run_until


class StatementLog(psycopg.AsyncConnection[Any]):
    """Every statement the worker's pool sends (the pgbroker functions each calls), and its pipelines."""

    sent: list[set[str]] = []
    pipelines = 0

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        StatementLog.sent.append(set(re.findall(r"pgbroker\.(\w+)\(", str(query))))
        return await super().execute(query, params, **kwargs)

    @staticmethod
    def calling(*functions: str) -> int:
        """Statements that call all of ``functions``."""
        return sum(1 for called in StatementLog.sent if called.issuperset(functions))

    def pipeline(self) -> Any:
        StatementLog.pipelines += 1
        return super().pipeline()


async def _run_logged(dsn: str, worker: Worker, done: Any, timeout: float = 30) -> None:
    StatementLog.sent, StatementLog.pipelines = [], 0
    pool = AsyncConnectionPool(
        dsn, connection_class=StatementLog, kwargs={"autocommit": True}, min_size=2, open=False
    )
    await pool.open(wait=True)
    try:
        async with AsyncBroker(pool=pool) as broker:
            await run_until(dsn, [worker], done, broker=broker, timeout=timeout)
    finally:
        await pool.close()


def test_a_failure_inside_a_batch_is_retried_and_the_others_acked_once(
    broker: Broker, dsn: str, conn: Conn
) -> None:
    queue = broker.create_queue("jobs")
    queue.set_policy(max_deliveries=3, backoff="fixed", backoff_base_seconds=0)
    sent = queue.send_many([{"n": n} for n in range(60)])
    failing = sent[17]
    deliveries: dict[int, list[int]] = {}

    async def handle(message: Message) -> None:
        deliveries.setdefault(message.msg_id, []).append(message.read_ct)
        if message.msg_id == failing and message.read_ct == 1:
            raise RuntimeError("the first try fails")

    worker = Worker("jobs", handle, concurrency=20)
    asyncio.run(_run_logged(dsn, worker, lambda: worker.stats.completed == 60))

    assert (worker.stats.completed, worker.stats.retried, worker.stats.stale) == (60, 1, 0)
    assert deliveries[failing] == [1, 2]
    assert all(reads == [1] for msg_id, reads in deliveries.items() if msg_id != failing)
    assert q_rows(conn, "jobs") == []
    archived = {msg_id: read_ct for msg_id, read_ct, _, _ in a_rows(conn, "jobs")}
    assert archived == {msg_id: 2 if msg_id == failing else 1 for msg_id in sent}
    # The failure was recorded with the successes of its batch, in one transaction with a read.
    assert StatementLog.calling("fail") == 1
    assert StatementLog.pipelines >= 1


def test_acks_ride_with_the_reads_no_round_trip_per_message(broker: Broker, dsn: str) -> None:
    broker.create_queue("jobs").send_many(list(range(500)))

    async def handle(message: Message) -> None:
        pass

    worker = Worker("jobs", handle)  # the defaults: one slot, and the read-ahead of a fast handler
    asyncio.run(_run_logged(dsn, worker, lambda: worker.stats.completed == 500))

    reads = StatementLog.calling("read")
    completes = StatementLog.calling("complete")
    assert worker.stats.completed == 500
    # One slot, yet reads and acks are shared by many messages: the read-ahead.
    assert reads <= 500 / 10
    # Acks go in the statement of a read, or on their own when no read comes for them soon
    # (the last ones).
    assert StatementLog.calling("complete", "read") >= completes - 2


def test_what_was_read_ahead_is_given_back_at_stop(broker: Broker, dsn: str, conn: Conn) -> None:
    queue = broker.create_queue("jobs")
    queue.send_many([{"n": n} for n in range(400)])
    stuck = threading.Event()

    async def handle(message: Message) -> None:
        if message.message["n"] == 150:
            stuck.set()
            await asyncio.sleep(60)

    worker = Worker("jobs", handle, vt=300, grace_period=0.2)
    asyncio.run(run_until(dsn, [worker], stuck.is_set))

    left = 400 - worker.stats.completed
    assert worker.stats.released >= 1  # the stuck one, and what was read ahead of it
    assert len(q_rows(conn, "jobs")) == left
    # Nothing is still leased by the stopped worker: all that is left can be read at once.
    assert len(queue.read_many(400)) == left


def test_one_heartbeat_call_extends_every_lease_that_is_due(broker: Broker, dsn: str, conn: Conn) -> None:
    broker.create_queue("jobs").send_many([1, 2, 3])

    async def slow(message: Message) -> None:
        await asyncio.sleep(3)

    worker = Worker("jobs", slow, vt=2, concurrency=3)
    asyncio.run(_run_logged(dsn, worker, lambda: worker.stats.completed == 3))

    assert (worker.stats.completed, worker.stats.stale) == (3, 0)
    assert [read_ct for _, read_ct, _, _ in a_rows(conn, "jobs")] == [1, 1, 1]
    # Three leases extended about every 2/3 s for 3 s: separate calls would be 9 to 15.
    assert 1 <= StatementLog.calling("extend") <= 6


def test_a_graceful_stop_handles_what_was_read_ahead(broker: Broker, dsn: str, conn: Conn) -> None:
    """A stop spends no delivery (read_ct) on a message it read ahead and could handle: with
    max_deliveries=1 a message given back unhandled would be dead-lettered at its next read."""
    queue = broker.create_queue("jobs")
    queue.set_policy(max_deliveries=1)
    total = 2 * (1 + _MOST_AHEAD)  # more than it may hold
    queue.send_many([{"n": n} for n in range(total)])

    async def handle(message: Message) -> None:
        pass

    worker = Worker("jobs", handle)
    asyncio.run(run_until(dsn, [worker], lambda: worker.stats.completed >= 150))

    left = q_rows(conn, "jobs")
    assert (worker.stats.released, worker.stats.stale) == (0, 0)
    assert worker.stats.completed + len(left) == total
    assert worker.stats.completed == worker.stats.received > 150  # it had read ahead, and handled it
    assert all(read_ct == 0 for _, read_ct, _, _, _ in left)  # the rest was never read


def test_a_worker_on_one_shared_connection_records_failures_without_a_pipeline(
    broker: Broker, dsn: str, conn: Conn
) -> None:
    """On a broker made from one connection every call of the worker shares it: the statements
    of an exchange run one by one, so that none of another task's slips into its transaction."""
    queue = broker.create_queue("jobs")
    queue.set_policy(backoff="fixed", backoff_base_seconds=0)
    sent = queue.send_many(list(range(30)))

    async def handle(message: Message) -> None:
        if message.msg_id == sent[5] and message.read_ct == 1:
            raise ValueError("once")

    worker = Worker("jobs", handle, concurrency=10)

    async def scenario() -> None:
        shared = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with shared, AsyncBroker(connection=shared) as one:
            assert one.single_connection
            await run_until(dsn, [worker], lambda: worker.stats.completed == 30, broker=one)

    asyncio.run(scenario())
    assert (worker.stats.completed, worker.stats.retried, worker.stats.stale) == (30, 1, 0)
    assert len(a_rows(conn, "jobs")) == 30


def test_one_slot_going_through_its_read_ahead_applies_each_message_s_own_outcome(
    broker: Broker, dsn: str, conn: Conn
) -> None:
    """One slot handles the read-ahead messages one after the other: each outcome, a failure among
    successes included, goes with that message's own lease."""
    queue = broker.create_queue("jobs")
    queue.set_policy(max_deliveries=3, backoff="fixed", backoff_base_seconds=0)
    sent = queue.send_many([{"n": n} for n in range(90)])
    failing = set(sent[5::3])
    deliveries: dict[int, list[int]] = {}

    async def handle(message: Message) -> None:
        deliveries.setdefault(message.msg_id, []).append(message.read_ct)
        if message.msg_id in failing and message.read_ct == 1:
            raise RuntimeError("the first try fails")

    worker = Worker("jobs", handle)
    asyncio.run(_run_logged(dsn, worker, lambda: worker.stats.completed == 90))

    assert (worker.stats.completed, worker.stats.retried, worker.stats.stale) == (90, len(failing), 0)
    assert deliveries == {msg_id: [1, 2] if msg_id in failing else [1] for msg_id in sent}
    assert q_rows(conn, "jobs") == []
    archived = {msg_id: read_ct for msg_id, read_ct, _, _ in a_rows(conn, "jobs")}
    assert archived == {msg_id: 2 if msg_id in failing else 1 for msg_id in sent}


def test_a_read_ahead_message_whose_lease_ran_out_is_not_acked(broker: Broker, dsn: str, conn: Conn) -> None:
    """A slot stuck on a slow message while the leases of what it read ahead run out (no heartbeat):
    another consumer takes some of those over, and the worker neither acks them nor handles them:
    they are left to come back through a read. (More messages than a worker may hold, its slot and
    the most it reads ahead: it cannot read those leases back itself meanwhile.) Handling the
    expired ones first, a worker on a loaded machine kept every message read after them waiting
    past its own lease in turn, and made no progress at all."""
    queue = broker.create_queue("jobs")
    total = 2 * (1 + _MOST_AHEAD)
    sent = queue.send_many([{"n": n} for n in range(total)])
    slow_started, taken_over = threading.Event(), threading.Event()
    handled_late: list[int] = []

    async def handle(message: Message) -> None:
        assert message.receipt is not None
        if time.time() > message.receipt.lease / 1e6 + 0.05:
            handled_late.append(message.msg_id)
        if message.message["n"] == 5:
            slow_started.set()
            while not taken_over.is_set():
                await asyncio.sleep(0.01)

    def take_over() -> set[int]:
        slow_started.wait(60)
        time.sleep(1.5)  # the 1 s leases of the read-ahead have run out
        taken = {m.msg_id for m in queue.read_many(50, vt=300)}  # the oldest: read ahead
        taken_over.set()
        return taken

    worker = Worker("jobs", handle, vt=1, heartbeat=False)
    with ThreadPoolExecutor(1) as pool:
        taker = pool.submit(take_over)

        def done() -> bool:
            return taker.done() and len(a_rows(conn, "jobs")) == total - len(taker.result())

        asyncio.run(run_until(dsn, [worker], done))
        taken = taker.result()

    assert taken, "nothing read ahead behind the slow message was left to take over"
    assert worker.stats.stale >= len(taken)
    assert not handled_late, f"{len(handled_late)} messages handled after their lease ran out"
    # The messages taken over are the other consumer's: still in the queue, never acked by the worker.
    assert {msg_id for msg_id, *_ in q_rows(conn, "jobs")} == taken
    assert {msg_id for msg_id, *_ in a_rows(conn, "jobs")} == set(sent) - taken
