"""Shared buffers touched by one call of a queue function, including the statements inside it.

EXPLAIN sees only the statement it is given, and both implementations do their work in
statements that PL/pgSQL runs with EXECUTE. auto_explain sees those too: with
``log_nested_statements`` it explains every statement a call runs, and with ``client_min_messages
= log`` its output comes back to this session as notices, so no server log has to be read.
Loading auto_explain needs a superuser. Without one, :func:`relation_blocks` is the fallback: the
blocks of the queue's relations that this backend fetched, from pg_statio_user_tables (flushed
with pg_stat_force_next_flush, PostgreSQL 15+), divided by the number of calls.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg

from bench.harness import Conn

_SETTINGS: tuple[LiteralString, ...] = (
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_buffers = on",
    "SET auto_explain.log_timing = off",
    "SET auto_explain.log_nested_statements = on",
    "SET auto_explain.log_format = json",
    "SET client_min_messages = log",
)


@dataclass
class StatementPlan:
    text: str
    #: shared hit + read of the statement (its top plan node, which includes every node below)
    buffers: int
    dirtied: int
    indexes: list[str] = field(default_factory=list)
    node_types: list[str] = field(default_factory=list)
    #: whether the server compiled the statement with JIT (its plan has a JIT section)
    jit: bool = False
    #: the most times one plan node ran (a node run once per row of another is rescanned)
    max_loops: int = 1


@dataclass
class CallPlans:
    #: the call as the client sent it: its buffers include everything the function did
    top: StatementPlan
    #: the statements run inside the call, in the order they finished
    nested: list[StatementPlan]
    rows: list[tuple[Any, ...]]

    @property
    def main(self) -> StatementPlan:
        """The nested statement that touched the most buffers: the read's or ack's own query.

        A statement that only calls another function (pgbroker's entry points call their route:
        SELECT * FROM pgbroker._route_read(...)) counts everything that function did, so it is
        passed over for the statements run inside.
        """
        own = [p for p in self.nested if p.node_types[:1] != ["Function Scan"]]
        return max(own, key=lambda p: p.buffers) if own else self.top


def _walk(plan: dict[str, Any], indexes: list[str], node_types: list[str], loops: list[int]) -> None:
    node_types.append(str(plan.get("Node Type", "")))
    loops.append(int(plan.get("Actual Loops", 1)))
    if "Index Name" in plan:
        indexes.append(str(plan["Index Name"]))
    for child in plan.get("Plans", []):
        _walk(child, indexes, node_types, loops)


def parse_plan(message: str) -> StatementPlan | None:
    """A StatementPlan from one auto_explain message ("duration: ... plan:\\n{json}")."""
    head, sep, body = message.partition("plan:\n")
    if not sep or not head.startswith("duration:"):
        return None
    doc = json.loads(body)
    plan = doc["Plan"]
    indexes: list[str] = []
    node_types: list[str] = []
    loops: list[int] = []
    _walk(plan, indexes, node_types, loops)
    return StatementPlan(
        text=str(doc.get("Query Text", "")),
        buffers=int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0)),
        dirtied=int(plan.get("Shared Dirtied Blocks", 0)),
        indexes=indexes,
        node_types=node_types,
        jit="JIT" in doc,
        max_loops=max(loops),
    )


class PlanCapture:
    """auto_explain on one connection; :meth:`call` runs a statement and returns every plan."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self._messages: list[str] = []
        conn.add_notice_handler(self._on_notice)

    def _on_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        if diag.message_primary:
            self._messages.append(diag.message_primary)

    def enable(self) -> bool:
        """Load and configure auto_explain; False when the session may not (not a superuser)."""
        try:
            self.conn.execute("LOAD 'auto_explain'")
        except psycopg.Error:
            return False
        for setting in _SETTINGS:
            self.conn.execute(setting)
        return True

    def call(self, query: LiteralString, params: Sequence[Any] | Mapping[str, Any]) -> CallPlans:
        self._messages.clear()
        rows = self.conn.execute(query, params).fetchall()
        plans = [p for p in (parse_plan(m) for m in self._messages) if p is not None]
        self._messages.clear()
        if not plans:
            raise RuntimeError("auto_explain reported no plan: is it loaded in this session?")
        # The top-level statement's executor ends last.
        return CallPlans(plans[-1], plans[:-1], rows)


_STATIO: LiteralString = """
SELECT coalesce(sum(heap_blks_hit + heap_blks_read + coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0)
                    + coalesce(toast_blks_hit, 0) + coalesce(toast_blks_read, 0)
                    + coalesce(tidx_blks_hit, 0) + coalesce(tidx_blks_read, 0)), 0)
FROM pg_statio_user_tables WHERE schemaname = 'pgmq'
"""


def relation_blocks(conn: Conn) -> int:
    """Blocks of schema pgmq's relations fetched so far (shared hit + read), this session's included.

    The session's own pending counters are flushed first, so that a difference taken around a
    series of calls counts them (other sessions' activity on pgmq, such as autovacuum, adds noise).
    """
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")  # the flush happens when the session goes idle after the previous one
    row = conn.execute(_STATIO).fetchone()
    return int(row[0]) if row else 0
