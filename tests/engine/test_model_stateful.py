"""A real queue against an in-memory model, driven by Hypothesis through random operation sequences.

The model knows which messages exist, which are visible, their read_ct, which are archived, and
which receipt (if any) currently holds each message. Timing never matters: a lease is either
vt=0 (it ends the moment it starts, so the message is visible again and its receipt is already
stale) or vt=3600 (held for the whole test), and delayed sends use 3600 seconds.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

import psycopg
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg import sql

from pgbroker import Broker, Queue, Receipt, StaleReceipt

HOLD = 3600
INDEX = st.integers(min_value=0, max_value=10_000)
# NUL cannot be stored in jsonb; test_bad_input covers it.
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=5)
PAYLOAD = st.one_of(st.integers(), TEXT, st.dictionaries(TEXT, st.booleans(), max_size=2))


@dataclass
class Entry:
    read_ct: int = 0
    visible: bool = True
    holder: Receipt | None = None  # the receipt that can ack, nack or extend it now


class QueueMachine(RuleBasedStateMachine):
    """One example: a fresh queue, a model, and random operations on both."""

    broker: ClassVar[Broker | None] = None
    conn: ClassVar[psycopg.Connection[Any] | None] = None

    def __init__(self) -> None:
        super().__init__()
        assert self.broker is not None, "set by test_queue_behaves_like_its_model"
        self.queue: Queue = self.broker.create_queue(f"model_{uuid.uuid4().hex[:12]}")
        self.entries: dict[int, Entry] = {}
        self.archived: set[int] = set()
        self.sent: list[int] = []
        self.receipts: list[Receipt] = []

    def teardown(self) -> None:
        assert self.broker is not None
        self.broker.drop_queue(self.queue.name)

    # -- helpers ------------------------------------------------------------------------------

    def visible(self) -> list[int]:
        return sorted(msg_id for msg_id, entry in self.entries.items() if entry.visible)

    def holds(self, receipt: Receipt) -> bool:
        entry = self.entries.get(receipt.msg_id)
        return entry is not None and entry.holder == receipt

    def pick_receipt(self, index: int) -> Receipt:
        return self.receipts[index % len(self.receipts)]

    def pick_sent(self, index: int) -> int:
        return self.sent[index % len(self.sent)]

    def record_sent(self, ids: list[int], *, visible: bool) -> None:
        assert all(msg_id > max(self.sent, default=0) for msg_id in ids)
        assert ids == sorted(ids)
        for msg_id in ids:
            self.entries[msg_id] = Entry(visible=visible)
            self.sent.append(msg_id)

    # -- sending ------------------------------------------------------------------------------

    @rule(payload=PAYLOAD)
    def send(self, payload: Any) -> None:
        self.record_sent([self.queue.send(payload)], visible=True)

    @rule(payloads=st.lists(PAYLOAD, min_size=1, max_size=4))
    def send_many(self, payloads: list[Any]) -> None:
        ids = self.queue.send_many(payloads)
        assert len(ids) == len(payloads)
        self.record_sent(ids, visible=True)

    @rule(payload=PAYLOAD)
    def send_delayed(self, payload: Any) -> None:
        self.record_sent([self.queue.send(payload, delay=HOLD)], visible=False)

    # -- reading ------------------------------------------------------------------------------

    @rule(qty=st.integers(min_value=0, max_value=4), hold=st.booleans())
    def read(self, qty: int, hold: bool) -> None:
        expected = self.visible()[:qty]
        got = self.queue.read_many(qty, vt=HOLD if hold else 0)
        assert [m.msg_id for m in got] == expected
        for message in got:
            entry = self.entries[message.msg_id]
            entry.read_ct += 1
            assert message.read_ct == entry.read_ct
            assert message.receipt is not None
            assert (message.receipt.msg_id, message.receipt.read_ct) == (message.msg_id, entry.read_ct)
            entry.visible = not hold
            entry.holder = message.receipt if hold else None
            self.receipts.append(message.receipt)

    @rule(qty=st.integers(min_value=0, max_value=3))
    def pop(self, qty: int) -> None:
        expected = self.visible()[:qty]
        got = self.queue.pop_many(qty)
        assert [(m.msg_id, m.read_ct) for m in got] == [(i, self.entries[i].read_ct) for i in expected]
        for msg_id in expected:
            del self.entries[msg_id]

    # -- fenced -------------------------------------------------------------------------------

    @precondition(lambda self: self.receipts)
    @rule(index=INDEX, archive=st.booleans())
    def ack(self, index: int, archive: bool) -> None:
        receipt = self.pick_receipt(index)
        if self.holds(receipt):
            self.queue.ack(receipt, archive=archive)
            del self.entries[receipt.msg_id]
            if archive:
                self.archived.add(receipt.msg_id)
        else:
            try:
                self.queue.ack(receipt, archive=archive)
            except StaleReceipt:
                return
            raise AssertionError(f"stale receipt {receipt} acked message {receipt.msg_id}")

    @precondition(lambda self: self.receipts)
    @rule(indexes=st.lists(INDEX, min_size=0, max_size=4))
    def ack_many(self, indexes: list[int]) -> None:
        receipts = [self.pick_receipt(i) for i in indexes]
        expected = sorted({r.msg_id for r in receipts if self.holds(r)})
        assert self.queue.ack_many(receipts) == expected
        for msg_id in expected:
            del self.entries[msg_id]
            self.archived.add(msg_id)

    @precondition(lambda self: self.receipts)
    @rule(index=INDEX, later=st.booleans())
    def nack(self, index: int, later: bool) -> None:
        receipt = self.pick_receipt(index)
        if self.holds(receipt):
            self.queue.nack(receipt, delay=HOLD if later else 0)
            entry = self.entries[receipt.msg_id]
            entry.visible = not later
            entry.holder = None
        else:
            try:
                self.queue.nack(receipt)
            except StaleReceipt:
                return
            raise AssertionError(f"stale receipt {receipt} nacked message {receipt.msg_id}")

    @precondition(lambda self: self.receipts)
    @rule(indexes=st.lists(INDEX, min_size=1, max_size=3))
    def nack_many(self, indexes: list[int]) -> None:
        receipts = [self.pick_receipt(i) for i in indexes]
        expected = sorted({r.msg_id for r in receipts if self.holds(r)})
        assert self.queue.nack_many(receipts) == expected
        for msg_id in expected:
            self.entries[msg_id].visible = True
            self.entries[msg_id].holder = None

    @precondition(lambda self: self.receipts)
    @rule(index=INDEX, hold=st.booleans())
    def extend(self, index: int, hold: bool) -> None:
        receipt = self.pick_receipt(index)
        if self.holds(receipt):
            renewed = self.queue.extend(receipt, vt=HOLD if hold else 0)
            assert (renewed.msg_id, renewed.read_ct) == (receipt.msg_id, receipt.read_ct)
            assert renewed != receipt
            entry = self.entries[receipt.msg_id]
            entry.visible = not hold
            entry.holder = renewed if hold else None
            self.receipts.append(renewed)
        else:
            try:
                self.queue.extend(receipt, vt=HOLD)
            except StaleReceipt:
                return
            raise AssertionError(f"stale receipt {receipt} extended message {receipt.msg_id}")

    @precondition(lambda self: self.receipts)
    @rule(indexes=st.lists(INDEX, min_size=1, max_size=3))
    def extend_many(self, indexes: list[int]) -> None:
        receipts = [self.pick_receipt(i) for i in indexes]
        held = {r.msg_id for r in receipts if self.holds(r)}
        renewed = self.queue.extend_many(receipts, vt=HOLD)
        assert sorted(renewed) == sorted(held)
        for msg_id, receipt in renewed.items():
            self.entries[msg_id].holder = receipt
            self.receipts.append(receipt)

    # -- unfenced, by msg_id ------------------------------------------------------------------

    @precondition(lambda self: self.sent)
    @rule(index=INDEX, hold=st.booleans())
    def set_vt(self, index: int, hold: bool) -> None:
        msg_id = self.pick_sent(index)
        changed = self.queue.set_vt(msg_id, HOLD if hold else 0)
        entry = self.entries.get(msg_id)
        if entry is None:
            assert changed is None
            return
        assert changed is not None
        assert (changed.msg_id, changed.read_ct, changed.receipt) == (msg_id, entry.read_ct, None)
        entry.visible = not hold
        entry.holder = None  # the lease changed under any receipt

    @precondition(lambda self: self.sent)
    @rule(index=INDEX)
    def archive(self, index: int) -> None:
        msg_id = self.pick_sent(index)
        assert self.queue.archive(msg_id) == (msg_id in self.entries)
        if self.entries.pop(msg_id, None) is not None:
            self.archived.add(msg_id)

    @precondition(lambda self: self.sent)
    @rule(index=INDEX)
    def delete(self, index: int) -> None:
        msg_id = self.pick_sent(index)
        assert self.queue.delete(msg_id) == (msg_id in self.entries)
        self.entries.pop(msg_id, None)

    @rule()
    def purge(self) -> None:
        assert self.queue.purge() == len(self.entries)
        self.entries.clear()

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def queue_matches_the_model(self) -> None:
        assert self.conn is not None
        table = sql.Identifier(f"q_{self.queue.name}")
        rows = self.conn.execute(
            sql.SQL("SELECT msg_id, read_ct, vt <= clock_timestamp() FROM pgmq.{} ORDER BY msg_id").format(
                table
            )
        ).fetchall()
        assert rows == [(i, e.read_ct, e.visible) for i, e in sorted(self.entries.items())]

    @invariant()
    def archive_matches_the_model(self) -> None:
        assert self.conn is not None
        table = sql.Identifier(f"a_{self.queue.name}")
        rows = self.conn.execute(
            sql.SQL("SELECT msg_id FROM pgmq.{} ORDER BY msg_id").format(table)
        ).fetchall()
        assert [row[0] for row in rows] == sorted(self.archived)


def test_queue_behaves_like_its_model(dsn: str) -> None:
    with Broker(dsn, max_connections=2) as broker, psycopg.connect(dsn, autocommit=True) as conn:
        QueueMachine.broker = broker
        QueueMachine.conn = conn
        try:
            run_state_machine_as_test(
                QueueMachine,
                settings=settings(max_examples=30, stateful_step_count=25, deadline=None),
            )
        finally:
            QueueMachine.broker = None
            QueueMachine.conn = None
