"""pgbroker and the reference pgmq side by side: one call run on each, what it did (rows without
timestamps, or an error, and the notices), and the two compared; the state of their queues."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

Conn = psycopg.Connection[Any]


Params = Sequence[Any] | dict[str, Any] | None


Query = str | sql.SQL | sql.Composed


Q = "jobs"


# DETAIL of pgbroker's errors from functions of schema pgmq: its own code.
PGBROKER_CODE = re.compile(r"^pgbroker PB[0-9A-Z]{3}\b")


TIMESTAMPTZ = "timestamp with time zone"


# Derived from timestamps; compared only as "null or not".
AGE_COLUMNS = frozenset({"newest_msg_age_sec", "oldest_msg_age_sec"})


Notice = tuple[str, str, str]


@dataclass(frozen=True)
class Outcome:
    """What one call did: result columns (name, type name), rows without timestamps, or an error;
    and the notices and warnings it gave (level, SQLSTATE, text)."""

    columns: tuple[tuple[str, str], ...] = ()
    rows: tuple[tuple[Any, ...], ...] = ()
    sqlstate: str | None = None
    error: str = ""
    detail: str = ""
    notices: tuple[Notice, ...] = ()

    @property
    def failed(self) -> bool:
        return self.sqlstate is not None

    def ids(self) -> list[int]:
        return [int(row[0]) for row in self.rows]

    def sorted_rows(self) -> list[tuple[Any, ...]]:
        return sorted(self.rows, key=_row_key)


def _row_key(row: tuple[Any, ...]) -> str:
    return json.dumps(row, sort_keys=True, default=str)


def _type_names(conn: Conn, oids: list[int]) -> dict[int, str]:
    rows = conn.execute(
        "SELECT t.oid::int8, format_type(t.oid, NULL) FROM unnest(%s::oid[]) AS t(oid)", [oids]
    ).fetchall()
    return {int(oid): str(name) for oid, name in rows}


def run(conn: Conn, query: Query, params: Params = None) -> Outcome:
    """Execute ``query`` on ``conn`` (autocommit) and describe what happened."""
    notices: list[Notice] = []

    def collect(diag: psycopg.errors.Diagnostic) -> None:
        notices.append((diag.severity_nonlocalized or "", diag.sqlstate or "", diag.message_primary or ""))

    conn.add_notice_handler(collect)
    try:
        cur = conn.execute(query, params)
        if cur.description is None:
            return Outcome(notices=tuple(notices))
        rows = cur.fetchall()
        description = list(cur.description)
    except psycopg.Error as exc:
        return Outcome(
            sqlstate=exc.sqlstate or "?????",
            error=exc.diag.message_primary or str(exc).splitlines()[0],
            detail=exc.diag.message_detail or "",
            notices=tuple(notices),
        )
    finally:
        conn.remove_notice_handler(collect)
    names = _type_names(conn, [col.type_code for col in description])
    columns = tuple((col.name, names[col.type_code]) for col in description)
    keep = [i for i, (_, type_name) in enumerate(columns) if type_name != TIMESTAMPTZ]

    def value(row: tuple[Any, ...], i: int) -> Any:
        if columns[i][0] in AGE_COLUMNS:
            return "null" if row[i] is None else "set"
        return row[i]

    return Outcome(columns, tuple(tuple(value(row, i) for i in keep) for row in rows), notices=tuple(notices))


@dataclass
class Pair:
    """pgbroker (``a``) and the reference (``b``), called alike."""

    a: Conn
    b: Conn

    def both(self, query: Query, params: Params = None, *, parallel: bool = False) -> tuple[Outcome, Outcome]:
        """Run on pgbroker, then on the reference; at the same time with ``parallel`` (for waits)."""
        if not parallel:
            return run(self.a, query, params), run(self.b, query, params)
        with ThreadPoolExecutor(max_workers=2) as pool:
            a, b = pool.submit(run, self.a, query, params), pool.submit(run, self.b, query, params)
            return a.result(), b.result()

    def same(
        self,
        query: Query,
        params: Params = None,
        *,
        ordered: bool = True,
        parallel: bool = False,
    ) -> Outcome:
        """Run on both; both must succeed with the same columns and rows. Returns pgbroker's outcome.

        ``ordered=False`` compares rows as multisets, for results whose order the reference
        leaves unspecified (D5).
        """
        a, b = self.both(query, params, parallel=parallel)
        where = f"{query!r} {params!r}"
        assert not a.failed, (
            f"pgbroker failed where the reference did not: {a.error} ({a.sqlstate}) in {where}"
        )
        assert not b.failed, (
            f"the reference failed where pgbroker did not: {b.error} ({b.sqlstate}) in {where}"
        )
        assert a.columns == b.columns, f"result columns differ in {where}"
        if ordered:
            assert a.rows == b.rows, f"rows differ in {where}"
        else:
            assert a.sorted_rows() == b.sorted_rows(), f"rows differ in {where}"
        assert a.notices == b.notices, f"notices differ in {where}"
        return a

    def both_fail(self, query: Query, params: Params = None, *, reference: str) -> Outcome:
        """Both must raise the same error: SQLSTATE ``reference``, the same message, the same
        notices before it; pgbroker's with its own code in DETAIL. Returns pgbroker's outcome."""
        a, b = self.both(query, params)
        where = f"{query!r} {params!r}"
        assert b.sqlstate == reference, (
            f"reference: expected {reference}, got {b.sqlstate} {b.error or b.rows} in {where}"
        )
        assert (a.sqlstate, a.error) == (b.sqlstate, b.error), f"errors differ in {where}"
        assert a.notices == b.notices, f"notices differ in {where}"
        assert PGBROKER_CODE.match(a.detail), f"no pgbroker code in DETAIL {a.detail!r} in {where}"
        return a

    def deliberate(self, query: Query, params: Params = None, *, pgbroker: str) -> Outcome:
        """A documented difference: pgbroker raises ``pgbroker``; returns the reference's outcome."""
        a, b = self.both(query, params)
        assert a.sqlstate == pgbroker, f"pgbroker: expected {pgbroker}, got {a.sqlstate} {a.error or a.rows}"
        return b

    def assert_same_state(self) -> None:
        """The same queues, and the same rows in every queue and archive table (timestamps aside)."""
        sa, sb = database_state(self.a), database_state(self.b)
        assert sa["meta"] == sb["meta"], "pgmq.meta differs"
        assert sa["relations"] == sb["relations"], "queue tables differ"
        for name in sa["queues"]:
            assert sa["queues"][name] == sb["queues"][name], f"contents of queue {name!r} differ"


def queue_state(conn: Conn, queue: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of q_<queue> and a_<queue>, timestamps replaced by what they decide."""
    q = sql.Identifier(f"q_{queue.lower()}")
    a = sql.Identifier(f"a_{queue.lower()}")
    q_rows = conn.execute(
        sql.SQL(
            "SELECT msg_id, read_ct, message, headers, last_read_at IS NULL AS never_read,"
            " vt <= clock_timestamp() AS visible FROM pgmq.{} ORDER BY msg_id"
        ).format(q)
    ).fetchall()
    a_rows = conn.execute(
        sql.SQL(
            "SELECT msg_id, read_ct, message, headers, last_read_at IS NULL AS never_read,"
            " vt <= archived_at AS visible_when_archived FROM pgmq.{} ORDER BY msg_id"
        ).format(a)
    ).fetchall()
    return {"queue": q_rows, "archive": a_rows}


def database_state(conn: Conn) -> dict[str, Any]:
    meta = conn.execute(
        "SELECT queue_name, is_partitioned, is_unlogged FROM pgmq.meta ORDER BY queue_name"
    ).fetchall()
    relations = conn.execute(
        r"""
        SELECT relname, relkind, relpersistence FROM pg_class
        WHERE relnamespace = 'pgmq'::regnamespace AND relkind IN ('r', 'p', 'S')
          AND (relname LIKE 'q\_%' OR relname LIKE 'a\_%')
        ORDER BY relname
        """
    ).fetchall()
    queues = {str(name): queue_state(conn, str(name)) for name, _, _ in meta}
    return {"meta": meta, "relations": relations, "queues": queues}


@contextmanager
def connected_pair(dsns: tuple[str, str]) -> Iterator[Pair]:
    """Autocommit connections to (pgbroker DSN, reference DSN)."""
    ours, theirs = dsns
    with psycopg.connect(ours, autocommit=True) as a, psycopg.connect(theirs, autocommit=True) as b:
        yield Pair(a, b)


@contextmanager
def left_unchanged(pair: Pair) -> Iterator[Pair]:
    """``pair``, whose two databases must be as they were when the block ends."""
    before = database_state(pair.a), database_state(pair.b)
    yield pair
    assert (database_state(pair.a), database_state(pair.b)) == before


def jsonb_array(values: Sequence[Any]) -> list[Jsonb]:
    return [Jsonb(v) for v in values]


def create(pair: Pair, name: str = Q, function: str = "create") -> None:
    pair.same(
        sql.SQL("SELECT pgmq.{}(queue_name => %s)").format(sql.Identifier(function)),
        [name],
    )


def send_many(pair: Pair, msgs: Sequence[Any], name: str = Q) -> list[int]:
    return pair.same(
        "SELECT * FROM pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[])", [name, jsonb_array(msgs)]
    ).ids()
