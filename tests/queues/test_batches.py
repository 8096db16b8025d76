"""A batch of sends travels as one JSON array per column (pgbroker._jsonb_array, 30_sends.sql):
what is read back is what was sent, message for message, in order, a JSON null body staying a
body and a missing header staying missing, for queues and streams alike."""

from __future__ import annotations

from typing import Any

import psycopg

from pgbroker import Broker
from pgbroker.streams import Stream

BODIES: list[Any] = [None, {"a": 1}, 'text with "quotes", commas and \\ backslashes', [1, 2.5, None], 0, {}]
HEADERS: list[dict[str, Any] | None] = [None, {"h": "1"}, None, {"x": [1]}, {}, None]


def test_a_queue_batch_reads_back_as_sent(broker: Broker, conn: psycopg.Connection[Any]) -> None:
    queue = broker.create_queue("jobs")
    many = [{"n": i} for i in range(500)]
    ids = queue.send_many(BODIES + many, headers=HEADERS + [None] * len(many))
    stored = conn.execute("SELECT headers::text FROM pgmq.q_jobs ORDER BY msg_id LIMIT %s", [len(HEADERS)])
    assert [r[0] for r in stored] == [None, '{"h": "1"}', None, '{"x": [1]}', "{}", None]
    read = queue.read_many(len(ids))
    assert [m.msg_id for m in read] == ids
    assert [m.message for m in read] == BODIES + many
    assert [m.headers for m in read][: len(HEADERS)] == HEADERS


def test_a_stream_batch_reads_back_as_sent(dsn: str, conn: psycopg.Connection[Any]) -> None:
    keys = ["k", None, "k", "j", None, "k"]
    with Broker(dsn, max_connections=2) as broker:
        stream = Stream(broker, "clicks")
        stream.create(partitions=1)
        stream.create_group("g", start="start")
        ids = stream.send_many(BODIES, headers=HEADERS, keys=keys)
        batch = stream.consumer("g").read(100)
    stored = conn.execute("SELECT headers::text FROM pgbroker.s_clicks ORDER BY id").fetchall()
    assert [r[0] for r in stored] == [None, '{"h": "1"}', None, '{"x": [1]}', "{}", None]
    assert [m.id for m in batch] == ids
    assert [(m.message, m.headers, m.key) for m in batch] == list(zip(BODIES, HEADERS, keys, strict=True))
