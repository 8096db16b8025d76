"""The JSON decoder of the connections pgbroker opens (pgbroker._db.json_decode): orjson where it
can, the standard library where orjson refuses the text; every value reads back as json.loads
reads it, and connections the application passes in keep their own decoder."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest

from pgbroker import AsyncBroker, Broker
from pgbroker._db import json_decode

# Texts jsonb keeps that orjson alone reads otherwise (beyond 64 bits: a float; beyond a double:
# refused), 64-bit edges it reads right, and ordinary ones.
VALUES = [
    '{"big": 1180591620717411303424, "neg": -9223372036854775809, "u": 18446744073709551616}',
    '{"huge": 1e400, "tiny": -1e400}',
    '{"max": 18446744073709551615, "min": -9223372036854775808, "id": "12345678901234567890"}',
    '{"n": 1, "f": 0.1, "s": "caf\\u00e9", "l": [true, false, null], "o": {}}',
]


@pytest.mark.parametrize("text", VALUES)
def test_loads_reads_what_json_loads_reads(text: str) -> None:
    for data in (text, text.encode()):
        got, expected = json_decode.loads(data), json.loads(text)
        assert got == expected
        assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in expected.items()}


def counting_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """json_decode.loads, counting its calls (what the pools pgbroker opens register)."""
    calls: list[int] = []
    fast = json_decode.loads

    def loads(data: str | bytes) -> Any:
        calls.append(1)
        return fast(data)

    monkeypatch.setattr(json_decode, "loads", loads)
    return calls


def test_a_broker_decodes_with_it_and_a_connection_passed_in_keeps_its_own(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = counting_loads(monkeypatch)
    body = json.loads(VALUES[0])
    with Broker(dsn, max_connections=2) as broker:
        queue = broker.create_queue("jobs")
        queue.send(body)
        message = queue.read()
        assert message is not None
        assert message.message == body
    assert calls
    calls.clear()
    with psycopg.connect(dsn, autocommit=True) as conn:
        queue = Broker(connection=conn).queue("jobs")
        queue.send(body)
        message = queue.read()
        assert message is not None
        assert message.message == body
    assert not calls


def test_an_async_broker_decodes_with_it(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counting_loads(monkeypatch)
    with psycopg.connect(dsn, autocommit=True) as conn:  # (pgbroker's send refuses 1e400: pgmq's takes it)
        conn.execute("SELECT pgmq.create('jobs')")
        conn.execute("SELECT pgmq.send('jobs', %s::jsonb)", (VALUES[1],))
        # jsonb keeps 1e400 as a numeric: its text is 1 and 400 zeros, read as an int.
        stored = conn.execute("SELECT message::text FROM pgmq.q_jobs").fetchone()
        assert stored is not None

    async def read_back() -> Any:
        async with AsyncBroker(dsn, max_connections=2) as broker:
            message = await broker.queue("jobs").read()
            assert message is not None
            return message.message

    assert asyncio.run(read_back()) == json.loads(stored[0])
    assert calls
