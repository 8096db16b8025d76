"""Scenario (e): what pgbroker's Python client costs over raw SQL, on pgbroker's database.

One process, one connection at a time, calls in a loop for a fixed time. Three ways of doing the
same operation: raw SQL (the shortest statement a hand-written client would send, prepared);
the client's own SQL (the statement pgbroker.queues._queries builds, run on a raw connection, prepared);
and the client (Broker/Queue: pool checkout, JSON encoding, Message objects). The first pair
separates the cost of the statement the client chose from the cost of the Python layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.harness import PGBROKER, Bench, Conn, Row, ScenarioResult, connect, json_payload
from pgbroker import Broker
from pgbroker.queues import _queries as q
from pgbroker.queues._query import Query

TITLE = "Client overhead: pgbroker's Python client against raw SQL"
RAW = "raw SQL"
CLIENT_SQL = "client's SQL, raw"
CLIENT = "client"
COLUMNS = [RAW, CLIENT_SQL, CLIENT]
RATIO = (CLIENT, RAW)
PAYLOAD_TEXT = json_payload(22)
PAYLOAD = {"p": "x" * 14}  # the same 22 bytes once encoded without spaces


def _loop(seconds: float, op: Callable[[], int]) -> tuple[float, float]:
    """Run ``op`` until ``seconds`` pass; (messages a second, mean ms per call)."""
    messages = calls = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        messages += op()
        calls += 1
    elapsed = time.perf_counter() - t0
    return messages / elapsed, elapsed * 1000 / max(calls, 1)


def _run_query(conn: Conn, query: Query[Any]) -> Any:
    cur = conn.execute(query.sql, query.params)
    return query.decode(cur.fetchall() if cur.description else [])


def run(bench: Bench, result: ScenarioResult) -> None:
    config = bench.config
    system = bench.systems[PGBROKER]
    seconds = config.client_seconds
    result.description = (
        f"One process, {seconds:g} s per operation and way; 22 B messages; reads start from a backlog of "
        f"{config.consume_prefill:,}; acks delete. '{RAW}': pgmq.send / send_batch, pgbroker.read + "
        f"pgbroker.ack, prepared. '{CLIENT_SQL}': the statements of pgbroker.queues._queries on a raw "
        f"connection, prepared. '{CLIENT}': Broker(dsn, max_connections=1) and its Queue methods. "
        "Ratio: client / raw SQL."
    )
    queue_name = bench.new_queue_name("client")
    bench.create_queue(system, queue_name)
    try:
        raw = connect(system.dsn, prepare=True)
        broker = Broker(system.dsn, max_connections=1)
        queue = broker.queue(queue_name)
        try:

            def raw_send() -> int:
                raw.execute("SELECT * FROM pgmq.send(%s, %s::jsonb)", [queue_name, PAYLOAD_TEXT]).fetchall()
                return 1

            def raw_send_many() -> int:
                raw.execute(
                    "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])", [queue_name, [PAYLOAD_TEXT] * 10]
                ).fetchall()
                return 10

            def raw_read_ack(n: int) -> Callable[[], int]:
                def op() -> int:
                    rows = raw.execute(
                        "SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers, receipt"
                        " FROM pgbroker.read(%s, 30, %s::integer)",
                        [queue_name, n],
                    ).fetchall()
                    if n == 1 and rows:
                        raw.execute("SELECT pgbroker.ack(%s, %s::text, false)", [queue_name, rows[0][7]])
                    elif rows:
                        raw.execute(
                            "SELECT * FROM pgbroker.ack(%s, %s::text[], false)",
                            [queue_name, [r[7] for r in rows]],
                        ).fetchall()
                    return len(rows)

                return op

            def sql_send() -> int:
                _run_query(raw, q.message_send_many(queue_name, [PAYLOAD]))
                return 1

            def sql_send_many() -> int:
                _run_query(raw, q.message_send_many(queue_name, [PAYLOAD] * 10))
                return 10

            def sql_read_ack(n: int) -> Callable[[], int]:
                def op() -> int:
                    found = _run_query(raw, q.message_read_many(queue_name, n))
                    if n == 1 and found:
                        _run_query(raw, q.message_ack(queue_name, found[0], archive=False))
                    elif found:
                        _run_query(raw, q.message_ack_many(queue_name, found, archive=False))
                    return len(found)

                return op

            def client_send() -> int:
                queue.send(PAYLOAD)
                return 1

            def client_send_many() -> int:
                queue.send_many([PAYLOAD] * 10)
                return 10

            def client_read_ack(n: int) -> Callable[[], int]:
                def op() -> int:
                    if n == 1:
                        one = queue.read()
                        if one is None:
                            return 0
                        queue.ack(one, archive=False)
                        return 1
                    found = queue.read_many(n)
                    if found:
                        queue.ack_many(found, archive=False)
                    return len(found)

                return op

            operations: list[tuple[str, bool, dict[str, Callable[[], int]]]] = [
                ("send x1", False, {RAW: raw_send, CLIENT_SQL: sql_send, CLIENT: client_send}),
                (
                    "send x10",
                    False,
                    {RAW: raw_send_many, CLIENT_SQL: sql_send_many, CLIENT: client_send_many},
                ),
                (
                    "read 1 + ack",
                    True,
                    {RAW: raw_read_ack(1), CLIENT_SQL: sql_read_ack(1), CLIENT: client_read_ack(1)},
                ),
                (
                    "read 10 + ack",
                    True,
                    {RAW: raw_read_ack(10), CLIENT_SQL: sql_read_ack(10), CLIENT: client_read_ack(10)},
                ),
            ]
            for label, needs_backlog, ways in operations:
                rates: dict[str, float | None] = {}
                per_call: dict[str, float | None] = {}
                for way, op in ways.items():
                    with bench.progress.step(f"(e) {way:18} {label}") as out:
                        if needs_backlog:
                            missing = config.consume_prefill - bench.queue_length(system, queue_name)
                            bench.fill_queue(system, queue_name, missing, PAYLOAD_TEXT)
                        bench.settle(system)
                        for _ in range(20):  # prepare statements, fill the pool
                            op()
                        rate, ms = _loop(seconds, op)
                        rates[way], per_call[way] = rate, ms
                        out.append(f"{rate:,.0f} msg/s, {ms:.3f} ms/call")
                result.rows.append(Row(label, "msg/s", rates, key=label))
                result.rows.append(Row(label, "ms/call", per_call, key=label))
        finally:
            broker.close()
            raw.close()
    finally:
        bench.drop_queue(system, queue_name)
