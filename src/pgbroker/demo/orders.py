"""The demo's first stage: a queue, a burst of orders, four consumers with fenced acks, one of them
too slow for its lease, and the books balanced (counted straight from the tables).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from psycopg import sql

from pgbroker import _sql
from pgbroker.cli.support.tables import metrics_table
from pgbroker.demo.stage import Demo
from pgbroker.errors import StaleReceipt
from pgbroker.queues._client import Broker, Queue
from pgbroker.queues._records import Message

__all__ = ["CONSUMERS", "orders_stage"]

QUEUE = "demo_orders"
MESSAGES = 5_000
SEND_BATCH = 100
CONSUMERS = 4
READ_BATCH = 50
LEASE_SECONDS = 30
# The slow consumer's lease: short, so that the tour need not wait 30 s to see it expire.
SHORT_LEASE_SECONDS = 1
OVERSLEEP_SECONDS = 0.5
CONSUME_TIMEOUT_SECONDS = 60.0
IDLE_POLL_SECONDS = 0.02


@dataclass
class Acks:
    """What the consumers acked, shared between their threads."""

    expected: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    acked: list[int] = field(default_factory=list)
    unique: set[int] = field(default_factory=set)
    # msg_id -> (consumer, delivery) of every message acked on a second or later delivery.
    redelivered: dict[int, tuple[int, int]] = field(default_factory=dict)
    # When the last message acked on its first delivery was acked: the end of the steady flow,
    # before the wait for the overslept lease.
    first_deliveries_done_at: float = 0.0
    slow_msg_id: int | None = None
    refused: str | None = None
    taken_over: threading.Event = field(default_factory=threading.Event)

    def record(self, consumer: int, batch: list[Message], acked_ids: list[int]) -> None:
        done = set(acked_ids)
        with self.lock:
            self.acked.extend(acked_ids)
            self.unique.update(acked_ids)
            for message in batch:
                if message.msg_id not in done:
                    continue
                if message.read_ct > 1:
                    self.redelivered[message.msg_id] = (consumer, message.read_ct)
                else:
                    self.first_deliveries_done_at = time.perf_counter()
            if self.slow_msg_id in done:
                self.taken_over.set()

    def complete(self) -> bool:
        with self.lock:
            return len(self.unique) >= self.expected

    @property
    def duplicates(self) -> int:
        return len(self.acked) - len(self.unique)


@dataclass
class Ledger:
    """What the stage sent and what its consumers acked: the books it balances."""

    sent_ids: list[int] = field(default_factory=list)
    acks: Acks = field(default_factory=lambda: Acks(MESSAGES))


def orders_stage(demo: Demo) -> None:
    ledger = Ledger()
    set_up(demo)
    produce(demo, ledger)
    consume(demo, ledger)
    report(demo, ledger)


# -- stages ---------------------------------------------------------------------------------------


def set_up(demo: Demo) -> None:
    result = demo.broker.install()
    if result.changed:
        demo.say("schema", f"installed version {result.version}")
    else:
        demo.say("schema", f"version {result.version}, already installed")
    queue = demo.broker.create_queue(QUEUE)
    purged = queue.purge()
    leftover = f" (purged {purged:,} messages left from an earlier run)" if purged else ""
    demo.say("queue", f"{QUEUE}{leftover}")


def produce(demo: Demo, ledger: Ledger) -> None:
    queue = demo.broker.queue(QUEUE)
    started = time.perf_counter()
    for first in range(0, MESSAGES, SEND_BATCH):
        orders = [_order(n) for n in range(first, min(first + SEND_BATCH, MESSAGES))]
        ledger.sent_ids.extend(queue.send_many(orders))
        demo.progress("produce", f"{len(ledger.sent_ids):,} / {MESSAGES:,}")
    elapsed = time.perf_counter() - started
    demo.end_progress()
    batches = -(-MESSAGES // SEND_BATCH)
    demo.say(
        "produce",
        f"sent {len(ledger.sent_ids):,} orders in {batches} batches of {SEND_BATCH} (send_many): "
        f"{elapsed:.2f} s, {len(ledger.sent_ids) / elapsed:,.0f} msg/s",
    )


def consume(demo: Demo, ledger: Ledger) -> None:
    demo.say(
        "consume",
        f"{CONSUMERS} consumers: read_many(qty={READ_BATCH}, vt={LEASE_SECONDS}) + ack_many (fenced acks)",
    )
    acks = ledger.acks
    deadline = time.monotonic() + CONSUME_TIMEOUT_SECONDS
    started = time.perf_counter()
    with ThreadPoolExecutor(CONSUMERS, thread_name_prefix="consumer") as pool:
        # Consumer 1 is the slow one: it oversleeps a lease before joining the others.
        futures = [
            pool.submit(_consumer, demo.broker, acks, n, n == 1, deadline) for n in range(1, CONSUMERS + 1)
        ]
        while not all(f.done() for f in futures):
            demo.progress("consume", f"{len(acks.unique):,} / {MESSAGES:,}")
            time.sleep(0.1)
        for future in futures:
            future.result()
    elapsed = time.perf_counter() - started
    demo.end_progress()

    _tell_takeover(demo, acks)
    steady = len(acks.unique) - len(acks.redelivered)
    steady_seconds = acks.first_deliveries_done_at - started
    demo.say(
        "",
        f"acked {len(acks.unique):,} messages in {elapsed:.2f} s; the {steady:,} acked on first delivery "
        f"took {steady_seconds:.2f} s: {steady / steady_seconds:,.0f} msg/s",
    )


def report(demo: Demo, ledger: Ledger) -> None:
    demo.say("metrics", "(the same table: pgbroker metrics)")
    for line in metrics_table([demo.broker.metrics(QUEUE)]).splitlines():
        demo.say("", line)
    # Counted straight from the tables, not through pgbroker, so the check trusts nothing it checks.
    count = sql.SQL(_sql.queries("demo")["demo_orders_balance"]).format(
        archive=sql.Identifier(f"a_{QUEUE}"), queue=sql.Identifier(f"q_{QUEUE}")
    )
    with demo.broker.connection() as conn:
        row = conn.execute(count, [ledger.sent_ids]).fetchone()
    assert row is not None
    archived, queued = int(row[0]), int(row[1])
    sent, duplicates = len(ledger.sent_ids), ledger.acks.duplicates
    balanced = sent == archived + queued and duplicates == 0 and ledger.acks.unique == set(ledger.sent_ids)
    demo.ok = demo.ok and balanced
    demo.say(
        "check",
        f"sent {sent:,} = archived {archived:,} + still queued {queued:,}; duplicates {duplicates}: "
        + ("OK" if balanced else "FAILED"),
    )


def _tell_takeover(demo: Demo, acks: Acks) -> None:
    taker = acks.redelivered.get(acks.slow_msg_id) if acks.slow_msg_id is not None else None
    if acks.slow_msg_id is not None:
        stalled = SHORT_LEASE_SECONDS + OVERSLEEP_SECONDS
        demo.say(
            "",
            f"consumer 1 read message {acks.slow_msg_id} on a {SHORT_LEASE_SECONDS} s lease, "
            f"then stalled for {stalled:.1f} s",
        )
    if taker is not None:
        consumer, delivery = taker
        demo.say("", f"consumer {consumer} got it when the lease ran out (delivery {delivery}) and acked it")
    if acks.refused is not None:
        demo.say("", "consumer 1's late ack raised StaleReceipt, and changed nothing:")
        demo.say("", f"  {acks.refused}")
    if taker is None or acks.refused is None:
        demo.say("", "FAILED: expected another consumer to take the message over and the late ack to fail")
        demo.ok = False


# -- consumers ------------------------------------------------------------------------------------


def _consumer(broker: Broker, acks: Acks, number: int, slow: bool, deadline: float) -> None:
    queue = broker.queue(QUEUE)
    if slow:
        _oversleep_a_lease(queue, acks)
    while not acks.complete():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"consumer {number}: only {len(acks.unique):,} of {MESSAGES:,} messages acked "
                f"after {CONSUME_TIMEOUT_SECONDS:.0f} s"
            )
        batch = queue.read_many(READ_BATCH, vt=LEASE_SECONDS)
        if not batch:
            time.sleep(IDLE_POLL_SECONDS)
            continue
        acks.record(number, batch, queue.ack_many(batch))


def _oversleep_a_lease(queue: Queue, acks: Acks) -> None:
    """Hold one message past its lease, as a stalled consumer would; its late ack must fail."""
    message = queue.read(vt=SHORT_LEASE_SECONDS)
    if message is None:
        return
    acks.slow_msg_id = message.msg_id
    time.sleep(SHORT_LEASE_SECONDS + OVERSLEEP_SECONDS)
    try:
        queue.ack(message)
    except StaleReceipt as exc:
        acks.refused = exc.message
    else:
        acks.record(1, [message], [message.msg_id])
        return
    # Stay away until another consumer has the message, so the takeover is someone else's.
    acks.taken_over.wait(CONSUME_TIMEOUT_SECONDS)


def _order(n: int) -> dict[str, object]:
    return {"order_id": n + 1, "customer": f"customer-{n % 97:02d}", "total_cents": 500 + (n * 37) % 9_500}
