"""Traffic across a failover: every kind of pgbroker process at work on a multi-host DSN while the
primary fails, and what each saw. The failover test (tests/system/test_failover.py) asserts on it;
the failover bench (bench/failover_bench.py) prints it per replication mode.

What runs, each on the same multi-host DSN and none restarted:

- the Python client (``Broker``), sending numbered messages to ``jobs``, ``outbox`` and ``wake``,
  and to the stream ``events`` under 8 keys;
- ``pgbroker worker`` (a CLI process) handling ``jobs``: its handler (``record``) appends each
  delivery to a file, outside the database, so that it never fails with the database;
- two more ``pgbroker worker`` processes running the App ``events``: a stream handler
  (``record_event``, to a file likewise) consuming group ``g`` of ``events``, two consumers
  sharing its 4 partitions (StreamWorkers, as replicas of a deployment run them);
- the scheduler: every worker process runs one, so two claim each tick of the schedule ``tick``,
  which sends to ``ticks``. Its cron ticks once a year; the traffic gives it a tick a second
  instead, by setting its next tick (``next_run``) a moment ahead once the one before was sent,
  as an operator changing a schedule would (the change is announced to the schedulers);
- ``pgbroker serve``: an HTTP client sends to ``http`` and reads and acks its messages there;
- ``pgbroker bridge out`` publishing ``outbox`` to a RabbitMQ queue this module consumes;
- ``pgbroker bridge in`` receiving into ``inbox`` from another RabbitMQ queue, to which this
  module publishes numbered messages (each with its message id, which the bridge de-duplicates
  by); a publish RabbitMQ confirmed is an acknowledged send, to be stored once;
- the listener: a waiting read of ``wake`` that only a notification wakes in time (its poll
  interval is 60 s), one send a second.

Every send carries a number used once (``n``), so that what was acknowledged can be matched with
what was delivered even when an asynchronous failover issues the same msg_id twice. (A message
identity unique across failovers is tested by tests/support/identity.py, retry-safe HTTP sends by
tests/http/test_idempotency.py; the HTTP sends here carry no idempotency key.)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from aiormq.abc import DeliveredMessage
from psycopg import sql
from psycopg_pool import PoolTimeout

from pgbroker import App, Broker, Message, Stream, StreamMessage
from pgbroker._db.api_keys import create_key
from pgbroker.errors import PgbrokerError
from tests.http.live import LiveServer, pgbroker_serve
from tests.support.bridge_processes import BridgeProcess
from tests.support.failover_checks import (
    Handled,
    acks_undone,
    log_order,
    out_of_order_keys,
    partition_owners,
    ticks_sent,
)
from tests.support.paths import ROOT
from tests.support.processes import stop_gracefully
from tests.support.rabbit import Rabbit

HANDLED_FILE = "PGBROKER_FAILOVER_HANDLED"
KINDS = ("client", "worker", "serve", "bridge out", "bridge in", "listener", "stream worker", "scheduler")
QUEUES = ("jobs", "outbox", "http", "wake")  # consumed until empty
EVENTS_FILE = "PGBROKER_FAILOVER_EVENTS"
STREAM, GROUP, KEYS = "events", "g", 8
INBOX = "inbox"  # bridge in's queue: nobody consumes it, what it holds is what was received
PATHS = (*QUEUES, STREAM, INBOX)
STREAM_BATCH = 20  # the stream handler's batch size; it runs 4 handlers at once
SCHEDULE, TICKS = "tick", "ticks"  # the schedule, and the queue it sends to
# Seconds of every lease (the worker's, serve's reads, the waiting read's): longer than the
# failover here, as docs/operations.md advises, and short enough that a lease whose answer the
# crash cut (the read committed, its client never told) runs out before the run ends.
LEASE = 5
WAKE_EVERY = 1.0  # seconds between two sends to ``wake``
WAKE_WAIT = 20  # seconds a read of ``wake`` waits; its poll interval is 60
# Bounds for a hung run on a loaded machine, not for a slow one.
RESUME_BOUND = 90.0
DRAIN_BOUND = 120.0
_TRANSIENT = (PgbrokerError, psycopg.Error, PoolTimeout)


def record(message: Message) -> None:
    """The worker's handler: one line per delivery (msg_id, n, wall time of the send, and now)."""
    body = message.message
    _append(HANDLED_FILE, f"{message.msg_id} {body['n']} {body['at']:.6f} {time.time():.6f}\n")


events = App()


# The default lease, longer than the failover: both consumers keep their partitions across it.
@events.stream_handler(STREAM, GROUP, batch_size=STREAM_BATCH, concurrency=4)
def record_event(message: StreamMessage) -> None:
    """The stream handler: one line per delivery (partition, id, key, n, sent at, now, process)."""
    body = message.message
    handled = f"{body['n']} {body['at']:.6f} {time.time():.6f} {os.getpid()}"
    _append(EVENTS_FILE, f"{message.partition} {message.id} {message.key} {handled}\n")


def _append(file_variable: str, line: str) -> None:
    with open(os.environ[file_variable], "a") as f:
        f.write(line)


@dataclass
class Outcome:
    """What the run saw, per path a message takes (``jobs`` to the worker, ``outbox`` to
    RabbitMQ, ``http`` through serve, ``wake`` to the waiting read, ``events`` to the stream
    worker, ``inbox`` from RabbitMQ: delivered there means stored, as often as it is), and of the
    schedule's ticks."""

    # Seconds from the promotion to a kind's first success with a message sent after it (the
    # client's and serve's: a send begun after it), so that nothing in flight before counts.
    resume: dict[str, float]
    acknowledged: dict[str, int]  # sends acknowledged (inbox: publishes RabbitMQ confirmed), per queue
    lost: dict[str, int]  # acknowledged sends never delivered, per queue
    # Acknowledged sends the primary at the end does not hold (in the queue or its archive): gone
    # with the old primary, whether or not a consumer got them from it first.
    missing: dict[str, int]
    duplicated: dict[str, int]  # messages delivered more than once, per queue
    acked_then_delivered: int  # http: delivered again after their ack was answered 200
    reissued_msg_ids: int  # msg_ids acknowledged for two different sends of one queue
    wake_latency: float  # the slowest wake-up of a read by a send, once resumed
    # events: keys handled out of the log's order, with their deliveries (tests/support/failover_checks.py)
    out_of_order: dict[str, list[int]]
    acks_undone: int  # times a partition's acked_id went back
    # events delivered again whose first delivery was over a lease before the fault began: not
    # in hand when the primary went, so their ack had had time to be answered
    redelivered_from_before: int
    ticks_given: int  # ticks the schedule was given (the change acknowledged)
    ticks_unsent: int  # of those, never sent
    ticks_sent_twice: int  # ticks sent more than once
    # events: the partitions whose owner or epoch differ after the run from before the fault
    partitions_moved: list[int] = field(default_factory=list)

    def report(self, label: str) -> str:
        resume = ", ".join(f"{kind} {self.resume[kind]:.2f} s" for kind in KINDS)
        return (
            f"{label}: resumed after the promotion: {resume}; sends acknowledged {self.acknowledged}, "
            f"lost {self.lost}, missing on the new primary {self.missing}, duplicated "
            f"{self.duplicated}, delivered again after an answered ack "
            f"{self.acked_then_delivered}, msg_ids issued twice {self.reissued_msg_ids}, slowest "
            f"wake-up once resumed {self.wake_latency:.2f} s; events: keys out of order "
            f"{self.out_of_order}, acks undone {self.acks_undone}, delivered again from over a lease "
            f"before the fault {self.redelivered_from_before}, partitions that changed hands "
            f"{self.partitions_moved}; ticks given {self.ticks_given}, "
            f"unsent {self.ticks_unsent}, sent twice {self.ticks_sent_twice}"
        )


@dataclass
class _Seen:
    """What the threads of the run record, under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    successes: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    # queue: n -> the id its sender got back (inbox: the AMQP message id the publisher gave it)
    sent: dict[str, dict[int, int | str]] = field(default_factory=lambda: defaultdict(dict))
    delivered: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))  # queue: [n]
    wake_latencies: list[tuple[float, float]] = field(default_factory=list)  # (sent at, latency)
    http_acked: set[int] = field(default_factory=set)
    acked_then_delivered: int = 0
    ticks: list[datetime] = field(default_factory=list)  # the ticks given to the schedule

    def success(self, kind: str, began: float, at: float | None = None) -> None:
        """A kind did its work on what was sent (or a send begun) at ``began``, at ``at`` (now)."""
        with self.lock:
            self.successes[kind].append((began, time.time() if at is None else at))


class Traffic:
    """``with Traffic(dsn, directory, amqp) as traffic: outcome = traffic.across(fault)``."""

    def __init__(self, dsn: str, directory: Path, amqp: str) -> None:
        self.dsn = dsn
        self.directory = directory
        self.amqp = amqp
        self.handled_file = directory / "handled.txt"
        self._seen = _Seen()
        self._sending = threading.Event()
        self._stop = threading.Event()
        self._numbers = itertools.count()
        self._threads: list[threading.Thread] = []
        self._stack = ExitStack()
        self._target = ""  # the RabbitMQ queue bridge out publishes to
        self._source = ""  # the RabbitMQ queue bridge in receives from
        self._source_ready = -1  # its messages ready (none delivered yet), as last seen
        self._rabbit_ready = threading.Event()
        self._promoted_at = 0.0
        self._fault_at = 0.0
        self.events_file = directory / "events.txt"
        self.worker: subprocess.Popen[bytes] | None = None
        self.stream_workers: list[subprocess.Popen[bytes]] = []
        self.bridge: BridgeProcess | None = None
        self.bridge_in: BridgeProcess | None = None
        self.server: LiveServer | None = None

    def __enter__(self) -> Traffic:
        with Broker(self.dsn, max_connections=1) as broker:
            for name in QUEUES:
                broker.create_queue(name, notify=True)
            Stream(broker, STREAM).create(partitions=4, notify=True)
            Stream(broker, STREAM).create_group(GROUP, start="start")
            broker.create_queue(TICKS)
            broker.create_queue(INBOX)
            broker.add_schedule(SCHEDULE, TICKS, "0 0 1 1 *", {})
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            _, token = create_key(conn, "failover", scopes=["send", "read"])
        self._stack.callback(self._stop_threads)
        self._thread(self._use_rabbit)
        assert self._rabbit_ready.wait(60), "no RabbitMQ queues to bridge to and from"
        self.server = self._stack.enter_context(pgbroker_serve(self.dsn, "--connections", "4"))
        self.worker = self._start_worker(
            "worker", "tests.support.failover:record", "--queue", "jobs", "--concurrency", "4",
            "--vt", str(LEASE),
        )  # fmt: skip
        self.stream_workers = [
            self._start_worker(f"stream-worker-{i}", "tests.support.failover:events") for i in (1, 2)
        ]
        self.bridge = BridgeProcess(
            "bridge", "out", "--queue", "outbox", "--amqp", self.amqp, "--routing-key", self._target,
            "--lease", "3", "--batch-size", "50", dsn=self.dsn, logs=self.directory, env={},
        )  # fmt: skip
        self._stack.callback(self._end, self.bridge.process)
        self.bridge_in = BridgeProcess(
            "bridge", "in", "--from", f"{self.amqp}?queue={self._source}", "--queue", INBOX,
            dsn=self.dsn, logs=self.directory, env={},
        )  # fmt: skip
        self._stack.callback(self._end, self.bridge_in.process)
        self._sending.set()
        self._thread(self._send_with_the_client)
        self._thread(self._use_serve, token)
        self._thread(self._wait_for_wake_ups)
        self._thread(self._give_ticks)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def across(self, fault: Callable[[], float], *, warm_up: float = 2.0) -> Outcome:
        """Let every kind work, run ``fault`` (which returns the wall time of the promotion), wait
        until every kind works again, then stop sending, let everything drain and count."""
        self._until(lambda: all(self._successes(kind, 0.0) for kind in KINDS), "every kind at work")
        # Both consumers own their share before the fault: a join later would move partitions.
        self._until(lambda: self._stream_consumers_at_work() == 2, "both stream consumers owning partitions")
        time.sleep(warm_up)
        owners = partition_owners(self.dsn, STREAM, GROUP)
        with self._inbox_write_in_flight():
            self._fault_at = time.time()
            promoted_at = self._promoted_at = fault()
        self._until(
            lambda: all(self._successes(kind, promoted_at) for kind in KINDS),
            "every kind at work after the promotion",
            RESUME_BOUND,
        )
        time.sleep(warm_up)
        self._sending.clear()
        self._until(self._drained, "every queue drained", DRAIN_BOUND)
        time.sleep(4)  # bridge out's lease (3 s): a publish whose ack was cut comes again within it
        self._assert_never_restarted()
        outcome = self._outcome(promoted_at)
        outcome.partitions_moved = sorted(
            p for p, owner in partition_owners(self.dsn, STREAM, GROUP).items() if owners.get(p) != owner
        )
        return outcome

    # -- what runs ---------------------------------------------------------------------------

    @contextmanager
    def _inbox_write_in_flight(self) -> Iterator[None]:
        """Bridge in's write of a batch waiting, unanswered, when the fault comes, whatever the
        timing: inbox's table locked until then (reading it is not held up). The batch is received
        and unacked on RabbitMQ, so it must come again and be stored once; a bridge that acked
        before its commit would lose it. The lock goes with the old primary's sessions."""
        table = f"pgmq.q_{INBOX}"
        waiting = sql.SQL("SELECT count(*) FROM pg_locks WHERE relation = {}::regclass AND NOT granted")
        lock = psycopg.connect(self.dsn)
        try:
            lock.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(sql.Identifier(*table.split("."))))
            with psycopg.connect(self.dsn, autocommit=True) as look:

                def write_waits() -> bool:
                    row = look.execute(waiting.format(sql.Literal(table))).fetchone()
                    return row is not None and row[0] > 0

                self._until(write_waits, "bridge in's write waiting for inbox")
            yield
        finally:
            lock.close()  # its server is gone or stopped by now: nothing to commit

    def _start_worker(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """``pgbroker worker ARGS``, logging to NAME.log (and running a scheduler, as by default)."""
        log = self._stack.enter_context((self.directory / f"{name}.log").open("wb"))
        worker = subprocess.Popen(
            [sys.executable, "-m", "pgbroker.cli", "--dsn", self.dsn, "-v", "worker", *args],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, HANDLED_FILE: str(self.handled_file), EVENTS_FILE: str(self.events_file)},
        )  # fmt: skip
        self._stack.callback(self._end, worker)
        return worker

    def _send_with_the_client(self) -> None:
        with Broker(self.dsn, max_connections=2) as broker:
            last_wake = 0.0
            keys = itertools.cycle(f"k{i}" for i in range(KEYS))
            while not self._stop.is_set():
                if not self._sending.is_set():
                    time.sleep(0.05)
                    continue
                queues = ["jobs", "outbox", STREAM]
                if time.monotonic() - last_wake > WAKE_EVERY:
                    queues.append("wake")
                for name in queues:
                    n, began = next(self._numbers), time.time()
                    body = {"n": n, "at": began}
                    try:
                        if name == STREAM:
                            msg_id = Stream(broker, STREAM).send(body, key=next(keys))
                        else:
                            msg_id = broker.queue(name).send(body)
                    except _TRANSIENT:
                        time.sleep(0.05)
                        continue
                    with self._seen.lock:
                        self._seen.sent[name][n] = msg_id
                    self._seen.success("client", began)
                    if name == "wake":
                        last_wake = time.monotonic()
                time.sleep(0.02)

    def _use_serve(self, token: str) -> None:
        assert self.server is not None
        headers = {"authorization": f"Bearer {token}"}
        with httpx.Client(base_url=self.server.url, headers=headers, timeout=30) as http:
            while not self._stop.is_set():
                try:
                    if self._sending.is_set():
                        self._send_over_http(http)
                    self._read_and_ack_over_http(http)
                except httpx.HTTPError:
                    time.sleep(0.05)
                time.sleep(0.02)

    def _send_over_http(self, http: httpx.Client) -> None:
        n, began = next(self._numbers), time.time()
        answer = http.post("/v1/queues/http/messages", json={"message": {"n": n}})
        if answer.status_code == 201:
            with self._seen.lock:
                self._seen.sent["http"][n] = answer.json()["msg_ids"][0]
            self._seen.success("serve", began)

    def _read_and_ack_over_http(self, http: httpx.Client) -> None:
        answer = http.post("/v1/queues/http/read", json={"qty": 10, "vt": LEASE})
        if answer.status_code != 200 or not answer.json()["messages"]:
            return
        messages = answer.json()["messages"]
        n_of = {m["msg_id"]: m["message"]["n"] for m in messages}
        with self._seen.lock:
            for n in n_of.values():
                self._seen.delivered["http"].append(n)
                self._seen.acked_then_delivered += n in self._seen.http_acked
        acked = http.post("/v1/queues/http/ack", json={"receipts": [m["receipt"] for m in messages]})
        if acked.status_code == 200:
            with self._seen.lock:
                self._seen.http_acked.update(n_of[msg_id] for msg_id in acked.json()["acked"])

    def _wait_for_wake_ups(self) -> None:
        with Broker(self.dsn, max_connections=1, poll_interval=60) as broker:
            wake = broker.queue("wake")
            while not self._stop.is_set():
                try:
                    message = wake.read(vt=LEASE, wait=WAKE_WAIT)
                    if message is None:
                        continue
                    now = time.time()
                    wake.ack(message)
                except _TRANSIENT:
                    time.sleep(0.05)
                    continue
                with self._seen.lock:
                    self._seen.delivered["wake"].append(message.message["n"])
                    self._seen.wake_latencies.append((message.message["at"], now - message.message["at"]))
                self._seen.success("listener", message.message["at"])

    def _give_ticks(self) -> None:
        """Give the schedule a tick at the next whole second once the one before was sent (its
        next tick is then a year away); a tick given is a change acknowledged, which must be sent
        once. The scheduler's success is the send of a tick, when the server stamped it."""
        give = sql.SQL("""
            UPDATE pgbroker.schedules s
            SET next_run = date_trunc('second', clock_timestamp()) + interval '1 second', updated_at = now()
            WHERE name = %s AND next_run > clock_timestamp() + interval '1 day'
            RETURNING next_run, (SELECT extract(epoch FROM enqueued_at) FROM {} WHERE msg_id = s.last_msg_id)
        """).format(sql.Identifier("pgmq", f"q_{TICKS}"))
        with Broker(self.dsn, max_connections=1) as broker:
            while not self._stop.is_set():
                time.sleep(0.05)
                if not self._sending.is_set():
                    continue
                try:
                    with broker.connection() as conn, conn.transaction():
                        row = conn.execute(give, (SCHEDULE,)).fetchone()
                except _TRANSIENT:
                    continue
                if row is None:
                    continue
                tick, sent_before = row
                if sent_before is not None:
                    self._seen.success("scheduler", float(sent_before), at=float(sent_before))
                with self._seen.lock:
                    self._seen.ticks.append(tick)

    def _use_rabbit(self) -> None:
        """Consume what bridge out publishes, and publish what bridge in receives."""

        async def use() -> None:
            async with Rabbit(self.amqp) as rabbit:
                self._target, self._source = await rabbit.queue(), await rabbit.queue()
                self._rabbit_ready.set()

                async def on_message(message: DeliveredMessage) -> None:
                    body = json.loads(message.body)
                    with self._seen.lock:
                        self._seen.delivered["outbox"].append(body["n"])
                    self._seen.success("bridge out", body["at"])
                    assert message.delivery_tag is not None
                    await rabbit.channel.basic_ack(message.delivery_tag)

                await rabbit.channel.basic_consume(self._target, on_message)
                while not self._stop.is_set():
                    if self._sending.is_set():
                        await self._publish_to_bridge_in(rabbit)
                    self._source_ready = await rabbit.count(self._source)
                    await asyncio.sleep(0.02)

        asyncio.run(use())

    async def _publish_to_bridge_in(self, rabbit: Rabbit) -> None:
        n, began = next(self._numbers), time.time()
        message_id = f"failover-{n}"
        body = json.dumps({"n": n, "at": began}).encode()
        if await rabbit.publish(self._source, body, message_id=message_id, content_type="application/json"):
            with self._seen.lock:
                self._seen.sent[INBOX][n] = message_id

    # -- bookkeeping -------------------------------------------------------------------------

    def _thread(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _stop_threads(self) -> None:
        self._stop.set()
        # The waiting read would otherwise sleep out its wait; a send wakes it to see the stop.
        with Broker(self.dsn, max_connections=1) as broker:
            broker.queue("wake").send({"n": -1, "at": time.time()})
        for thread in self._threads:
            thread.join(timeout=WAKE_WAIT + 30)

    @staticmethod
    def _end(process: subprocess.Popen[Any]) -> None:
        stop_gracefully(process, 60)

    def _handled(self) -> Iterator[tuple[int, float, float]]:
        """The worker's deliveries: (n, wall time of the send, of the delivery)."""
        if self.handled_file.exists():
            for line in self.handled_file.read_text().splitlines():
                _, n, sent_at, at = line.split()
                yield int(n), float(sent_at), float(at)

    def _handled_events(self) -> list[Handled]:
        """The stream worker's deliveries, in the order handled."""
        if not self.events_file.exists():
            return []
        handled = []
        for line in self.events_file.read_text().splitlines():
            partition, id_, key, n, sent_at, at, pid = line.split()
            handled.append(
                Handled(int(partition), int(id_), key, int(n), float(sent_at), float(at), int(pid))
            )
        return handled

    def _successes(self, kind: str, after: float) -> list[float]:
        """When a kind did its work on what was sent after ``after``."""
        if kind == "worker":
            return [at for _, began, at in self._handled() if began > after]
        if kind == "stream worker":
            return [event.at for event in self._handled_events() if event.sent_at > after]
        if kind == "bridge in":
            return self._first_received(after)
        with self._seen.lock:
            return [at for began, at in self._seen.successes[kind] if began > after]

    def _until(self, condition: Callable[[], bool], what: str, bound: float = RESUME_BOUND) -> None:
        deadline = time.monotonic() + bound
        while not condition():
            self._assert_never_restarted()
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {bound:.0f} s; {self._logs()}")
            time.sleep(0.05)

    def _stream_consumers_at_work(self) -> int:
        try:
            return len({owner for owner, _ in partition_owners(self.dsn, STREAM, GROUP).values() if owner})
        except _TRANSIENT:
            return 0

    def _drained(self) -> bool:
        """Every queue empty, the group caught up, the last tick given sent, bridge in's source
        delivered (what bridge in holds unacked is written within moments)."""
        if self._source_ready != 0:
            return False
        try:
            with Broker(self.dsn, max_connections=1) as broker:
                return (
                    all(broker.queue(name).metrics().queue_length == 0 for name in QUEUES)
                    and all(g.lag == 0 for g in Stream(broker, STREAM).groups())
                    and all(s.next_run > datetime.now(UTC) + timedelta(days=1) for s in broker.schedules())
                )
        except _TRANSIENT:
            return False

    def _stored(self, queue: str) -> set[int]:
        """The numbers of the messages the primary holds in ``queue`` or its archive (where every
        consumer here puts what it is done with)."""
        query = sql.SQL(
            "SELECT (message->>'n')::bigint FROM {} UNION ALL SELECT (message->>'n')::bigint FROM {}"
        )
        tables = (sql.Identifier("pgmq", f"{kind}_{queue}") for kind in ("q", "a"))
        with psycopg.connect(self.dsn) as conn:
            return {row[0] for row in conn.execute(query.format(*tables))}

    def _first_received(self, after: float) -> list[float]:
        """When bridge in first stored a message published after ``after`` (the server's stamp)."""
        query = sql.SQL(
            "SELECT min(extract(epoch FROM enqueued_at))::float8 FROM {} WHERE (message->>'at')::float8 > %s"
        ).format(sql.Identifier("pgmq", f"q_{INBOX}"))
        try:
            with psycopg.connect(self.dsn) as conn:
                row = conn.execute(query, (after,)).fetchone()
        except _TRANSIENT:
            return []
        return [] if row is None or row[0] is None else [row[0]]

    def _received(self) -> list[int]:
        """The numbers of the messages bridge in stored, once per copy, on the primary at the end."""
        query = sql.SQL("SELECT (message->>'n')::bigint FROM {}").format(sql.Identifier("pgmq", f"q_{INBOX}"))
        with psycopg.connect(self.dsn) as conn:
            return [row[0] for row in conn.execute(query)]

    def _assert_never_restarted(self) -> None:
        assert self.worker is not None
        assert self.bridge is not None
        assert self.bridge_in is not None
        assert self.server is not None
        for name, process in (
            ("worker", self.worker),
            *(("stream worker", worker) for worker in self.stream_workers),
            ("bridge out", self.bridge.process),
            ("bridge in", self.bridge_in.process),
            ("serve", self.server.process),
        ):
            assert process.poll() is None, f"{name} exited {process.returncode}; {self._logs()}"
        for log in ("worker.log", "stream-worker-1.log", "stream-worker-2.log"):
            worker_log = (self.directory / log).read_text(errors="replace")
            assert "supervisor.restarting" not in worker_log, f"a worker was restarted; {self._logs()}"

    def _logs(self) -> str:
        assert self.server is not None
        assert self.bridge is not None
        assert self.bridge_in is not None
        tail = "\n".join(
            f"--- {name}:\n" + "\n".join(text.splitlines()[-30:])
            for name, text in (
                ("worker", (self.directory / "worker.log").read_text(errors="replace")),
                *(
                    (name, (self.directory / f"{name}.log").read_text(errors="replace"))
                    for name in ("stream-worker-1", "stream-worker-2")
                ),
                ("serve", self.server.log()),
                ("bridge out", self.bridge.log.read_text(errors="replace")),
                ("bridge in", self.bridge_in.log.read_text(errors="replace")),
            )
        )
        idle = [kind for kind in KINDS if not self._successes(kind, self._promoted_at)]
        return f"kinds not at work since the promotion (or the start): {idle}\n{tail}"

    def _outcome(self, promoted_at: float) -> Outcome:
        with self._seen.lock:
            delivered = {name: list(ns) for name, ns in self._seen.delivered.items()}
            sent = {name: dict(ns) for name, ns in self._seen.sent.items()}
            latencies = list(self._seen.wake_latencies)
            acked_then_delivered = self._seen.acked_then_delivered
            ticks_given = {tick.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") for tick in self._seen.ticks}
        events = self._handled_events()
        delivered["jobs"] = [n for n, _, _ in self._handled()]
        delivered[STREAM] = [event.n for event in events]
        delivered[INBOX] = self._received()
        in_log = log_order(self.dsn, STREAM)
        stored = {name: self._stored(name) for name in QUEUES}
        stored[STREAM] = {n for numbers in in_log.values() for n in numbers}
        stored[INBOX] = set(delivered[INBOX])
        resume = {kind: min(self._successes(kind, promoted_at)) - promoted_at for kind in KINDS}
        resumed = promoted_at + max(resume.values())
        reissued = 0
        for name in PATHS:
            by_msg_id = Counter(sent.get(name, {}).values())
            reissued += sum(1 for times in by_msg_id.values() if times > 1)
        first_handled: dict[int, float] = {}
        redelivered_from_before = 0
        for event in events:
            if event.n in first_handled:
                redelivered_from_before += first_handled[event.n] < self._fault_at - LEASE
            else:
                first_handled[event.n] = event.at
        ticks = ticks_sent(self.dsn, TICKS)
        return Outcome(
            resume=resume,
            acknowledged={name: len(sent.get(name, {})) for name in PATHS},
            lost={name: len(set(sent.get(name, {})) - set(delivered.get(name, []))) for name in PATHS},
            missing={name: len(set(sent.get(name, {})) - stored[name]) for name in PATHS},
            duplicated={
                name: sum(1 for times in Counter(delivered.get(name, [])).values() if times > 1)
                for name in PATHS
            },
            acked_then_delivered=acked_then_delivered,
            reissued_msg_ids=reissued,
            wake_latency=max((lat for at, lat in latencies if at > resumed), default=0.0),
            out_of_order=out_of_order_keys(events, in_log),
            acks_undone=acks_undone(self.dsn, STREAM, GROUP),
            redelivered_from_before=redelivered_from_before,
            ticks_given=len(ticks_given),
            ticks_unsent=len(ticks_given - set(ticks)),
            ticks_sent_twice=sum(1 for times in ticks.values() if times > 1),
        )
