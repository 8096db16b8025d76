"""Scenario (c): what a read of 10 and its ack cost as the backlog grows, and with messages in flight.

One queue per system is grown through the states: empty (each read finds just the 10 messages sent
before it), each backlog given (a full run: 100,000, a million and 12 million waiting, the last
past where a generic plan of a read passes jit_above_cost), the largest plus 100k in flight (leased by a real
read with a one-hour visibility timeout: the oldest msg_ids, where pgmq's read starts), and then
10k more whose lease has run out (read with a visibility timeout of 0, as after a consumer
crash): messages due for redelivery, which pgbroker finds through its timed index.
Backlogs are built with INSERT ... SELECT (the rows a send stores) and settled with VACUUM ANALYZE.

In each state: milliseconds per read and per ack, timed over many calls on a connection with
prepared statements; and shared buffers touched per call, seen through auto_explain (see
bench.buffers): the whole call (top-level statement, which includes the function's internals)
and its main statement (the nested query that reads or acks, the one EXPLAIN would show).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, LiteralString

from psycopg import sql

from bench.buffers import PlanCapture, relation_blocks
from bench.harness import PGBROKER, PGMQ, Bench, Row, ScenarioResult, System, connect, json_payload

TITLE = "Backlog scaling: a read of 10 and its ack, by backlog"
COLUMNS = [PGMQ, PGBROKER]
PAYLOAD = json_payload(22)
BATCH = 10


@dataclass(frozen=True)
class State:
    waiting: int
    in_flight: int
    #: delivered messages whose lease has run out: due for redelivery
    due: int = 0

    @property
    def key(self) -> str:
        key = f"waiting-{self.waiting}"
        if self.in_flight:
            key += f"+in-flight-{self.in_flight}"
        if self.due:
            key += f"+due-{self.due}"
        return key

    @property
    def label(self) -> str:
        text = f"{self.waiting:,} waiting"
        if self.in_flight:
            text += f" + {self.in_flight:,} in flight"
        if self.due:
            text += f" + {self.due:,} due again"
        return text


@dataclass(frozen=True)
class _Calls:
    send: LiteralString
    read: LiteralString
    ack: LiteralString
    #: column of a read's row that the ack takes (msg_id or receipt)
    ack_key: int


def _calls(system: str) -> _Calls:
    if system == PGBROKER:
        return _Calls(
            "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])",
            "SELECT msg_id, receipt FROM pgbroker.read(%s, 30, 10)",
            "SELECT * FROM pgbroker.ack(%s, %s::text[], false)",
            1,
        )
    return _Calls(
        "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])",
        "SELECT msg_id FROM pgmq.read(%s, 30, 10)",
        "SELECT * FROM pgmq.delete(%s, %s::bigint[])",
        0,
    )


def states(waiting: tuple[int, ...], in_flight: int, due: int) -> list[State]:
    out = [State(n, 0) for n in sorted(set(waiting))]
    if in_flight:
        out.append(State(max(waiting), in_flight))
    if due:
        out.append(State(max(waiting), in_flight, due))
    return out


@dataclass
class _Measured:
    read_ms: float
    ack_ms: float
    read_call_buffers: float | None
    read_statement_buffers: float | None
    ack_call_buffers: float | None
    read_indexes: list[str]
    method: str


def run(bench: Bench, result: ScenarioResult) -> None:
    config = bench.config
    todo = states(config.backlog_waiting, config.backlog_in_flight, config.backlog_due)
    result.description = (
        f"{config.backlog_ops} timed read + ack cycles per state (prepared statements), then "
        f"{config.backlog_explain_ops} under auto_explain for buffers (median per call); "
        "22 B messages; acks delete. Buffers = shared hit + read. 'call' is the whole function call "
        "as the client sent it; 'statement' is the query inside the function that picks and leases "
        "the rows (pgmq: its WITH ... UPDATE; pgbroker: the same in pgmq.read)."
    )
    result.bar_metrics = ["buffers/read (call)", "ms/read", "ms/ack"]
    measured: dict[str, dict[State, _Measured]] = {key: {} for key in COLUMNS}
    for key in COLUMNS:
        system = bench.systems[key]
        queue = bench.new_queue_name("backlog")
        bench.create_queue(system, queue)
        try:
            present = leased = due = 0
            for state in todo:
                with bench.progress.step(f"(c) {key:8} build {state.label}") as out:
                    wanted = state.waiting + state.in_flight + state.due
                    bench.fill_queue(system, queue, wanted - present, PAYLOAD)
                    present = wanted
                    if state.in_flight > leased:
                        _lease(system, queue, state.in_flight - leased, 3600)
                        leased = state.in_flight
                    if state.due > due:
                        # A lease of 0 seconds has run out at once: as after a consumer crash.
                        _lease(system, queue, state.due - due, 0)
                        due = state.due
                    out.append(f"{bench.queue_length(system, queue):,} rows")
                with bench.progress.step(f"(c) {key:8} measure {state.label}") as out:
                    bench.settle(system)
                    m = _measure(bench, system, queue, state)
                    measured[key][state] = m
                    out.append(
                        f"read {m.read_ms:.2f} ms, ack {m.ack_ms:.2f} ms, buffers/read "
                        f"{_fmt(m.read_call_buffers)} (statement {_fmt(m.read_statement_buffers)})"
                    )
                # The measurement consumed a few messages; count them back in at the next fill.
                present = bench.queue_length(system, queue)
        finally:
            bench.drop_queue(system, queue)
    for state in todo:
        ms = {key: measured[key].get(state) for key in COLUMNS}

        def pick(attr: str, ms: dict[str, _Measured | None] = ms) -> dict[str, float | None]:
            return {k: (getattr(m, attr) if m is not None else None) for k, m in ms.items()}

        key = state.key
        result.rows.append(Row(state.label, "ms/read", pick("read_ms"), key=key))
        result.rows.append(Row(state.label, "ms/ack", pick("ack_ms"), key=key))
        result.rows.append(Row(state.label, "buffers/read (call)", pick("read_call_buffers"), key=key))
        result.rows.append(
            Row(state.label, "buffers/read (statement)", pick("read_statement_buffers"), key=key)
        )
        result.rows.append(Row(state.label, "buffers/ack (call)", pick("ack_call_buffers"), key=key))
        result.extra.setdefault("states", []).append(
            {
                "waiting": state.waiting,
                "in_flight": state.in_flight,
                "due": state.due,
                **{
                    name: (found.__dict__ if (found := measured[name].get(state)) is not None else None)
                    for name in COLUMNS
                },
            }
        )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _lease(system: System, queue: str, count: int, seconds: int) -> None:
    """Lease the ``count`` oldest visible messages for ``seconds`` with the system's own read."""
    with connect(system.dsn) as conn:
        conn.execute("SELECT count(*) FROM pgmq.read(%s, %s, %s)", [queue, seconds, count])
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(Bench.queue_table(queue)))


def _cycle(conn: Any, calls: _Calls, queue: str, refill: bool) -> tuple[float, float, int]:
    if refill:
        conn.execute(calls.send, [queue, [PAYLOAD] * BATCH]).fetchall()
    t0 = time.perf_counter()
    rows = conn.execute(calls.read, [queue]).fetchall()
    t1 = time.perf_counter()
    conn.execute(calls.ack, [queue, [row[calls.ack_key] for row in rows]]).fetchall()
    t2 = time.perf_counter()
    return (t1 - t0) * 1000, (t2 - t1) * 1000, len(rows)


def _measure(bench: Bench, system: System, queue: str, state: State) -> _Measured:
    config = bench.config
    calls = _calls(system.key)
    refill = state.waiting == 0
    read_ms: list[float] = []
    ack_ms: list[float] = []
    with connect(system.dsn, prepare=True) as conn:
        for _ in range(3):  # prepare and warm the caches
            _cycle(conn, calls, queue, refill)
        for _ in range(config.backlog_ops):
            r, a, n = _cycle(conn, calls, queue, refill)
            if n == 0:
                raise RuntimeError(f"{system.key}: the queue ran dry in state {state.label}")
            read_ms.append(r)
            ack_ms.append(a)
    read_call: list[int] = []
    read_statement: list[int] = []
    ack_call: list[int] = []
    indexes: list[str] = []
    method = "auto_explain"
    with connect(system.dsn, prepare=True) as conn:
        capture = PlanCapture(conn)
        if capture.enable():
            for i in range(3 + config.backlog_explain_ops):
                if refill:
                    conn.execute(calls.send, [queue, [PAYLOAD] * BATCH]).fetchall()
                read = capture.call(calls.read, [queue])
                ack = capture.call(calls.ack, [queue, [row[calls.ack_key] for row in read.rows]])
                if i < 3:
                    continue  # the first calls of a session also read the catalogs
                read_call.append(read.top.buffers)
                read_statement.append(read.main.buffers)
                ack_call.append(ack.top.buffers)
                indexes = sorted(set(read.main.indexes))
        else:
            # Only the whole read + ack cycle can be told apart this way; it lands in the
            # "call" column, and the method says so.
            method = "pg_statio_user_tables, blocks per read + ack cycle (no superuser for auto_explain)"
            for _ in range(3):
                _cycle(conn, calls, queue, refill)
            before = relation_blocks(conn)
            n = max(1, config.backlog_explain_ops)
            for _ in range(n):
                _cycle(conn, calls, queue, refill)
            read_call.append(round((relation_blocks(conn) - before) / n))
    return _Measured(
        read_ms=statistics.median(read_ms),
        ack_ms=statistics.median(ack_ms),
        read_call_buffers=statistics.median(read_call) if read_call else None,
        read_statement_buffers=statistics.median(read_statement) if read_statement else None,
        ack_call_buffers=statistics.median(ack_call) if ack_call else None,
        read_indexes=indexes,
        method=method,
    )
