"""The stream worker runtime (pgbroker.runtime._stream_worker, App.stream_handler): a handler on a stream
and group, per-message outcomes inside the batch ack, failures retried through the group's retry
queue with the same handler, order per key, a graceful stop that acks what it handled."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from pgbroker import App, Broker
from pgbroker.errors import DatabaseError, QueueNotFound
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.runtime._app import serve
from pgbroker.runtime._stream_worker import StreamWorker
from pgbroker.runtime._worker import Worker
from pgbroker.streams._client import Stream
from pgbroker.streams._client_async import AsyncStreamConsumer
from pgbroker.streams._records import StreamBatch, StreamMessage
from tests.support.faults import freezable, impatient, sessions_frozen, table_locked, terminate_sessions
from tests.support.worker import run_until as serve_until
from tests.support.worker import while_serving


def run_until(
    dsn: str, workers: Sequence[Worker | StreamWorker], done: threading.Event | None, timeout: float
) -> None:
    async def main() -> None:
        task = asyncio.create_task(serve(workers, dsn=dsn, handle_signals=False))
        end = time.monotonic() + timeout
        while not (done is not None and done.is_set()) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        for worker in workers:
            worker.stop()
        await asyncio.wait_for(task, 30)

    asyncio.run(main())


def numbers_until(count: int) -> tuple[set[int], threading.Event, Callable[[StreamMessage], None]]:
    """A handler noting each message's "n", the numbers noted, and an event set once ``count``
    distinct numbers are."""
    handled: set[int] = set()
    done = threading.Event()

    def handle(message: StreamMessage) -> None:
        handled.add(message.message["n"])
        if len(handled) == count:
            done.set()

    return handled, done, handle


# 300: full batches only; 320: a full batch, read ahead of, then a short one (whose read carries no
# ack of its own: the full batch's ack, failures and all, must still go with the next read).
@pytest.mark.parametrize("count", [300, 320])
def test_failures_are_retried_with_the_same_handler_and_the_rest_acked(
    dsn: str, broker: Broker, count: int
) -> None:
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=3)
    retry_queue = clicks.create_group("g", start="start")
    broker.queue(retry_queue).set_policy(backoff="fixed", backoff_base_seconds=0, backoff_jitter=False)
    keys = [f"user-{i % 5}" for i in range(count)]
    ids = clicks.send_many([{"n": i} for i in range(count)], keys=keys)
    attempts: Counter[int] = Counter()
    succeeded: list[int] = []
    first_seen: dict[str, list[int]] = defaultdict(list)
    lock = threading.Lock()
    done = threading.Event()

    app = App()

    @app.stream_handler("clicks", "g", batch_size=50, concurrency=3, lease=10)
    def handle(message: StreamMessage) -> None:
        with lock:
            attempts[message.id] += 1
            if attempts[message.id] == 1:
                assert message.key is not None
                first_seen[message.key].append(message.id)
            if message.id % 7 == 0 and attempts[message.id] == 1:
                raise RuntimeError(f"transient trouble with {message.id}")
            succeeded.append(message.id)
            if len(succeeded) == len(ids):
                done.set()

    workers = app.stream_workers()
    assert len(workers) == 1
    run_until(dsn, workers, done, 60)
    assert sorted(succeeded) == ids
    assert {i for i, n in attempts.items() if n == 2} == {i for i in ids if i % 7 == 0}
    for key, seen in first_seen.items():
        assert seen == sorted(seen), key
    (group,) = clicks.groups()
    assert group.lag == 0
    assert broker.queue(retry_queue).metrics().queue_length == 0
    stats = workers[0].stats
    assert stats.retried == len([i for i in ids if i % 7 == 0])


def test_a_stream_handler_s_failure_is_logged_at_warning_with_its_traceback(
    dsn: str, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    # It was logged at INFO without its traceback: a handler's bug showed only with -v.
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    [sent] = clicks.send_many([{"n": 1}])
    done = threading.Event()

    def handle(message: StreamMessage) -> None:
        done.set()
        raise ValueError("no stock")

    run_until(dsn, [StreamWorker("clicks", "g", handle, lease=10)], done, 60)
    [failed] = [r for r in caplog.records if r.getMessage().startswith("stream_worker.handler_failed")]
    assert failed.levelno == logging.WARNING
    assert f"stream=clicks group=g id={sent} " in failed.getMessage()
    assert 'error="ValueError: no stock"' in failed.getMessage()
    assert failed.exc_info is not None


def test_an_async_stream_handler_behind_a_sync_wrapper_runs(dsn: str, broker: Broker) -> None:
    # Its coroutine was dropped, on the stream as on its retry queue: the batch was acked as
    # handled, and the handler never ran.
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    ids = clicks.send_many([{"n": n} for n in range(3)])
    ran: list[int] = []
    done = threading.Event()

    async def handle(message: StreamMessage) -> None:
        await asyncio.sleep(0)
        ran.append(message.id)
        if len(ran) == len(ids):
            done.set()

    @functools.wraps(handle)
    def wrapper(message: StreamMessage) -> Any:  # a decorator written for functions
        return handle(message)

    worker = StreamWorker("clicks", "g", wrapper, lease=10)
    run_until(dsn, [worker], done, 60)
    assert sorted(ran) == ids
    assert worker.stats.completed == len(ids)


def test_a_handler_that_raises_cancelled_error_fails_its_message_and_the_worker_goes_on(
    dsn: str, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """An async handler awaiting something cancelled elsewhere raises CancelledError though the
    worker cancelled nothing: the message fails (to the retry queue, handled again there) and the
    worker goes on. It used to end the handler's slot without a word, leaving its batch never done:
    the worker read and acked no more, and its heartbeat kept the partitions from the others."""
    caplog.set_level(logging.INFO, logger="pgbroker.worker")
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    retry_queue = clicks.create_group("g", start="start")
    broker.queue(retry_queue).set_policy(backoff="fixed", backoff_base_seconds=0, backoff_jitter=False)
    clicks.send_many([{"n": n} for n in range(10)])
    attempts: Counter[int] = Counter()
    done = threading.Event()

    async def handle(message: StreamMessage) -> None:
        n = message.message["n"]
        attempts[n] += 1
        if n == 3 and attempts[n] == 1:
            gone = asyncio.get_running_loop().create_future()
            gone.cancel()
            await gone
        if len(attempts) == 10 and attempts[3] == 2:
            done.set()

    worker = StreamWorker("clicks", "g", handle, batch_size=5, poll_max=0.5)
    run_until(dsn, [worker], done, 60)
    assert done.is_set(), f"handled {dict(attempts)}; {worker.stats}"
    assert attempts == {n: 2 if n == 3 else 1 for n in range(10)}
    assert worker.stats.retried == 1
    [failed] = [r for r in caplog.records if r.getMessage().startswith("stream_worker.handler_failed")]
    assert "CancelledError" in failed.getMessage()


def test_async_handler_and_graceful_stop_acks_the_batch_in_hand(dsn: str, broker: Broker) -> None:
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=2)
    clicks.create_group("g", start="start")
    ids = clicks.send_many([{"n": i} for i in range(120)])
    handled: list[int] = []

    async def handle(message: StreamMessage) -> None:
        handled.append(message.id)

    worker = StreamWorker("clicks", "g", handle, batch_size=40)
    run_until(dsn, [worker], None, 2.0)
    assert sorted(handled) == ids
    (group,) = clicks.groups()
    assert (group.lag, group.consumers) == (0, 0)  # acked and released on stop


def test_a_stop_waits_for_the_batch_in_hand_no_longer_than_the_grace_period(dsn: str, broker: Broker) -> None:
    # What is not handled in time is left unacked and delivered again. Before, a stop waited for
    # the batch in hand however long its handlers took.
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    ids = clicks.send_many([{"n": i} for i in range(5)], keys=["k"] * 5)
    started = threading.Event()

    async def stuck(message: StreamMessage) -> None:
        started.set()
        await asyncio.sleep(120)

    worker = StreamWorker("clicks", "g", stuck, grace_period=0.5, retries=False)

    async def main() -> float:
        task = asyncio.create_task(serve([worker], dsn=dsn, handle_signals=False))
        assert await asyncio.to_thread(started.wait, 30)
        begun = time.monotonic()
        worker.stop()
        await asyncio.wait_for(task, 60)
        return time.monotonic() - begun

    assert asyncio.run(main()) < 10
    (group,) = clicks.groups()
    assert (group.lag, group.consumers) == (5, 0)  # nothing acked; the partition released
    handled: list[int] = []
    done = threading.Event()

    async def handle(message: StreamMessage) -> None:
        handled.append(message.id)
        if len(handled) == len(ids):
            done.set()

    run_until(dsn, [StreamWorker("clicks", "g", handle)], done, 60)
    assert handled == ids


def test_the_worker_applies_retention(dsn: str, broker: Broker) -> None:
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1, segment_rows=100, segments=3)
    clicks.create_group("g", start="start")
    clicks.send_many([{"n": i} for i in range(1000)])
    handled: list[int] = []

    async def handle(message: StreamMessage) -> None:
        handled.append(message.id)

    worker = StreamWorker("clicks", "g", handle, maintain_every=0.2)
    run_until(dsn, [worker], None, 2.0)
    assert len(handled) == 1000
    with broker.connection() as conn:
        tables = conn.execute("SELECT DISTINCT tableoid::regclass::text FROM pgbroker.s_clicks").fetchall()
    # Every child table but the one the current segment (ids 1000..1099) is written to was emptied:
    # all sent at once, that one also holds the older laps mapped to it (ids 100-199, 400-499, ...).
    assert tables == [("pgbroker.s_clicks_1",)]


def test_the_keys_of_one_partition_are_handled_side_by_side(dsn: str, broker: Broker) -> None:
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    ids = clicks.send_many([{"n": i} for i in range(40)], keys=[f"user-{i % 4}" for i in range(40)])
    running, most = 0, 0
    seen: dict[str, list[int]] = defaultdict(list)
    done = threading.Event()

    async def handle(message: StreamMessage) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        assert message.key is not None
        seen[message.key].append(message.id)
        if sum(map(len, seen.values())) == len(ids):
            done.set()

    run_until(dsn, [StreamWorker("clicks", "g", handle, concurrency=4)], done, 60)
    assert sorted(i for key in seen.values() for i in key) == ids
    assert all(key == sorted(key) for key in seen.values())
    assert most == 4  # one partition, four keys: four handlers at once


def test_each_keys_messages_are_handled_once_in_order_under_concurrency(dsn: str, broker: Broker) -> None:
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=3)
    clicks.create_group("g", start="start")
    sent: dict[str | None, list[int]] = defaultdict(list)
    lock = threading.Lock()

    def produce(producer: int) -> None:
        rng = random.Random(producer)
        for _ in range(20):
            keys = [rng.choice([None, *(f"user-{k}" for k in range(30))]) for _ in range(10)]
            ids = clicks.send_many([{"p": producer} for _ in keys], keys=keys)
            with lock:
                for key, msg_id in zip(keys, ids, strict=True):
                    sent[key].append(msg_id)

    producers = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for p in producers:
        p.start()
    handled: dict[str | None, list[int]] = defaultdict(list)
    done = threading.Event()
    total = 4 * 20 * 10

    def handle(message: StreamMessage) -> None:
        time.sleep(random.uniform(0, 0.003))
        with lock:
            handled[message.key].append(message.id)
            if sum(map(len, handled.values())) == total:
                done.set()

    worker = StreamWorker("clicks", "g", handle, batch_size=50, concurrency=8)
    run_until(dsn, [worker], done, 120)
    for p in producers:
        p.join()
    assert {k: sorted(v) for k, v in handled.items()} == {k: sorted(v) for k, v in sent.items()}
    for key, ids in handled.items():
        if key is not None:
            # A key's messages in the log's order: send order for one producer (concurrent
            # producers' sends are ordered by their ids).
            assert ids == sorted(sent[key]), key


def test_the_next_batch_is_read_while_the_handlers_go_through_one(dsn: str, broker: Broker) -> None:
    # The handlers never wait for a round trip: the call that reads the next batch is in flight
    # (here: done) while the batch in hand is handled, and that batch starts once the one in hand
    # is done.
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    ids = clicks.send_many([{"n": i} for i in range(30)], keys=["k"] * 30)
    delivered_in_first: list[int] = []
    handled: list[int] = []
    done = threading.Event()

    def delivered() -> int:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT delivered_id FROM pgbroker.stream_lag('clicks')").fetchone()
        assert row is not None
        return int(row[0])

    async def handle(message: StreamMessage) -> None:
        if message.id == ids[9]:  # the first batch's last: wait for the next batch's read
            end = time.monotonic() + 30
            while (seen := await asyncio.to_thread(delivered)) <= ids[9] and time.monotonic() < end:
                await asyncio.sleep(0.02)
            delivered_in_first.append(seen)
        handled.append(message.id)
        if len(handled) == len(ids):
            done.set()

    run_until(dsn, [StreamWorker("clicks", "g", handle, batch_size=10)], done, 120)
    assert delivered_in_first == [ids[19]]
    assert handled == ids  # one key: in order, each once


def test_a_caught_up_worker_makes_about_one_read_a_send(dsn: str, broker: Broker) -> None:
    """At a trickle (a send every 10 ms), a worker with nothing left in hand holds the ack of
    what it handled until the next send is announced, and the ack goes with the read of it:
    about one read a send, where reading again at once came back empty and made two."""
    sends = 40
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=4, notify=True)
    clicks.create_group("g", start="start")
    handled: list[int] = []
    done = threading.Event()
    reads_before: list[int] = []

    async def handle(message: StreamMessage) -> None:
        await asyncio.sleep(0.001)
        handled.append(message.message["n"])
        if len(handled) == sends:
            done.set()

    worker = StreamWorker("clicks", "g", handle, concurrency=4)

    def trickle() -> None:
        time.sleep(1.0)  # the worker is up, listening, and found the stream empty
        reads_before.append(worker.stats.reads)
        for n in range(sends):
            clicks.send({"n": n}, key=str(n))
            time.sleep(0.01)

    sender = threading.Thread(target=trickle)
    sender.start()
    run_until(dsn, [worker], done, 60)
    sender.join()
    assert sorted(handled) == list(range(sends))
    assert worker.stats.reads - reads_before[0] <= 1.5 * sends
    assert group_lag(broker) == 0  # the last ack went too (with the stop)


def group_lag(broker: Broker) -> int:
    return sum(p.lag for p in Stream(broker, "clicks").lag() if p.group == "g")


def test_a_slow_message_holds_up_its_own_key_only(dsn: str, broker: Broker) -> None:
    # No barrier between batches: the batch read ahead starts on its keys while a slow message of
    # the batch before still runs. Before, a batch started once the one before was done, so one
    # slow handler held up every key.
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    keys = ["slow", *(f"k{i}" for i in range(29))]
    ids = clicks.send_many([{"n": i} for i in range(30)], keys=keys)
    others_done, done = asyncio.Event(), threading.Event()
    handled: list[int] = []
    overtaken: list[bool] = []

    async def handle(message: StreamMessage) -> None:
        if message.key == "slow":
            # The next batch's ten keys go by meanwhile (the first batch's nine, then those).
            with suppress(TimeoutError):
                await asyncio.wait_for(others_done.wait(), 10)
            overtaken.append(others_done.is_set())
        handled.append(message.id)
        if len(handled) == 19 and message.key != "slow":
            others_done.set()
        if len(handled) == len(ids):
            done.set()

    run_until(dsn, [StreamWorker("clicks", "g", handle, batch_size=10, concurrency=4)], done, 60)
    assert overtaken == [True]
    assert sorted(handled) == ids


def test_a_worker_joining_a_busy_one_gets_its_share_while_the_other_reads_ahead(
    dsn: str, broker: Broker
) -> None:
    # The busy worker always has a batch in flight; beyond its share it stops reading the
    # partitions it must give up, acks what it holds of them, and hands them over.
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=4)
    clicks.create_group("g", start="start")
    ids = clicks.send_many([{"n": i} for i in range(2000)], keys=[f"k{i % 40}" for i in range(2000)])
    handled: dict[str, list[int]] = {"a": [], "b": []}
    done = threading.Event()

    def handler(name: str) -> Callable[[StreamMessage], Awaitable[None]]:
        async def handle(message: StreamMessage) -> None:
            await asyncio.sleep(0.002)
            handled[name].append(message.id)
            if sum(map(len, handled.values())) >= len(ids):
                done.set()

        return handle

    first = threading.Thread(
        target=run_until,
        args=(dsn, [StreamWorker("clicks", "g", handler("a"), batch_size=20, consumer="a")], done, 120),
    )
    first.start()
    end = time.monotonic() + 60
    while len(handled["a"]) < 100 and time.monotonic() < end:
        time.sleep(0.01)
    run_until(dsn, [StreamWorker("clicks", "g", handler("b"), batch_size=20, consumer="b")], done, 120)
    first.join()
    assert sorted(handled["a"] + handled["b"]) == ids  # each once
    assert len(handled["b"]) > 500  # its two partitions' share of what was left (~950)


def test_a_batch_that_outlasts_the_lease_keeps_its_partitions(dsn: str, broker: Broker) -> None:
    # A read renews the consumer's lease. Handling a batch takes 12 x 0.5 s, twice the lease of 3 s,
    # with no read in between: without a heartbeat the other consumer found the first one's lease
    # over, took its partition and had the batch again, its key handled by both at once.
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    ids = clicks.send_many([{"n": i} for i in range(12)], keys=["k"] * 12)
    handled: list[tuple[str, int]] = []
    done = threading.Event()

    def handler(name: str) -> Callable[[StreamMessage], Awaitable[None]]:
        async def handle(message: StreamMessage) -> None:
            await asyncio.sleep(0.5)
            handled.append((name, message.id))
            if {i for _, i in handled} == set(ids):
                done.set()

        return handle

    def consumer(name: str) -> StreamWorker:
        return StreamWorker("clicks", "g", handler(name), batch_size=12, lease=3, consumer=name)

    first = threading.Thread(target=run_until, args=(dsn, [consumer("a")], done, 120))
    first.start()
    end = time.monotonic() + 60
    while not handled and time.monotonic() < end:
        time.sleep(0.01)
    run_until(dsn, [consumer("b")], done, 120)
    first.join()
    assert handled == [("a", i) for i in ids]  # each once, in order, by the consumer that read it


def test_what_is_left_of_a_partition_taken_meanwhile_is_dropped(dsn: str, broker: Broker) -> None:
    # The database out of reach for longer than the lease: another consumer took the partition
    # and has the batch again. At its next beat the worker finds it gone and drops the rest, so
    # that the key does not run in two places; it logs the loss.
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    ids = clicks.send_many([{"n": i} for i in range(12)], keys=["k"] * 12)
    handled: list[int] = []
    lost, done = threading.Event(), threading.Event()

    class Losses(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("stream_worker.partitions_lost"):
                lost.set()

    def take_the_partition() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE pgbroker.stream_cursor SET owner = 'other', epoch = epoch + 1")

    async def handle(message: StreamMessage) -> None:
        handled.append(message.id)
        if message.id == ids[2]:
            await asyncio.to_thread(take_the_partition)
            await asyncio.to_thread(lost.wait, 30)
            worker.stop()
            done.set()

    # A batch under half full: no read ahead, which would find the partition's owner gone, take
    # it back and have the messages again (delivered again, as they must be: the batch can never
    # be acked).
    worker = StreamWorker("clicks", "g", handle, batch_size=30, lease=2)
    losses = Losses()
    logging.getLogger("pgbroker").addHandler(losses)
    try:
        run_until(dsn, [worker], done, 120)
    finally:
        logging.getLogger("pgbroker").removeHandler(losses)
    assert lost.is_set()
    assert handled == ids[:3]
    assert worker.stats.stale == 9


def test_a_beat_s_answer_judges_only_the_batches_in_hand_when_it_was_sent() -> None:
    # A beat ran on the server before the read that took partition 3 and answers after it: its
    # answer does not name partition 3, which the batch read meanwhile holds under its epoch.
    # Judged against that batch, its messages would be dropped while its ack still holds: the
    # cursor would move past messages never handled. (The heartbeat's only use of the consumer
    # is this call; the rest of the worker's tests run against the database.)
    def batch(partition: int, epoch: int, msg_id: int) -> StreamBatch:
        return StreamBatch([StreamMessage("s", partition, msg_id, epoch, "k", datetime.now(UTC), None, {})])

    class Beats:
        def __init__(self) -> None:
            self.sent, self.answer = asyncio.Event(), asyncio.Event()

        async def heartbeat(self) -> dict[int, int]:
            self.sent.set()
            await self.answer.wait()
            return {0: 1}

    async def main() -> tuple[set[int], set[int]]:
        worker = StreamWorker("s", "g", lambda m: None, lease=1)
        worker._dispatch.add(batch(0, 1, 1))
        beats = Beats()
        beating = asyncio.create_task(worker._heartbeats(beats))  # type: ignore[arg-type]
        await asyncio.wait_for(beats.sent.wait(), 10)
        worker._dispatch.add(batch(3, 5, 2))  # read while the beat is in flight
        beats.answer.set()
        for _ in range(20):
            await asyncio.sleep(0)
        beating.cancel()
        with suppress(asyncio.CancelledError):
            await beating
        first, second = worker._dispatch.held
        return first.lost, second.lost

    assert asyncio.run(main()) == (set(), set())


def test_the_stream_worker_rides_out_a_lock_timeout_and_cut_sessions(dsn: str, broker: Broker) -> None:
    """Watchdog (issue 23, item 2): a role with a 200 ms lock_timeout while a maintenance
    transaction locks the group's cursors, then every session of the database terminated; the
    stream worker waits, retries, and handles every message sent before, during and after."""
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=2)
    clicks.create_group("g", start="start")
    clicks.send_many([{"n": n} for n in range(100)])
    handled: set[int] = set()
    worker = StreamWorker("clicks", "g", lambda m: handled.add(m.message["n"]), batch_size=20, poll_max=0.5)

    async def main() -> None:
        task = asyncio.create_task(serve([worker], dsn=impatient(dsn), handle_signals=False))

        async def until(count: int) -> None:
            deadline = time.monotonic() + 120
            while len(handled) < count:
                assert not task.done(), f"the stream worker stopped: {task.exception()!r}"
                assert time.monotonic() < deadline, f"{len(handled)} of {count} handled after 120 s"
                await asyncio.sleep(0.05)

        try:
            await until(100)

            def faults() -> None:
                with table_locked(dsn, "pgbroker.stream_cursor"):
                    time.sleep(3)
                terminate_sessions(dsn)
                clicks.send_many([{"n": n} for n in range(100, 200)])

            await asyncio.to_thread(faults)
            await until(200)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 60)

    asyncio.run(main())
    assert handled == set(range(200))
    assert worker.stats.connection_errors >= 1  # the faults were met


def test_a_stream_worker_whose_sessions_hang_says_so_and_goes_on_once_they_are_gone(
    dsn: str, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """Every session the stream worker holds stops answering (frozen with SIGSTOP: a hung server,
    a stuck pooler, a network dropping packets without a word). A call unanswered for a lease is
    given up as a lost connection, warned, and tried again on a new session; a frozen read may hold
    the group's locks, so the group goes on once the server is rid of that session (here: let go,
    its connection closed by the client). It waited for the answer for as long as the hang
    lasted, saying nothing."""
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=2)
    clicks.create_group("g", start="start")
    handled, done, handle = numbers_until(11)
    worker = StreamWorker("clicks", "g", handle, lease=2, poll_max=0.2, retries=False)

    def warned() -> bool:
        return any(r.getMessage().startswith("stream_worker.database_unavailable") for r in caplog.records)

    async def main() -> None:
        task = asyncio.create_task(serve([worker], dsn=freezable(dsn), handle_signals=False, schedules=False))
        try:
            await asyncio.to_thread(clicks.send, {"n": -1})
            await while_serving(task, lambda: bool(handled), "the first message not handled")
            with sessions_frozen(dsn) as frozen:
                assert frozen
                await asyncio.to_thread(clicks.send_many, [{"n": n} for n in range(10)])
                await while_serving(task, warned, "no warning while the sessions hang")
            await while_serving(task, done.is_set, "not every message handled")
        finally:
            worker.stop()
            await asyncio.wait_for(task, 60)

    asyncio.run(main())
    assert handled == set(range(-1, 10))


def test_a_stream_worker_that_starts_on_sessions_that_hang_gives_them_up_and_starts(
    dsn: str, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """Every session of the stream worker's pool stops answering before it starts (frozen with
    SIGSTOP): its first look-ups (the stream's settings, its group's retry queue) are given up
    within the lease (warned) and made again on new sessions, and it handles the stream while the
    old sessions still hang. They waited for as long as the hang lasted (for good behind a stuck
    pooler): the worker never started, saying nothing."""
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    clicks.send({"n": 1})
    handled, done, handle = numbers_until(1)
    worker = StreamWorker("clicks", "g", handle, lease=2, poll_max=0.2)

    async def main() -> None:
        # Every connection the pool will hand out is open before the hang, so the first call meets it.
        async with AsyncBroker(freezable(dsn), min_connections=2, max_connections=2) as frozen_pool:
            await asyncio.gather(*(frozen_pool.list_queues() for _ in range(4)))
            with sessions_frozen(dsn) as frozen:
                assert len(frozen) >= 2
                task = asyncio.create_task(
                    serve([worker], broker=frozen_pool, handle_signals=False, schedules=False)
                )
                try:
                    await while_serving(task, done.is_set, "not handled while the sessions hang")
                finally:
                    worker.stop()
            await asyncio.wait_for(task, 60)

    asyncio.run(main())
    assert handled == {1}
    assert any(r.getMessage().startswith("stream_worker.database_unavailable") for r in caplog.records)


def test_a_stream_worker_stopped_while_its_sessions_hang_returns(dsn: str, broker: Broker) -> None:
    """Every session of the stream worker's pool stops answering, then it is stopped: it returns
    (its partitions' release given up within the lease: the lease runs out instead), where the
    release waited for its answer for as long as the hang lasted (for good behind a stuck pooler)
    and the worker never stopped."""
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    clicks.send({"n": 1})
    _, done, handle = numbers_until(1)
    worker = StreamWorker("clicks", "g", handle, lease=2, poll_max=0.2, retries=False)

    async def main() -> None:
        # Every connection the pool will hand out is open before the hang, so the release meets it.
        async with AsyncBroker(freezable(dsn), min_connections=2, max_connections=2) as frozen_pool:
            task = asyncio.create_task(
                serve([worker], broker=frozen_pool, handle_signals=False, schedules=False)
            )
            try:
                await while_serving(task, done.is_set, "the message not handled")
                with sessions_frozen(dsn, between_statements=True) as frozen:
                    assert len(frozen) >= 2
                    worker.stop()
                    finished, _ = await asyncio.wait([task], timeout=STOPS_WITHIN)
                    assert finished, f"not returned {STOPS_WITHIN} s after its stop"
            finally:
                worker.stop()
                await asyncio.wait_for(task, 60)

    asyncio.run(main())


# A stopped stream worker returns within this while its sessions hang: a few leases, and slack.
STOPS_WITHIN = 30.0


def test_a_stream_worker_whose_maintenance_hangs_gives_the_round_up_and_maintains_again(
    dsn: str, broker: Broker, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Every session of the stream worker's pool stops answering (frozen with SIGSTOP) while it
    applies the stream's retention every half second: the round on a frozen session is given up
    within its bound (the lease here), warned, and a later round, on a new session, empties what
    has expired while the old sessions still hang. The round waited for its answer for as long as
    the hang lasted (for good behind a stuck pooler), saying nothing, and no round came after it."""
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1, retention=5, truncate_consumed=False)
    clicks.create_group("g", start="start")
    handled, _, handle = numbers_until(1)
    worker = StreamWorker("clicks", "g", handle, lease=2, retries=False, maintain_every=0.5)

    def emptied() -> bool:
        return conn.execute("SELECT count(*) FROM pgbroker.s_clicks").fetchone() == (0,)

    async def main() -> None:
        # Every connection the pool will hand out is open before the hang, so the next round meets it.
        async with AsyncBroker(freezable(dsn), min_connections=5, max_connections=5) as frozen_pool:
            task = asyncio.create_task(
                serve([worker], broker=frozen_pool, handle_signals=False, schedules=False)
            )
            try:
                await asyncio.to_thread(clicks.send, {"n": -1})
                await while_serving(task, lambda: bool(handled), "the first message not handled")
                # Between statements: one stopped inside a read would keep its partition's table
                # locked, and the retention skips a table it cannot lock at once.
                with sessions_frozen(dsn, between_statements=True) as frozen:
                    assert len(frozen) >= 5
                    # Sent now, on a session of the test's: expired 5 s on, during the hang.
                    await asyncio.to_thread(clicks.send, {"n": 0})
                    await while_serving(
                        task, emptied, "the retention not applied while the sessions hang", 120
                    )
            finally:
                worker.stop()
                await asyncio.wait_for(task, 60)

    asyncio.run(main())
    assert any(r.getMessage().startswith("stream_worker.maintenance_failed") for r in caplog.records)


def test_a_read_whose_answer_is_lost_is_handed_out_again_though_the_first_rewinds_fail(
    dsn: str, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that commits but whose answer never arrives (the connection cut after the commit, as
    at the start of a failover) has moved the group past its rows: the worker must rewind before it
    reads again, even when the database is still away for its first tries. Before, a failed rewind
    was not tried again and the next read skipped those rows for good."""
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    clicks.send_many([{"n": n} for n in range(60)])
    real_read, real_rewind = AsyncStreamConsumer.ack_and_read, AsyncStreamConsumer.rewind
    faults = {"answers lost": 1, "rewinds refused": 3}

    async def answer_lost(
        self: AsyncStreamConsumer, acked: StreamBatch | None, qty: int = 100
    ) -> StreamBatch:
        found = await real_read(self, acked, qty)
        if found.messages and faults["answers lost"]:
            faults["answers lost"] -= 1
            raise psycopg.OperationalError("the connection was lost after the commit (test)")
        return found

    async def away(self: AsyncStreamConsumer) -> int:
        if faults["rewinds refused"]:
            faults["rewinds refused"] -= 1
            raise psycopg.OperationalError("the server is still away (test)")
        return await real_rewind(self)

    monkeypatch.setattr(AsyncStreamConsumer, "ack_and_read", answer_lost)
    monkeypatch.setattr(AsyncStreamConsumer, "rewind", away)
    handled, done, handle = numbers_until(60)

    worker = StreamWorker("clicks", "g", handle, batch_size=20, poll_max=0.2, retries=False)
    run_until(dsn, [worker], done, 30)
    assert sorted(set(range(60)) - handled) == []  # none skipped
    assert faults == {"answers lost": 0, "rewinds refused": 0}  # the faults were met
    assert worker.stats.connection_errors >= 4


def test_a_stream_worker_whose_retry_queue_worker_fails_stops_and_says_why(
    dsn: str, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """The retry queue's worker ends on an error it cannot ride out (here its queue is dropped):
    the stream worker stops too and raises it, with a warning when it happens, where it went on
    without retries and said nothing but the retry worker's 'stopped'."""
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    retry_queue = clicks.create_group("g", start="start")
    clicks.send({"n": 1})
    handled = threading.Event()

    async def handle(message: StreamMessage) -> None:
        handled.set()

    async def main() -> None:
        worker = StreamWorker("clicks", "g", handle)
        task = asyncio.create_task(serve([worker], dsn=dsn, handle_signals=False))
        while not handled.is_set() and not task.done():
            await asyncio.sleep(0.05)
        broker.drop_queue(retry_queue)
        await asyncio.wait_for(task, 60)

    # QueueNotFound; or, when a read of the retry worker was under way as the DROP committed, the
    # server's word for the table gone under that read (42P01): the error raised either way.
    with pytest.raises((QueueNotFound, DatabaseError)) as raised:
        asyncio.run(main())
    assert isinstance(raised.value, QueueNotFound) or raised.value.sqlstate == "42P01", raised.value
    assert any(r.getMessage().startswith("stream_worker.retries_failed") for r in caplog.records)


def test_a_stream_worker_rides_out_a_failed_look_up_at_its_start(dsn: str, broker: Broker) -> None:
    """Its start-up look-ups (whether the stream notifies, its group's retry queue) time out on
    a lock while maintenance holds the streams' table: the worker waits and tries again, as its
    reads do, and then handles every message. It stopped with the error (and `pgbroker worker`
    exited 5 when a server restart met a worker process's start)."""
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=2)
    clicks.create_group("g", start="start")
    clicks.send_many([{"n": n} for n in range(20)])
    handled, done, handle = numbers_until(20)

    worker = StreamWorker("clicks", "g", handle)
    locked = threading.Event()

    def maintenance() -> None:  # the lock held until the worker has met it
        with table_locked(dsn, "pgbroker.stream"):
            locked.set()
            deadline = time.monotonic() + 120
            while not worker.stats.connection_errors and time.monotonic() < deadline:
                time.sleep(0.05)

    holder = threading.Thread(target=maintenance)
    holder.start()
    assert locked.wait(60)
    try:
        run_until(impatient(dsn), [worker], done, 120)
    finally:
        holder.join()
    assert handled == set(range(20))
    assert worker.stats.connection_errors >= 1  # the lock was met


def test_the_worker_names_a_session_that_holds_its_retention_up(
    dsn: str, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that read the stream in a transaction and left it open keeps retention from the
    child tables it holds and the ring from rotating: the worker's maintenance says who, each round."""
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    clicks.create_group("audit", start="start")
    clicks.send_many([{"n": i} for i in range(10)])
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")

    async def handle(message: StreamMessage) -> None:
        pass

    def held_up() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage().startswith("stream_worker.held_up")]

    with psycopg.connect(dsn, application_name="audit-reader") as idle:
        idle.execute("SELECT * FROM pgbroker.stream_read('clicks', 'audit', 'auditor', 10, 30)").fetchall()
        worker = StreamWorker("clicks", "g", handle, lease=1, maintain_every=0.5)
        asyncio.run(serve_until(dsn, [worker], lambda: bool(held_up()), timeout=30))
        pid = idle.info.backend_pid
    message = held_up()[0].getMessage()
    assert f"pid={pid}" in message
    assert "application=audit-reader" in message
    assert "pgbroker sessions" in message
