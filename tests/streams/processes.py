"""Producer and consumer processes for the stream concurrency tests: raw SQL, one connection each.

A producer records what it sent in table ``sent`` in the transaction that sends it, and a consumer
records what it handled in table ``handled`` in the transaction that acks it, so the two tables
say exactly what was committed and what was acknowledged, whatever gets killed.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgbroker.runtime._app import serve
from pgbroker.runtime._stream_worker import StreamWorker
from pgbroker.streams._records import StreamMessage
from tests.support.streams import Batch

TABLES = """
CREATE TABLE sent (id bigint PRIMARY KEY, producer int);
-- seq: the order rows were recorded in (a ctid is not: concurrent backends fill different pages).
CREATE TABLE handled (group_name text, id bigint, consumer text, seq bigserial);
CREATE TABLE delivered (group_name text, id bigint, consumer text);
"""


def produce(
    dsn: str, stream: str, producer: int, transactions: int, per_transaction: int, hold: float
) -> None:
    """Send in transactions, some of them held open up to ``hold`` seconds after their send, so
    that they commit after others that sent later."""
    rng = random.Random(producer)
    with psycopg.connect(dsn) as conn:
        for t in range(transactions):
            with conn.transaction():
                msgs = [Jsonb({"p": producer, "t": t, "i": i}) for i in range(per_transaction)]
                keys = [f"key-{producer}-{i % 3}" for i in range(per_transaction)]
                conn.execute(
                    "INSERT INTO sent SELECT i, %s"
                    " FROM pgbroker.stream_send_many(%s, %s::jsonb[], NULL, %s) i",
                    (producer, stream, msgs, keys),
                )
                if rng.random() < 0.15:
                    time.sleep(rng.uniform(0.2, hold))
            time.sleep(rng.uniform(0, 0.02))


def consume(
    dsn: str,
    stream: str,
    group: str,
    consumer: str,
    expected: int,
    deadline: float,
    lease: int = 30,
    qty: int = 50,
) -> None:
    """Read, record and ack batches in one transaction each, until the group handled ``expected``
    messages or the deadline passed."""
    with psycopg.connect(dsn) as conn:
        while time.monotonic() < deadline:
            with conn.transaction():
                batch = Batch(
                    conn.execute(
                        "SELECT * FROM pgbroker.stream_read(%s, %s, %s, %s, %s)",
                        (stream, group, consumer, qty, lease),
                    ).fetchall()
                )
                if batch.rows:
                    conn.execute(
                        "INSERT INTO handled SELECT %s, i, %s FROM unnest(%s::bigint[]) i",
                        (group, consumer, batch.ids),
                    )
                    parts, epochs, last = batch.ack_args()
                    conn.execute(
                        "SELECT pgbroker.stream_ack(%s, %s, %s, %s, %s, %s)",
                        (stream, group, consumer, parts, epochs, last),
                    )
                done = conn.execute("SELECT count(*) FROM handled WHERE group_name = %s", (group,)).fetchone()
            if done is not None and done[0] >= expected:
                return
            if not batch.rows:
                time.sleep(0.02)


def take_a_batch_and_hang(dsn: str, stream: str, group: str, consumer: str, lease: int) -> None:
    """Read until a batch comes, record it as delivered, and never ack it (to be SIGKILLed)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            rows: list[Any] = conn.execute(
                "SELECT * FROM pgbroker.stream_read(%s, %s, %s, 50, %s)", (stream, group, consumer, lease)
            ).fetchall()
            if rows:
                conn.execute(
                    "INSERT INTO delivered SELECT %s, i, %s FROM unnest(%s::bigint[]) i",
                    (group, consumer, [r[1] for r in rows]),
                )
                time.sleep(3600)
            time.sleep(0.01)


def stream_worker(dsn: str, stream: str, group: str, consumer: str, lease: int) -> None:
    """A StreamWorker (the runtime, not raw SQL) recording what it handles, until killed."""
    lock = threading.Lock()
    with psycopg.connect(dsn, autocommit=True) as conn:

        def handle(message: StreamMessage) -> None:
            with lock:
                conn.execute("INSERT INTO handled VALUES (%s, %s, %s)", (group, message.id, consumer))

        worker = StreamWorker(stream, group, handle, lease=lease, poll_max=0.2, consumer=consumer)
        asyncio.run(serve([worker], dsn=dsn, handle_signals=False))
