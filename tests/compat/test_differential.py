"""Differential tests: the same calls against pgbroker and against the reference pgmq 1.13 SQL.

Database A has pgbroker installed (``dsn``); database B, on the same server, has the reference
SQL from the ``pgmq`` wheel (``reference_dsn``, see ``tests/compat/reference.py``). Every test
runs one sequence of calls on both and requires the same outcome: for a call that succeeds, the
same result column names and type names in the same order (``cursor.description``), the same rows
and the same notices and warnings (level, SQLSTATE, text); for a call that fails, the same
SQLSTATE, the same message and the same notices before it. Afterwards the contents of
``pgmq.meta`` and of every ``q_``/``a_`` table must be the same. Timestamps are left out of every
comparison; what they decide (is a message visible now, was it ever read, are ages null) is
compared instead. pgbroker's own code for each failure rides in DETAIL (``pgbroker PB00n``): the
failing calls check that it is there.

The deliberate differences that remain are listed, with the reason for each, in
``DELIBERATE_DIFFERENCES`` (tests/compat/deliberate.py) and docs/compatibility.md; each is
asserted by a test named ``test_deliberate_*``, so none of them can hide a real difference or
quietly disappear. None is visible to pgmq's own regression tests.

pgbroker reads redelivered messages in exactly the reference's order only while at most 1000
timed messages are due at once; every sequence here stays far below that.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.types.json import Jsonb

from tests.compat.differential import (
    TIMESTAMPTZ,
    Conn,
    Outcome,
    Pair,
    Params,
    Q,
    connected_pair,
    create,
    database_state,
    jsonb_array,
    left_unchanged,
    queue_state,
    run,
    send_many,
)

PAST = datetime(2000, 1, 1, tzinfo=UTC)
FUTURE = datetime(2100, 1, 1, tzinfo=UTC)
LONG = 3600  # seconds: a vt or delay that cannot run out during a test

# -- the two databases side by side (tests/compat/differential.py) ----------------------------


def assert_ordered_by_msg_id(outcome: Outcome) -> None:
    """D5: pgbroker returns message rows in msg_id order."""
    assert outcome.ids() == sorted(outcome.ids())


@pytest.fixture
def pair(dsn: str, reference_dsn: str) -> Iterator[Pair]:
    """A fresh pgbroker database and a fresh reference database."""
    with connected_pair((dsn, reference_dsn)) as fresh:
        yield fresh


@pytest.fixture(scope="module")
def _module_pair(module_dsns: tuple[str, str]) -> Iterator[Pair]:
    with connected_pair(module_dsns) as pair:
        yield pair


@pytest.fixture
def scratch(_module_pair: Pair) -> Pair:
    """The pair of databases shared by this module's tests, for a test that uses only queues of
    its own (named uniquely) and compares only them."""
    return _module_pair


@pytest.fixture
def unchanged(_module_pair: Pair) -> Iterator[Pair]:
    """A pair of databases shared by this module's tests that must change neither of them."""
    with left_unchanged(_module_pair) as pair:
        yield pair


# -- SQL of the calls, as the pgmq clients write them (named arguments) ------------------------


# (argument name, cast, value) of one argument of a call in named notation.
Arg = tuple[str, str, Any]


def named_call(function: str, args: Sequence[Arg], *, rows: bool = True) -> tuple[sql.Composed, list[Any]]:
    """``SELECT * FROM pgmq.<function>(name => %s::cast, ...)`` (``SELECT pgmq.f(...)`` for scalars)."""
    arguments = sql.SQL(", ").join(
        sql.SQL("{} => %s{}").format(sql.Identifier(name), sql.SQL(cast)) for name, cast, _ in args
    )
    template = sql.SQL("SELECT * FROM pgmq.{}({})" if rows else "SELECT pgmq.{}({})")
    return template.format(sql.Identifier(function), arguments), [value for _, _, value in args]


def send(pair: Pair, msg: Any, name: str = Q) -> int:
    ids = pair.same("SELECT * FROM pgmq.send(queue_name => %s, msg => %s)", [name, Jsonb(msg)]).ids()
    assert len(ids) == 1
    return ids[0]


def read(pair: Pair, vt: int, qty: int, name: str = Q) -> Outcome:
    outcome = pair.same(
        "SELECT * FROM pgmq.read(queue_name => %s, vt => %s::integer, qty => %s::integer)",
        [name, vt, qty],
        ordered=False,
    )
    assert_ordered_by_msg_id(outcome)
    return outcome


MESSAGE_RECORD = (
    ("msg_id", "bigint"),
    ("read_ct", "integer"),
    ("enqueued_at", TIMESTAMPTZ),
    ("last_read_at", TIMESTAMPTZ),
    ("vt", TIMESTAMPTZ),
    ("message", "jsonb"),
    ("headers", "jsonb"),
)


# -- the catalog: every reference function exists in pgbroker with the same signature ---------

# Functions of the reference that are its internals, not part of the contract (spec/pgmq-api.md).
REFERENCE_INTERNALS = frozenset(
    {
        "acquire_queue_lock",  # advisory lock helper of create/drop
        "notify_queue_listeners",  # the trigger function behind enable_notify_insert
    }
)

_SIGNATURES = """
SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_arguments(p.oid),
       pg_get_function_result(p.oid), p.prokind
FROM pg_proc p WHERE p.pronamespace = 'pgmq'::regnamespace
"""


def _public_signatures(conn: Conn) -> dict[tuple[str, str], tuple[str, str, str]]:
    return {
        (str(name), str(identity)): (str(arguments), str(result), str(kind))
        for name, identity, arguments, result, kind in conn.execute(_SIGNATURES).fetchall()
        if not str(name).startswith("_") and name not in REFERENCE_INTERNALS
    }


def test_every_reference_function_exists_with_the_same_signature(unchanged: Pair) -> None:
    ours, theirs = _public_signatures(unchanged.a), _public_signatures(unchanged.b)
    missing = sorted(f"pgmq.{name}({args})" for name, args in theirs.keys() - ours.keys())
    different = sorted(
        f"pgmq.{name}({args}): ours {ours[name, args]} / reference {theirs[name, args]}"
        for name, args in theirs.keys() & ours.keys()
        if ours[name, args] != theirs[name, args]
    )
    assert [*missing, *different] == [], "\n".join(
        [f"missing in pgbroker: {m}" for m in missing] + [f"different: {d}" for d in different]
    )


@pytest.mark.parametrize("type_name", ["pgmq.message_record", "pgmq.queue_record", "pgmq.metrics_result"])
def test_result_types_have_the_same_fields_in_the_same_order(unchanged: Pair, type_name: str) -> None:
    unchanged.same(
        """
        SELECT a.attnum, a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
        WHERE a.attrelid = (SELECT typrelid FROM pg_type WHERE oid = %s::regtype)
          AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum
        """,
        [type_name],
    )


# -- queue management -------------------------------------------------------------------------


def _table_shape(pair: Pair, table: str) -> None:
    pair.same(
        """
        SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
               pg_get_expr(d.adbin, d.adrelid)
        FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum
        """,
        [table],
    )


def test_create_forms_make_the_same_tables_and_meta(pair: Pair) -> None:
    create(pair, "jobs", "create")
    create(pair, "jobs", "create")  # idempotent
    create(pair, "plain", "create_non_partitioned")
    create(pair, "fast", "create_unlogged")
    create(pair, "fast", "create_unlogged")
    create(pair, "Mixed_Case", "create")
    create(pair, "x" * 47, "create")  # the longest name
    pair.assert_same_state()
    for queue in ("jobs", "plain", "fast", "mixed_case"):
        _table_shape(pair, f"pgmq.q_{queue}")
        _table_shape(pair, f"pgmq.a_{queue}")
    pair.same("SELECT pg_get_serial_sequence('pgmq.q_jobs', 'msg_id')")


def test_create_rejects_what_the_reference_rejects(pair: Pair) -> None:
    pair.both_fail("SELECT pgmq.create(queue_name => %s)", ["x" * 48], reference="P0001")
    for bad in ("a$b", "a;b", "a--b", "a'b"):
        pair.both_fail("SELECT pgmq.create(queue_name => %s)", [bad], reference="P0001")
        pair.both_fail("SELECT pgmq.create_unlogged(queue_name => %s)", [bad], reference="P0001")
    pair.both_fail("SELECT pgmq.create(queue_name => NULL)", reference="22004")
    # pgmq checks the characters before the length.
    pair.both_fail("SELECT pgmq.create(queue_name => %s)", ["x" * 48 + "$"], reference="P0001")
    pair.assert_same_state()


def test_list_queues(pair: Pair) -> None:
    empty = pair.same("SELECT * FROM pgmq.list_queues()")
    assert empty.columns == (
        ("queue_name", "character varying"),
        ("is_partitioned", "boolean"),
        ("is_unlogged", "boolean"),
        ("created_at", TIMESTAMPTZ),
    )
    create(pair, "alpha")
    create(pair, "beta", "create_unlogged")
    pair.same("SELECT * FROM pgmq.list_queues()")  # created in name order: no D4 difference
    pair.same("SELECT queue_name, is_unlogged FROM pgmq.list_queues() WHERE queue_name = 'beta'")


def test_deliberate_list_queues_ordered_by_name(pair: Pair) -> None:
    for name in ("delta", "alpha", "charlie", "bravo"):
        create(pair, name)
    ours = pair.same("SELECT * FROM pgmq.list_queues()", ordered=False)
    assert [row[0] for row in ours.rows] == ["alpha", "bravo", "charlie", "delta"]
    metrics = pair.same("SELECT queue_name FROM pgmq.metrics_all()", ordered=False)
    assert [row[0] for row in metrics.rows] == ["alpha", "bravo", "charlie", "delta"]


def test_drop_queue(pair: Pair) -> None:
    create(pair, "jobs")
    create(pair, "other")
    send_many(pair, [{"a": 1}, {"a": 2}])
    pair.same("SELECT * FROM pgmq.archive(queue_name => %s, msg_ids => %s::bigint[])", [Q, [1]])
    assert pair.same("SELECT pgmq.drop_queue(queue_name => %s)", [Q]).rows == ((True,),)
    pair.assert_same_state()
    # Not an error: false, with a notice.
    assert pair.same("SELECT pgmq.drop_queue(queue_name => %s)", [Q]).rows == ((False,),)
    # The deprecated two-argument form (a warning, always true).
    assert pair.same("SELECT pgmq.drop_queue(%s, false)", ["other"]).rows == ((True,),)
    assert pair.same("SELECT pgmq.drop_queue(%s, false)", ["missing"]).rows == ((True,),)
    pair.assert_same_state()
    # A dropped queue can be created again and starts from msg_id 1.
    create(pair, "jobs")
    assert send(pair, {"again": True}) == 1


def test_purge_queue(pair: Pair) -> None:
    create(pair)
    assert pair.same("SELECT pgmq.purge_queue(queue_name => %s)", [Q]).rows == ((0,),)
    send_many(pair, [{"n": n} for n in range(5)])
    read(pair, LONG, 2)
    pair.same("SELECT * FROM pgmq.archive(queue_name => %s, msg_id => %s::bigint)", [Q, 5])
    assert pair.same("SELECT pgmq.purge_queue(queue_name => %s)", [Q]).rows == ((4,),)
    pair.assert_same_state()  # the archive keeps its row
    assert send(pair, {"after": "purge"}) == 6  # the sequence is not reset


# Every metrics_result column but default_partition_length, which has a test of its own.
METRICS = sql.SQL(
    "queue_name, queue_length, newest_msg_age_sec, oldest_msg_age_sec, total_messages, scrape_time,"
    " queue_visible_length"
)


def test_metrics_and_metrics_all(pair: Pair) -> None:
    create(pair, "jobs")
    create(pair, "zzz")
    pair.same(sql.SQL("SELECT {} FROM pgmq.metrics(queue_name => %s)").format(METRICS), [Q])
    send_many(pair, [{"n": n} for n in range(4)])
    pair.same(
        "SELECT * FROM pgmq.send(queue_name => %s, msg => %s, delay => %s::integer)", [Q, Jsonb({}), LONG]
    )
    read(pair, LONG, 1)
    pair.same("SELECT * FROM pgmq.delete(queue_name => %s, msg_id => %s::bigint)", [Q, 2])
    pair.same(sql.SQL("SELECT {} FROM pgmq.metrics(queue_name => %s)").format(METRICS), [Q])
    pair.same(sql.SQL("SELECT {} FROM pgmq.metrics_all()").format(METRICS))  # jobs < zzz: no D4 difference
    outcome = pair.same("SELECT * FROM pgmq.metrics(queue_name => %s) WHERE false", [Q])  # columns only
    assert outcome.columns == (
        ("queue_name", "text"),
        ("queue_length", "bigint"),
        ("newest_msg_age_sec", "integer"),
        ("oldest_msg_age_sec", "integer"),
        ("total_messages", "bigint"),
        ("scrape_time", TIMESTAMPTZ),
        ("queue_visible_length", "bigint"),
        ("default_partition_length", "bigint"),
    )
    pair.same("SELECT * FROM pgmq.metrics_all() WHERE false")
    # The composite, as some clients select it.
    pair.same("SELECT pgmq.metrics(%s) WHERE false", [Q])
    pair.same("SELECT (pgmq.metrics(%s)).total_messages", [Q])


def test_metrics_default_partition_length_is_null_for_plain_queues(pair: Pair) -> None:
    """The reference reports NULL for a queue that has no default partition (any plain queue)."""
    create(pair, "jobs")
    create(pair, "fast", "create_unlogged")
    send_many(pair, [{"n": 1}])
    for name in ("jobs", "fast"):
        pair.same("SELECT default_partition_length FROM pgmq.metrics(%s)", [name])
    pair.same("SELECT queue_name, default_partition_length FROM pgmq.metrics_all() ORDER BY 1")


# -- sending ----------------------------------------------------------------------------------

SEND_FORMS: list[tuple[str, list[Any]]] = [
    ("SELECT * FROM pgmq.send(queue_name => %s, msg => %s)", [Jsonb({"form": 1})]),
    (
        "SELECT * FROM pgmq.send(queue_name => %s, msg => %s, headers => %s)",
        [Jsonb({"form": 2}), Jsonb({"h": 1})],
    ),
    ("SELECT * FROM pgmq.send(queue_name => %s, msg => %s, delay => %s::integer)", [Jsonb({"form": 3}), 0]),
    (
        "SELECT * FROM pgmq.send(queue_name => %s, msg => %s, delay => %s::integer)",
        [Jsonb({"form": 3}), LONG],
    ),
    (
        "SELECT * FROM pgmq.send(queue_name => %s, msg => %s, delay => %s::timestamptz)",
        [Jsonb({"form": 4}), PAST],
    ),
    (
        "SELECT * FROM pgmq.send(queue_name => %s, msg => %s, delay => %s::timestamptz)",
        [Jsonb({"form": 4}), FUTURE],
    ),
    (
        "SELECT * FROM pgmq.send(queue_name => %s, msg => %s, headers => %s, delay => %s::integer)",
        [Jsonb({"form": 5}), Jsonb({"h": 5}), 0],
    ),
    (
        "SELECT * FROM pgmq.send(queue_name => %s, msg => %s, headers => %s, delay => %s::integer)",
        [Jsonb({"form": 5}), None, LONG],
    ),
    (
        "SELECT * FROM pgmq.send(queue_name => %s, msg => %s, headers => %s, delay => %s::timestamptz)",
        [Jsonb({"form": 6}), Jsonb({"h": 6}), PAST],
    ),
    (
        "SELECT * FROM pgmq.send(queue_name => %s, msg => %s, headers => %s, delay => %s::timestamptz)",
        [Jsonb({"form": 6}), Jsonb([1, "two"]), FUTURE],
    ),
    # Positional, as clients without named arguments call it.
    ("SELECT * FROM pgmq.send(%s::text, %s::jsonb)", [Jsonb("a string is a jsonb too")]),
    ("SELECT * FROM pgmq.send(%s::text, %s::jsonb, %s::jsonb)", [Jsonb(None), Jsonb({})]),
    ("SELECT * FROM pgmq.send(%s::text, %s::jsonb, %s::integer)", [Jsonb(42), 0]),
    ("SELECT * FROM pgmq.send(%s, %s, %s::jsonb, %s::integer)", [Jsonb({"p": 1}), Jsonb({"h": 1}), LONG]),
]


def test_send_all_six_forms(pair: Pair) -> None:
    create(pair)
    for query, args in SEND_FORMS:
        outcome = pair.same(query, [Q, *args])
        assert outcome.columns == (("send", "bigint"),)
    pair.assert_same_state()
    read(pair, LONG, 100)  # exactly the visible ones, in both
    pair.assert_same_state()


SEND_BATCH_FORMS: list[tuple[str, list[Any]]] = [
    ("SELECT * FROM pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[])", []),
    (
        "SELECT * FROM pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], headers => %s::jsonb[])",
        ["headers"],
    ),
    ("SELECT * FROM pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], delay => %s::integer)", [0]),
    ("SELECT * FROM pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], delay => %s::integer)", [LONG]),
    (
        "SELECT * FROM pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], delay => %s::timestamptz)",
        [PAST],
    ),
    (
        "SELECT * FROM pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], delay => %s::timestamptz)",
        [FUTURE],
    ),
    (
        "SELECT * FROM pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], headers => %s::jsonb[],"
        " delay => %s::integer)",
        ["headers", 0],
    ),
    (
        "SELECT * FROM pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], headers => %s::jsonb[],"
        " delay => %s::integer)",
        ["headers", LONG],
    ),
    (
        "SELECT * FROM pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], headers => %s::jsonb[],"
        " delay => %s::timestamptz)",
        ["headers", PAST],
    ),
    (
        "SELECT * FROM pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], headers => %s::jsonb[],"
        " delay => %s::timestamptz)",
        ["headers", FUTURE],
    ),
]


def test_send_batch_all_six_forms(pair: Pair) -> None:
    create(pair)
    for form, (query, extra) in enumerate(SEND_BATCH_FORMS):
        msgs = [{"form": form, "i": i} for i in range(3)]
        args: list[Any] = [Q, jsonb_array(msgs)]
        for item in extra:
            args.append(
                jsonb_array([{"h": i} if i != 1 else None for i in range(3)]) if item == "headers" else item
            )
        outcome = pair.same(query, args)  # ids in the order of msgs
        assert outcome.columns == (("send_batch", "bigint"),)
        assert len(outcome.rows) == 3
    pair.assert_same_state()
    read(pair, LONG, 100)
    pair.assert_same_state()


def test_send_batch_rejects_what_the_reference_rejects(pair: Pair) -> None:
    create(pair)
    base = "SELECT * FROM pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[]"
    pair.both_fail(base + ")", [Q, []], reference="P0001")
    pair.both_fail(base + ")", [Q, None], reference="P0001")
    pair.both_fail(
        base + ", headers => %s::jsonb[])", [Q, jsonb_array([1, 2]), jsonb_array([1])], reference="P0001"
    )
    pair.both_fail(base + ", headers => %s::jsonb[])", [Q, jsonb_array([1]), []], reference="P0001")
    pair.assert_same_state()
    assert send(pair, {"first": True}) == 1  # no msg_id was used up by the failures


# -- reading ----------------------------------------------------------------------------------


def test_read_visibility_and_qty(pair: Pair) -> None:
    create(pair)
    assert read(pair, LONG, 5).rows == ()
    send_many(pair, [{"n": n} for n in range(10)])
    first = read(pair, LONG, 3)
    assert first.columns == MESSAGE_RECORD
    assert first.ids() == [1, 2, 3]
    assert read(pair, LONG, 0).rows == ()
    read(pair, 0, 2)  # 4, 5 read and visible again at once
    again = read(pair, LONG, 4)
    assert again.ids() == [4, 5, 6, 7]  # read_ct 2 for 4 and 5
    pair.same(
        "SELECT * FROM pgmq.set_vt(queue_name => %s, msg_id => %s::bigint, vt => %s::integer)", [Q, 2, 0]
    )
    assert read(pair, LONG, 10).ids() == [2, 8, 9, 10]
    assert read(pair, LONG, 10).rows == ()
    pair.assert_same_state()


def test_read_conditional(pair: Pair) -> None:
    create(pair)
    send_many(
        pair, [{"kind": "a", "n": 1}, {"kind": "b", "n": 2}, {"kind": "a", "n": 3, "x": {"y": 1}}, [1, 2]]
    )
    query = (
        "SELECT * FROM pgmq.read(queue_name => %s, vt => %s::integer, qty => %s::integer,"
        " conditional => %s::jsonb)"
    )
    for conditional in ({"kind": "b"}, {"x": {"y": 1}}, {"kind": "zzz"}, {}, {"kind": "a"}):
        assert_ordered_by_msg_id(pair.same(query, [Q, LONG, 10, Jsonb(conditional)], ordered=False))
        pair.assert_same_state()
    pair.same("SELECT * FROM pgmq.set_vt(%s, %s::bigint[], %s::integer)", [Q, [1, 2, 3, 4], 0], ordered=False)
    assert_ordered_by_msg_id(pair.same(query, [Q, LONG, 10, Jsonb([2])], ordered=False))
    pair.assert_same_state()


def test_read_with_poll(pair: Pair) -> None:
    create(pair)
    base = "SELECT * FROM pgmq.read_with_poll(queue_name => %s, vt => %s::integer, qty => %s::integer"
    # Nothing to read: both wait max_poll_seconds, then return no rows.
    started = time.monotonic()
    outcome = pair.same(
        base + ", max_poll_seconds => 1, poll_interval_ms => 50)", [Q, LONG, 5], parallel=True
    )
    assert outcome.rows == ()
    assert time.monotonic() - started >= 1.0
    send_many(pair, [{"k": "a"}, {"k": "b"}, {"k": "a"}])
    outcome = pair.same(base + ")", [Q, LONG, 2], ordered=False)  # the defaults (5 s, 100 ms)
    assert outcome.columns == MESSAGE_RECORD
    assert_ordered_by_msg_id(outcome)
    pair.same(base + ", conditional => %s::jsonb)", [Q, LONG, 5, Jsonb({"k": "a"})], ordered=False)
    pair.assert_same_state()


def test_read_with_poll_returns_a_message_sent_while_waiting(pair: Pair) -> None:
    create(pair)
    query = (
        "SELECT * FROM pgmq.read_with_poll(queue_name => %s, vt => %s::integer, qty => %s::integer,"
        " max_poll_seconds => 10, poll_interval_ms => 20)"
    )
    results: dict[str, Outcome] = {}

    def poll(side: str, conn: Conn) -> None:
        results[side] = run(conn, query, [Q, LONG, 5])

    threads = [threading.Thread(target=poll, args=(s, c)) for s, c in (("a", pair.a), ("b", pair.b))]
    dsns = [pair.a.info.dsn, pair.b.info.dsn]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    for conninfo in dsns:
        with psycopg.connect(conninfo, autocommit=True) as producer:
            producer.execute("SELECT pgmq.send(%s, %s)", [Q, Jsonb({"late": True})])
    for thread in threads:
        thread.join(timeout=15)
    assert results["a"] == results["b"]
    assert results["a"].ids() == [1]


def test_pop(pair: Pair) -> None:
    create(pair)
    assert pair.same("SELECT * FROM pgmq.pop(queue_name => %s)", [Q]).rows == ()
    send_many(pair, [{"n": n} for n in range(6)])
    read(pair, LONG, 1)
    popped = pair.same("SELECT * FROM pgmq.pop(queue_name => %s)", [Q])
    assert popped.columns == MESSAGE_RECORD
    assert popped.ids() == [2]
    many = pair.same("SELECT * FROM pgmq.pop(queue_name => %s, qty => %s::integer)", [Q, 3], ordered=False)
    assert_ordered_by_msg_id(many)
    assert many.ids() == [3, 4, 5]
    pair.same("SELECT * FROM pgmq.pop(%s, %s)", [Q, 0])
    pair.assert_same_state()


# -- acknowledging and visibility -------------------------------------------------------------


def test_delete_single_and_array(pair: Pair) -> None:
    create(pair)
    send_many(pair, [{"n": n} for n in range(6)])
    assert pair.same("SELECT pgmq.delete(queue_name => %s, msg_id => %s::bigint)", [Q, 1]).rows == ((True,),)
    assert pair.same("SELECT pgmq.delete(queue_name => %s, msg_id => %s::bigint)", [Q, 1]).rows == ((False,),)
    assert pair.same("SELECT pgmq.delete(%s, %s::bigint)", [Q, 99]).rows == ((False,),)
    deleted = pair.same(
        "SELECT * FROM pgmq.delete(queue_name => %s, msg_ids => %s::bigint[])",
        [Q, [2, 4, 99, 1]],
        ordered=False,
    )
    assert sorted(deleted.ids()) == [2, 4]
    pair.same("SELECT * FROM pgmq.delete(queue_name => %s, msg_ids => %s::bigint[])", [Q, []])
    pair.assert_same_state()


def test_archive_single_and_array(pair: Pair) -> None:
    create(pair)
    send_many(pair, [{"n": n} for n in range(6)])
    pair.same(
        "SELECT * FROM pgmq.send(queue_name => %s, msg => %s, headers => %s)",
        [Q, Jsonb({"n": 6}), Jsonb({"h": 1})],
    )
    read(pair, LONG, 2)
    assert pair.same("SELECT pgmq.archive(queue_name => %s, msg_id => %s::bigint)", [Q, 1]).rows == ((True,),)
    assert pair.same("SELECT pgmq.archive(queue_name => %s, msg_id => %s::bigint)", [Q, 1]).rows == (
        (False,),
    )
    archived = pair.same(
        "SELECT * FROM pgmq.archive(queue_name => %s, msg_ids => %s::bigint[])",
        [Q, [2, 3, 7, 99]],
        ordered=False,
    )
    assert sorted(archived.ids()) == [2, 3, 7]
    pair.assert_same_state()
    _table_shape(pair, "pgmq.a_jobs")


def test_set_vt_four_forms(pair: Pair) -> None:
    create(pair)
    send_many(pair, [{"n": n} for n in range(8)])
    read(pair, LONG, 3)
    forms = [
        ("SELECT * FROM pgmq.set_vt(queue_name => %s, msg_id => %s::bigint, vt => %s::integer)", 1, 0),
        ("SELECT * FROM pgmq.set_vt(queue_name => %s, msg_id => %s::bigint, vt => %s::integer)", 4, LONG),
        ("SELECT * FROM pgmq.set_vt(queue_name => %s, msg_id => %s::bigint, vt => %s::timestamptz)", 2, PAST),
        (
            "SELECT * FROM pgmq.set_vt(queue_name => %s, msg_id => %s::bigint, vt => %s::timestamptz)",
            5,
            FUTURE,
        ),
        ("SELECT * FROM pgmq.set_vt(queue_name => %s, msg_id => %s::bigint, vt => %s::integer)", 99, 0),
        (
            "SELECT * FROM pgmq.set_vt(queue_name => %s, msg_ids => %s::bigint[], vt => %s::integer)",
            [3, 6, 99],
            0,
        ),
        (
            "SELECT * FROM pgmq.set_vt(queue_name => %s, msg_ids => %s::bigint[], vt => %s::integer)",
            [7],
            LONG,
        ),
        (
            "SELECT * FROM pgmq.set_vt(queue_name => %s, msg_ids => %s::bigint[], vt => %s::timestamptz)",
            [1, 2, 8],
            FUTURE,
        ),
        (
            "SELECT * FROM pgmq.set_vt(queue_name => %s, msg_ids => %s::bigint[], vt => %s::timestamptz)",
            [5, 8],
            PAST,
        ),
        ("SELECT * FROM pgmq.set_vt(queue_name => %s, msg_ids => %s::bigint[], vt => %s::integer)", [], 0),
    ]
    for query, ids, vt in forms:
        outcome = pair.same(query, [Q, ids, vt], ordered=False)
        assert outcome.columns == MESSAGE_RECORD
        assert_ordered_by_msg_id(outcome)
        pair.assert_same_state()
    read(pair, LONG, 100)
    pair.assert_same_state()


# -- names ------------------------------------------------------------------------------------


def test_validate_queue_name(unchanged: Pair) -> None:
    for name in ("jobs", "Jobs", "x" * 47, "with-dash_and.dot", "ünïcödé"):
        outcome = unchanged.same("SELECT pgmq.validate_queue_name(queue_name => %s)", [name])
        assert outcome.columns == (("validate_queue_name", "void"),)
    unchanged.both_fail("SELECT pgmq.validate_queue_name(%s)", ["x" * 48], reference="P0001")


def test_validate_queue_name_checks_only_the_length(unchanged: Pair) -> None:
    """As pgmq's: the characters are format_table_name's to check, the rest create's."""
    for name in ("a$b", "a;b", "a--b", "a'b", "", None, "tab\there"):
        unchanged.same("SELECT pgmq.validate_queue_name(%s::text)", [name])


def test_format_table_name(unchanged: Pair) -> None:
    for name, prefix in (
        ("jobs", "q"),
        ("Jobs", "a"),
        ("MiXeD", "Q"),
        ("x" * 60, "q"),
        ("", "q"),
        (None, "q"),
    ):
        outcome = unchanged.same(
            "SELECT pgmq.format_table_name(queue_name => %s::text, prefix => %s)", [name, prefix]
        )
        assert outcome.columns == (("format_table_name", "text"),)
    for bad in ("a$b", "a;b", "a--b", "a'b"):
        unchanged.both_fail("SELECT pgmq.format_table_name(%s, 'q')", [bad], reference="P0001")


# -- errors: a queue that does not exist ------------------------------------------------------

MISSING_QUEUE_CALLS = [
    "SELECT pgmq.purge_queue(queue_name => 'nope')",
    "SELECT * FROM pgmq.metrics(queue_name => 'nope')",
    "SELECT * FROM pgmq.send(queue_name => 'nope', msg => '{}')",
    "SELECT * FROM pgmq.send(queue_name => 'nope', msg => '{}', headers => '{}')",
    "SELECT * FROM pgmq.send(queue_name => 'nope', msg => '{}', delay => 1)",
    "SELECT * FROM pgmq.send(queue_name => 'nope', msg => '{}', delay => now())",
    "SELECT * FROM pgmq.send(queue_name => 'nope', msg => '{}', headers => '{}', delay => 1)",
    "SELECT * FROM pgmq.send(queue_name => 'nope', msg => '{}', headers => '{}', delay => now())",
    "SELECT * FROM pgmq.send_batch(queue_name => 'nope', msgs => ARRAY['{}'::jsonb])",
    "SELECT * FROM pgmq.send_batch(queue_name => 'nope', msgs => ARRAY['{}'::jsonb],"
    " headers => ARRAY['{}'::jsonb])",
    "SELECT * FROM pgmq.send_batch(queue_name => 'nope', msgs => ARRAY['{}'::jsonb], delay => 1)",
    "SELECT * FROM pgmq.send_batch(queue_name => 'nope', msgs => ARRAY['{}'::jsonb], delay => now())",
    "SELECT * FROM pgmq.read(queue_name => 'nope', vt => 1, qty => 1)",
    "SELECT * FROM pgmq.read(queue_name => 'nope', vt => 1, qty => 1, conditional => '{\"a\": 1}')",
    "SELECT * FROM pgmq.read_with_poll(queue_name => 'nope', vt => 1, qty => 1, max_poll_seconds => 1)",
    "SELECT * FROM pgmq.pop(queue_name => 'nope')",
    "SELECT pgmq.delete(queue_name => 'nope', msg_id => 1)",
    "SELECT * FROM pgmq.delete(queue_name => 'nope', msg_ids => ARRAY[1::bigint])",
    "SELECT pgmq.archive(queue_name => 'nope', msg_id => 1)",
    "SELECT * FROM pgmq.archive(queue_name => 'nope', msg_ids => ARRAY[1::bigint])",
    "SELECT * FROM pgmq.set_vt(queue_name => 'nope', msg_id => 1, vt => 1)",
    "SELECT * FROM pgmq.set_vt(queue_name => 'nope', msg_id => 1, vt => now())",
    "SELECT * FROM pgmq.set_vt(queue_name => 'nope', msg_ids => ARRAY[1::bigint], vt => 1)",
    "SELECT * FROM pgmq.set_vt(queue_name => 'nope', msg_ids => ARRAY[1::bigint], vt => now())",
    # what only pgmq's functions take (0018) still fails first on the queue, as in pgmq
    "SELECT * FROM pgmq.read(queue_name => 'nope', vt => -1, qty => 1)",
    "SELECT * FROM pgmq.read(queue_name => 'nope', vt => NULL, qty => NULL)",
    "SELECT * FROM pgmq.pop(queue_name => 'nope', qty => NULL)",
    "SELECT * FROM pgmq.send(queue_name => 'nope', msg => '{}', delay => NULL::integer)",
    "SELECT * FROM pgmq.send(queue_name => 'nope', msg => '{}', delay => NULL::timestamptz)",
    "SELECT * FROM pgmq.send_batch(queue_name => 'nope', msgs => ARRAY['{}'::jsonb], delay => -1)",
    "SELECT * FROM pgmq.send_batch(queue_name => 'nope', msgs => ARRAY['{}'::jsonb], delay => NULL::integer)",
    "SELECT * FROM pgmq.set_vt(queue_name => 'nope', msg_ids => ARRAY[1::bigint], vt => NULL::integer)",
]


@pytest.mark.parametrize("query", MISSING_QUEUE_CALLS)
def test_missing_queue_fails_on_both(unchanged: Pair, query: str) -> None:
    unchanged.both_fail(query, reference="42P01")


# -- arguments pgmq takes and pgbroker's own functions refuse (migration 0018) ----------------

# (call, what pgmq does with it); the queue holds messages 1 and 2, both visible, in groups A and B.
PGMQ_ONLY_ARGUMENTS = [
    ("SELECT * FROM pgmq.read(%(q)s, -1, 1)", "reads with a vt in the past"),
    ("SELECT * FROM pgmq.read(%(q)s, -1, 5, '{\"n\": 2}')", "reads with a vt in the past, conditionally"),
    ("SELECT * FROM pgmq.read(%(q)s, NULL::integer, 1)", "fails: NOT NULL vt (23502)"),
    ("SELECT * FROM pgmq.read(%(q)s, NULL::integer, 1, '{\"n\": 3}')", "nothing to touch: no rows"),
    ("SELECT * FROM pgmq.read(%(q)s, 1, NULL::integer)", "LIMIT NULL: no limit"),
    ("SELECT * FROM pgmq.read(%(q)s, -10, NULL::integer)", "no limit, vt in the past"),
    ("SELECT * FROM pgmq.read(%(q)s, NULL::integer, NULL::integer)", "fails: NOT NULL vt (23502)"),
    ("SELECT * FROM pgmq.read(%(q)s, NULL::integer, -1)", "fails: LIMIT must not be negative (2201W)"),
    ("SELECT * FROM pgmq.read_with_poll(%(q)s, -1, 1, 1, 10)", "reads with a vt in the past"),
    ("SELECT * FROM pgmq.read_with_poll(%(q)s, 1, 1, -1, 10)", "returns no rows at once"),
    ("SELECT * FROM pgmq.read_with_poll(%(q)s, 1, 1, 1, 0)", "polls without sleeping"),
    ("SELECT * FROM pgmq.read_with_poll(%(q)s, 1, 1, 1, NULL::integer)", "polls without sleeping"),
    ("SELECT * FROM pgmq.read_with_poll(%(q)s, 1, 1, NULL::integer, 10)", "polls until rows come"),
    ("SELECT * FROM pgmq.read_with_poll(%(q)s, NULL::integer, 1, 1, 10)", "fails: NOT NULL vt (23502)"),
    ("SELECT * FROM pgmq.pop(%(q)s, NULL::integer)", "pops every message"),
    ("SELECT * FROM pgmq.send(%(q)s, '{}', -5)", "sends with vt in the past"),
    ("SELECT * FROM pgmq.send(%(q)s, '{}', NULL::integer)", "fails: NOT NULL vt (23502)"),
    ("SELECT * FROM pgmq.send(%(q)s, '{}', NULL::timestamptz)", "fails: NOT NULL vt (23502)"),
    ("SELECT * FROM pgmq.send(%(q)s, '{}', '{}'::jsonb, -5)", "sends with vt in the past"),
    ("SELECT * FROM pgmq.send(%(q)s, '{}', '{}'::jsonb, NULL::integer)", "fails: NOT NULL vt (23502)"),
    ("SELECT * FROM pgmq.send(%(q)s, '{}', '{}'::jsonb, NULL::timestamptz)", "fails: NOT NULL vt (23502)"),
    ("SELECT * FROM pgmq.send_batch(%(q)s, ARRAY['{}'::jsonb, '[]'], -5)", "sends with vt in the past"),
    (
        "SELECT * FROM pgmq.send_batch(%(q)s, ARRAY['{}'::jsonb], NULL::integer)",
        "fails: NOT NULL vt (23502)",
    ),
    (
        "SELECT * FROM pgmq.send_batch(%(q)s, ARRAY['{}'::jsonb], NULL::timestamptz)",
        "fails: NOT NULL vt (23502)",
    ),
    (
        "SELECT * FROM pgmq.send_batch(%(q)s, ARRAY['{}'::jsonb], ARRAY['{}'::jsonb], -5)",
        "sends with vt in the past",
    ),
    (
        "SELECT * FROM pgmq.send_batch(%(q)s, ARRAY['{}'::jsonb], ARRAY['{}'::jsonb], NULL::timestamptz)",
        "fails: NOT NULL vt (23502)",
    ),
    (
        "SELECT * FROM pgmq.send_batch(%(q)s, '{}'::jsonb[], NULL::integer)",
        "fails: msgs cannot be NULL or empty (P0001), before the vt",
    ),
    ("SELECT * FROM pgmq.set_vt(%(q)s, 1::bigint, -5)", "sets a vt in the past"),
    ("SELECT * FROM pgmq.set_vt(%(q)s, 1::bigint, NULL::integer)", "fails: NOT NULL vt (23502)"),
    ("SELECT * FROM pgmq.set_vt(%(q)s, 99::bigint, NULL::integer)", "no such message: no rows"),
    ("SELECT * FROM pgmq.set_vt(%(q)s, ARRAY[1::bigint, 2], -5)", "sets a vt in the past"),
    ("SELECT * FROM pgmq.set_vt(%(q)s, ARRAY[1::bigint], NULL::timestamptz)", "fails: NOT NULL vt (23502)"),
    ("SELECT * FROM pgmq.read_grouped(%(q)s, -1, 1)", "reads with a vt in the past"),
    ("SELECT * FROM pgmq.read_grouped(%(q)s, NULL::integer, 1)", "fails: NOT NULL vt (23502)"),
    ("SELECT * FROM pgmq.read_grouped(%(q)s, 10, NULL::integer)", "fills a batch of NULL: no rows"),
    (
        "SELECT * FROM pgmq.read_grouped(%(q)s, NULL::integer, -1)",
        "fails: LIMIT must not be negative (2201W)",
    ),
    ("SELECT * FROM pgmq.read_grouped_rr(%(q)s, -1, 2)", "reads with a vt in the past"),
    ("SELECT * FROM pgmq.read_grouped_rr(%(q)s, NULL::integer, 1)", "fails: NOT NULL vt (23502)"),
    (
        "SELECT * FROM pgmq.read_grouped_rr(%(q)s, 10, NULL::integer)",
        "compares a row number with NULL: no rows",
    ),
    (
        "SELECT * FROM pgmq.read_grouped_rr(%(q)s, NULL::integer, -1)",
        "compares a row number with -1: no rows",
    ),
    ("SELECT * FROM pgmq.read_grouped_head(%(q)s, -5, NULL::integer)", "every group's head, vt in the past"),
    ("SELECT * FROM pgmq.read_grouped_head(%(q)s, NULL::integer, 1)", "fails: NOT NULL vt (23502)"),
    ("SELECT * FROM pgmq.read_grouped_with_poll(%(q)s, 1, 1, -1, 10)", "returns no rows at once"),
    ("SELECT * FROM pgmq.read_grouped_rr_with_poll(%(q)s, 1, 1, 1, 0)", "polls without sleeping"),
    (
        "SELECT * FROM pgmq.read_grouped_head_with_poll(%(q)s, -1, 1, NULL::integer, 10)",
        "polls until rows come",
    ),
]


@pytest.mark.parametrize(("query", "pgmq_does"), PGMQ_ONLY_ARGUMENTS)
def test_arguments_only_pgmq_takes_do_what_pgmq_does(scratch: Pair, query: str, pgmq_does: str) -> None:
    """A negative or NULL vt or delay, a NULL qty, a negative or NULL wait, a poll interval <= 0:
    pgmq's outcome exactly (its rows, or its SQLSTATE and message), the queue left alike, and the
    next plain read finds the same messages on both sides (a vt written in the past is due)."""
    queue = f"bad_{uuid.uuid4().hex[:12]}"
    create(scratch, queue)
    scratch.same(  # in two FIFO groups, for the grouped reads
        "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[], %s::jsonb[])",
        [
            queue,
            jsonb_array([{"n": 1}, {"n": 2}]),
            jsonb_array([{"x-pgmq-group": "A"}, {"x-pgmq-group": "B"}]),
        ],
    )
    a, b = scratch.both(query, {"q": queue})
    assert b.failed == pgmq_does.startswith("fails"), b
    assert (a.sqlstate, a.error) == (b.sqlstate, b.error), (a, b)
    assert (a.columns, a.sorted_rows(), a.notices) == (b.columns, b.sorted_rows(), b.notices)
    assert_ordered_by_msg_id(a)
    assert queue_state(scratch.a, queue) == queue_state(scratch.b, queue)
    scratch.same("SELECT * FROM pgmq.read(%(q)s, %(vt)s, 10)", {"q": queue, "vt": LONG}, ordered=False)


# -- deliberate differences -------------------------------------------------------------------


@pytest.mark.parametrize("function", ["create", "create_non_partitioned", "create_unlogged"])
def test_deliberate_bad_queue_names_are_rejected(pair: Pair, function: str) -> None:
    """D1b: the reference creates queues named '' or with control characters; pgbroker refuses."""
    query = sql.SQL("SELECT pgmq.{}(%s)").format(sql.Identifier(function))
    for name in ("", "tab\tname", "new\nline", "bell\x07"):
        assert not pair.deliberate(query, [name], pgbroker="PB001").failed
    assert database_state(pair.a)["meta"] == []


def test_deliberate_case_conflict_is_rejected(pair: Pair) -> None:
    """D2: the reference registers 'Jobs' beside 'jobs' over the same tables; pgbroker refuses."""
    create(pair, "jobs")
    send(pair, {"n": 1})
    assert not pair.deliberate("SELECT pgmq.create('Jobs')", pgbroker="PB004").failed
    assert not pair.deliberate("SELECT pgmq.create_unlogged('JOBS')", pgbroker="PB004").failed
    assert [row[0] for row in database_state(pair.b)["meta"]] == ["JOBS", "Jobs", "jobs"]
    assert [row[0] for row in database_state(pair.a)["meta"]] == ["jobs"]
    # Both still serve the queue under its first name, and through any case of it.
    read(pair, LONG, 1)
    send(pair, {"n": 2}, name="JoBs")


def test_deliberate_vt_equals_enqueued_at_without_delay(pair: Pair) -> None:
    """D6: without delay pgbroker stores vt = enqueued_at; the reference stores the insert's clock."""
    create(pair)
    send(pair, {"n": 1})
    pair.same("SELECT * FROM pgmq.send(%s, %s, %s::integer)", [Q, Jsonb({"n": 2}), 0])
    send_many(pair, [{"n": 3}, {"n": 4}])
    query = "SELECT msg_id, vt = enqueued_at, vt >= enqueued_at FROM pgmq.q_jobs ORDER BY msg_id"
    assert [tuple(r) for r in pair.a.execute(query).fetchall()] == [(i, True, True) for i in (1, 2, 3, 4)]
    assert all(r[2] for r in pair.b.execute(query).fetchall())


# -- FIFO groups (migration 0004) -------------------------------------------------------------


def _send_grouped(pair: Pair) -> None:
    groups = ["A", "A", "B", None, "A", "C", "B", None, "C", "A"]
    headers = [{"x-pgmq-group": g} if g else {"other": 1} for g in groups]
    pair.same(
        "SELECT * FROM pgmq.send_batch(%s, %s::jsonb[], %s::jsonb[])",
        [Q, jsonb_array([{"i": i} for i in range(len(groups))]), jsonb_array(headers)],
    )


@pytest.mark.parametrize(
    ("function", "ordered"),
    [("read_grouped", False), ("read_grouped_rr", True), ("read_grouped_head", False)],
)
def test_grouped_reads(pair: Pair, function: str, ordered: bool) -> None:
    """read_grouped_rr orders its rows (round robin); the others return RETURNING order (D5)."""
    create(pair)
    _send_grouped(pair)
    call = sql.SQL("SELECT * FROM pgmq.{}(queue_name => %s, vt => %s::integer, qty => %s::integer)").format(
        sql.Identifier(function)
    )
    steps: list[tuple[str, Any]] = [
        ("read", 3),
        ("read", 2),
        ("delete", [1, 2]),
        ("read", 4),
        ("vt0", [3]),
        ("read", 10),
        ("read", 10),
    ]
    for step, value in steps:
        if step == "read":
            outcome = pair.same(call, [Q, LONG, value], ordered=ordered)
            assert outcome.columns == MESSAGE_RECORD
        elif step == "delete":
            pair.same("SELECT * FROM pgmq.delete(%s, %s::bigint[])", [Q, value], ordered=False)
        else:
            pair.same("SELECT * FROM pgmq.set_vt(%s, %s::bigint[], 0)", [Q, value], ordered=False)
        pair.assert_same_state()


@pytest.mark.parametrize("function", ["read_grouped", "read_grouped_rr", "read_grouped_head"])
def test_grouped_reads_with_poll(pair: Pair, function: str) -> None:
    create(pair)
    poll = sql.SQL(
        "SELECT * FROM pgmq.{}(queue_name => %s, vt => %s::integer, qty => %s::integer,"
        " max_poll_seconds => 1, poll_interval_ms => 50)"
    ).format(sql.Identifier(f"{function}_with_poll"))
    assert pair.same(poll, [Q, LONG, 3], parallel=True).rows == ()
    _send_grouped(pair)
    pair.same(poll, [Q, LONG, 3], ordered=function == "read_grouped_rr")
    defaults = sql.SQL("SELECT * FROM pgmq.{}(%s, %s, %s)").format(sql.Identifier(f"{function}_with_poll"))
    pair.same(defaults, [Q, LONG, 2], ordered=function == "read_grouped_rr")
    pair.assert_same_state()
    pair.both_fail(poll, ["nope", LONG, 1], reference="42P01")


def test_fifo_indexes(pair: Pair) -> None:
    create(pair)
    create(pair, "other")
    pair.same("SELECT pgmq.create_fifo_index(queue_name => %s)", [Q])
    pair.same("SELECT pgmq.create_fifo_index(%s)", [Q])  # idempotent
    pair.same("SELECT pgmq.create_fifo_indexes_all()")
    # Both create q_<name>_fifo_idx on every queue table. What it indexes is an internal: the
    # reference a GIN index on headers, pgbroker a B-tree on (group key, msg_id).
    pair.same(
        r"""
        SELECT c.relname, ic.relname FROM pg_index i
        JOIN pg_class c ON c.oid = i.indrelid JOIN pg_class ic ON ic.oid = i.indexrelid
        WHERE c.relnamespace = 'pgmq'::regnamespace AND ic.relname LIKE '%\_fifo\_idx' ORDER BY 1
        """
    )
    pair.both_fail("SELECT pgmq.create_fifo_index('nope')", reference="42P01")


# -- topics (migration 0005) ------------------------------------------------------------------


BINDING = sql.SQL("pattern, queue_name, bound_at, compiled_regex")


def test_topic_bindings_and_routing(pair: Pair) -> None:
    for name in ("logs_all", "logs_error", "audit"):
        create(pair, name)
    bindings = [
        ("logs.#", "logs_all"),
        ("logs.*.error", "logs_error"),
        ("#.audit", "audit"),
        ("logs.#", "audit"),
    ]
    for pattern, queue in bindings:
        pair.same("SELECT pgmq.bind_topic(pattern => %s, queue_name => %s)", [pattern, queue])
    pair.same("SELECT pgmq.bind_topic(%s, %s)", ["logs.#", "logs_all"])  # idempotent
    listed = pair.same("SELECT * FROM pgmq.list_topic_bindings() WHERE false")  # columns only
    assert listed.columns == (
        ("pattern", "text"),
        ("queue_name", "text"),
        ("bound_at", TIMESTAMPTZ),
        ("compiled_regex", "text"),
    )
    pair.same("SELECT * FROM pgmq.list_topic_bindings(queue_name => %s) WHERE false", ["audit"])
    pair.same(sql.SQL("SELECT {} FROM pgmq.list_topic_bindings()").format(BINDING))
    pair.same(sql.SQL("SELECT {} FROM pgmq.list_topic_bindings(queue_name => %s)").format(BINDING), ["audit"])
    pair.same("SELECT * FROM pgmq.test_routing(routing_key => %s) WHERE false", ["logs.x"])
    # The reference orders by pattern only: rows of one pattern come in any order. 'logs' and
    # 'audit' match no pattern: pgmq's '#' needs a word of its own.
    for key in ("logs.api.error", "x.audit", "logs.audit", "a.b.c.audit", "nothing.here", "logs", "audit"):
        pair.same("SELECT * FROM pgmq.test_routing(routing_key => %s)", [key], ordered=False)
    assert pair.same(
        "SELECT pgmq.unbind_topic(pattern => %s, queue_name => %s)", ["logs.#", "audit"]
    ).rows == ((True,),)
    assert pair.same("SELECT pgmq.unbind_topic(%s, %s)", ["logs.#", "audit"]).rows == ((False,),)
    assert pair.same("SELECT pgmq.unbind_topic(%s, %s)", ["logs.#", "nope"]).rows == ((False,),)
    pair.same("SELECT pattern, queue_name FROM pgmq.topic_bindings ORDER BY 1, 2")
    # Dropping a queue removes its bindings.
    pair.same("SELECT pgmq.drop_queue(%s)", ["logs_error"])
    pair.same(sql.SQL("SELECT {} FROM pgmq.list_topic_bindings()").format(BINDING))


def test_topic_hash_matches_as_in_pgmq(pair: Pair) -> None:
    """pgmq compiles 'logs.#' to '^logs\\..*$': 'logs' does not match it, nor does 'audit' match
    '#.audit'. AMQP's "zero or more words" is pgbroker.bind_topic_amqp's (engine/test_topics.py)."""
    create(pair, "logs_all")
    create(pair, "audit")
    pair.same("SELECT pgmq.bind_topic(%s, %s)", ["logs.#", "logs_all"])
    pair.same("SELECT pgmq.bind_topic(%s, %s)", ["#.audit", "audit"])
    pair.same("SELECT pgmq.bind_topic(%s, %s)", ["a.#.z", "audit"])
    for key in ("logs", "audit", "logs.x", "x.audit", "a.z", "a.b.z", "a.b.c.z"):
        pair.same("SELECT * FROM pgmq.test_routing(%s)", [key])
        pair.same("SELECT pgmq.send_topic(%s, '{}')", [key])
    pair.assert_same_state()


def test_topic_validation(pair: Pair) -> None:
    for key in ("logs", "logs.error", "a-b_c.d9"):
        pair.same("SELECT pgmq.validate_routing_key(%s)", [key])
    bad_keys: list[str | None] = ["", None, ".a", "a.", "a..b", "a b", "a.*", "a.#", "x" * 256]
    for bad_key in bad_keys:
        pair.both_fail("SELECT pgmq.validate_routing_key(%s::text)", [bad_key], reference="P0001")
    for pattern in ("#", "logs.*", "*.error", "app.*.#", "a-b_c.d9"):
        pair.same("SELECT pgmq.validate_topic_pattern(%s)", [pattern])
    bad_patterns: list[str | None] = [
        "",
        None,
        ".a",
        "a.",
        "a..b",
        "a.**",
        "a.##",
        "a.*#",
        "a.#*",
        "a!",
        "x" * 256,
    ]
    for bad_pattern in bad_patterns:
        pair.both_fail("SELECT pgmq.validate_topic_pattern(%s::text)", [bad_pattern], reference="P0001")
    create(pair)
    pair.both_fail("SELECT pgmq.bind_topic('a.*', 'nope')", reference="P0001")
    pair.both_fail("SELECT pgmq.bind_topic('a..b', %s)", [Q], reference="P0001")
    pair.both_fail("SELECT pgmq.bind_topic('a.*', '')", reference="P0001")
    pair.both_fail("SELECT pgmq.unbind_topic('', %s)", [Q], reference="P0001")
    pair.both_fail("SELECT * FROM pgmq.test_routing('a..b')", reference="P0001")


def test_send_topic_and_send_batch_topic(pair: Pair) -> None:
    for name in ("t_a", "t_b", "t_c"):
        create(pair, name)
    for pattern, queue in (("orders.*", "t_a"), ("orders.#", "t_b"), ("orders.#", "t_a"), ("#.eu", "t_c")):
        pair.same("SELECT pgmq.bind_topic(%s, %s)", [pattern, queue])
    forms: list[tuple[str, list[Any]]] = [
        ("SELECT pgmq.send_topic(routing_key => %s, msg => %s)", ["orders.new", Jsonb({"f": 1})]),
        (
            "SELECT pgmq.send_topic(routing_key => %s, msg => %s, delay => %s::integer)",
            ["orders.x.eu", Jsonb(2), 0],
        ),
        (
            "SELECT pgmq.send_topic(routing_key => %s, msg => %s, headers => %s, delay => %s::integer)",
            ["orders.eu", Jsonb({"f": 3}), Jsonb({"h": 1}), LONG],
        ),
        ("SELECT pgmq.send_topic(%s, %s)", ["nobody.listens", Jsonb({"f": 4})]),
    ]
    for query, args in forms:
        outcome = pair.same(query, args)
        assert outcome.columns == (("send_topic", "integer"),)
    batch = "SELECT * FROM pgmq.send_batch_topic(routing_key => %s, msgs => %s::jsonb[]"
    msgs = jsonb_array([{"b": 1}, {"b": 2}])
    heads = jsonb_array([{"h": 1}, None])
    batch_forms: list[tuple[str, list[Any]]] = [
        (batch + ")", ["orders.new", msgs]),
        (batch + ", headers => %s::jsonb[])", ["orders.eu", msgs, heads]),
        (batch + ", delay => %s::integer)", ["orders.a.eu", msgs, LONG]),
        (batch + ", delay => %s::timestamptz)", ["orders.new", msgs, PAST]),
        (batch + ", headers => %s::jsonb[], delay => %s::integer)", ["orders.eu", msgs, heads, 0]),
        (batch + ", headers => %s::jsonb[], delay => %s::timestamptz)", ["x.eu", msgs, heads, FUTURE]),
        (batch + ")", ["no.match", msgs]),
    ]
    for query, args in batch_forms:
        outcome = pair.same(query, args)
        assert outcome.columns == (("queue_name", "text"), ("msg_id", "bigint"))
    pair.assert_same_state()
    pair.both_fail("SELECT pgmq.send_topic('a..b', '{}')", reference="P0001")
    pair.both_fail("SELECT pgmq.send_topic('orders.new', NULL::jsonb)", reference="P0001")
    pair.both_fail("SELECT pgmq.send_topic('orders.new', '{}', -1)", reference="P0001")
    pair.both_fail(batch + ")", ["orders.new", []], reference="P0001")
    pair.both_fail(batch + ", headers => %s::jsonb[])", ["orders.new", msgs, heads[:1]], reference="P0001")
    pair.assert_same_state()


def test_send_batch_topic_checks_the_batch_even_when_no_queue_matches(pair: Pair) -> None:
    """The reference validates msgs and headers before routing, so a bad batch fails either way."""
    create(pair)
    pair.same("SELECT pgmq.bind_topic('orders.*', %s)", [Q])
    batch = "SELECT * FROM pgmq.send_batch_topic(routing_key => %s, msgs => %s::jsonb[]"
    for key in ("orders.new", "no.match"):
        pair.both_fail(batch + ")", [key, []], reference="P0001")
        pair.both_fail(batch + ")", [key, None], reference="P0001")
        pair.both_fail(
            batch + ", headers => %s::jsonb[])",
            [key, jsonb_array([1, 2]), jsonb_array([1])],
            reference="P0001",
        )
    pair.assert_same_state()


# -- notifications (migration 0003) -----------------------------------------------------------


def _notifications(
    conn: Conn, channel: str, action: str | None, params: Params = None
) -> list[tuple[str, str]]:
    """Channels and payloads ``channel`` receives while ``action`` runs on another session."""
    dsn = conn.info.dsn
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        if action is not None:
            with psycopg.connect(dsn, autocommit=True) as other:
                other.execute(action, params)
        return [(n.channel, n.payload) for n in listener.notifies(timeout=0.1)]


def test_notify_insert_throttles(pair: Pair) -> None:
    create(pair)
    create(pair, "other")
    empty = pair.same("SELECT * FROM pgmq.list_notify_insert_throttles()")
    assert empty.columns == (
        ("queue_name", "text"),
        ("throttle_interval_ms", "integer"),
        ("last_notified_at", TIMESTAMPTZ),
    )
    pair.same("SELECT pgmq.enable_notify_insert(queue_name => %s)", [Q])  # default 250 ms
    pair.same("SELECT pgmq.enable_notify_insert(queue_name => %s, throttle_interval_ms => %s)", ["other", 0])
    pair.same("SELECT * FROM pgmq.list_notify_insert_throttles()")
    pair.same("SELECT pgmq.update_notify_insert(queue_name => %s, throttle_interval_ms => %s)", [Q, 1000])
    pair.same("SELECT * FROM pgmq.list_notify_insert_throttles()")
    pair.same("SELECT pgmq.disable_notify_insert(queue_name => %s)", ["other"])
    pair.same("SELECT pgmq.disable_notify_insert(%s)", ["other"])  # idempotent
    pair.same("SELECT * FROM pgmq.list_notify_insert_throttles()")
    pair.both_fail("SELECT pgmq.enable_notify_insert(%s, -1)", [Q], reference="P0001")
    pair.both_fail("SELECT pgmq.enable_notify_insert('nope')", reference="P0001")
    pair.both_fail("SELECT pgmq.update_notify_insert(%s, -1)", [Q], reference="P0001")
    pair.both_fail("SELECT pgmq.update_notify_insert('nope', 10)", reference="P0001")
    pair.both_fail("SELECT pgmq.update_notify_insert('other', 10)", reference="P0001")  # not enabled
    # Dropping the queue removes its throttle row.
    pair.same("SELECT pgmq.drop_queue(%s)", [Q])
    pair.same("SELECT * FROM pgmq.list_notify_insert_throttles()")


def test_notify_insert_sends_notifications(pair: Pair) -> None:
    create(pair)
    channel = f"pgmq.q_{Q}.INSERT"
    send_one = "SELECT pgmq.send('jobs', '{}')"
    send_three = "SELECT pgmq.send_batch('jobs', ARRAY['{}', '{}', '{}']::jsonb[])"
    for conn in (pair.a, pair.b):
        assert _notifications(conn, channel, send_one) == []  # not enabled yet
    pair.same("SELECT pgmq.enable_notify_insert(%s, 0)", [Q])
    got = [
        (_notifications(c, channel, send_one), _notifications(c, channel, send_three))
        for c in (pair.a, pair.b)
    ]
    assert got[0] == got[1]
    assert got[0][0] == [(channel, "")]
    # A long throttle: the first insert notifies, the next ones within the interval do not.
    pair.same("SELECT pgmq.update_notify_insert(%s, 600000)", [Q])
    got = [
        (_notifications(c, channel, send_one), _notifications(c, channel, send_one)) for c in (pair.a, pair.b)
    ]
    assert got[0] == got[1] == ([(channel, "")], [])
    pair.same("SELECT pgmq.disable_notify_insert(%s)", [Q])
    for conn in (pair.a, pair.b):
        assert _notifications(conn, channel, send_one) == []


def test_deliberate_notify_works_for_mixed_case_queue_names(pair: Pair) -> None:
    """D10: the reference (1.13.0) trigger looks its throttle row up by the lower-cased table name,
    so a queue named 'Orders' never notifies; pgbroker announces it on "pgmq.q_Orders.INSERT", the
    name as given, as pgmq 1.13.1 does (its PR #593)."""
    create(pair, "Orders")
    pair.same("SELECT pgmq.enable_notify_insert('Orders', 0)")
    pair.same("SELECT queue_name, throttle_interval_ms FROM pgmq.list_notify_insert_throttles()")
    channel = "pgmq.q_Orders.INSERT"
    action = "SELECT pgmq.send('Orders', '{}')"
    assert _notifications(pair.a, channel, action) == [(channel, "")]
    assert _notifications(pair.b, channel, action) == []


# -- partitioned queues (migration 0006) ------------------------------------------------------


def test_partitioned_queue_without_the_pg_partman_extension_fails_on_both(pair: Pair) -> None:
    """Neither database has CREATE EXTENSION pg_partman (whether or not the server could)."""
    pair.both_fail("SELECT pgmq.create_partitioned('parts')", reference="P0001")
    pair.both_fail("SELECT pgmq.create_partitioned('parts', '1 day', '7 days')", reference="P0001")
    pair.assert_same_state()


def test_partitioned_queue(pair: Pair, pg_partman: bool) -> None:
    if not pg_partman:
        pytest.skip("pg_partman is not available on the test server (pg_available_extensions)")
    for conn in (pair.a, pair.b):
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_partman")
    pair.same("SELECT pgmq.create_partitioned(queue_name => %s)", ["parts"])
    pair.same(
        "SELECT pgmq.create_partitioned(queue_name => %s, partition_interval => %s,"
        " retention_interval => %s)",
        ["daily", "1 day", "7 days"],
    )
    pair.same("SELECT pgmq.create_partitioned(%s, %s, %s, %s)", ["small", "10", "100", 2])
    pair.both_fail("SELECT pgmq.create_partitioned('bad', '10', '100', 0)", reference="P0001")
    for queue in ("parts", "daily", "small"):
        send_many(pair, [{"n": n} for n in range(5)], name=queue)
        read(pair, LONG, 2, name=queue)
        pair.same("SELECT * FROM pgmq.archive(%s, %s::bigint[])", [queue, [1, 3]], ordered=False)
        pair.same("SELECT * FROM pgmq.pop(%s)", [queue])
        pair.same(sql.SQL("SELECT {} FROM pgmq.metrics(%s)").format(METRICS), [queue])
        # What only pgmq's functions take (0018), on partitioned tables too.
        pair.same("SELECT * FROM pgmq.send(%s, '{}', -5)", [queue])
        pair.same("SELECT * FROM pgmq.read(%s, -1, NULL::integer)", [queue], ordered=False)
        pair.same("SELECT * FROM pgmq.pop(%s, NULL::integer)", [queue], ordered=False)
    pair.same("SELECT * FROM pgmq.list_queues()", ordered=False)
    pair.assert_same_state()
    pair.same("SELECT pgmq.drop_queue('parts')")
    pair.assert_same_state()


def test_convert_archive_partitioned(pair: Pair, pg_partman: bool) -> None:
    if not pg_partman:
        pytest.skip("pg_partman is not available on the test server (pg_available_extensions)")
    for conn in (pair.a, pair.b):
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_partman")
    create(pair)
    create(pair, "timed")
    for queue in (Q, "timed"):
        send_many(pair, [{"n": n} for n in range(4)], name=queue)
        pair.same("SELECT * FROM pgmq.archive(%s, %s::bigint[])", [queue, [1, 2]], ordered=False)
    pair.same("SELECT pgmq.convert_archive_partitioned(table_name => %s)", [Q])
    pair.same(
        "SELECT pgmq.convert_archive_partitioned(table_name => %s, partition_interval => %s,"
        " retention_interval => %s, leading_partition => %s)",
        ["timed", "1 day", "30 days", 5],
    )
    pair.same("SELECT pgmq.convert_archive_partitioned(%s)", [Q])  # already partitioned: a notice
    pair.same("SELECT * FROM pgmq.archive(%s, %s::bigint[])", [Q, [3]])
    pair.same("SELECT * FROM pgmq.archive(%s, %s::bigint[])", ["timed", [3, 4]], ordered=False)
    pair.same(
        "SELECT c.relname, c.relkind FROM pg_class c WHERE c.relnamespace = 'pgmq'::regnamespace"
        " AND c.relname IN ('a_jobs', 'a_timed') ORDER BY 1"
    )


def test_detach_archive_is_a_no_op(pair: Pair) -> None:
    create(pair)
    send_many(pair, [{"n": 1}])
    pair.same("SELECT * FROM pgmq.archive(%s, 1::bigint)", [Q])
    pair.same("SELECT pgmq.detach_archive(queue_name => %s)", [Q])  # deprecated: a warning, nothing else
    pair.assert_same_state()


def test_convert_archive_partitioned_of_a_missing_queue_is_a_no_op(pair: Pair) -> None:
    """The reference only raises a NOTICE when the archive table does not exist."""
    pair.same("SELECT pgmq.convert_archive_partitioned(table_name => %s)", ["nope"])
    pair.assert_same_state()


def test_convert_archive_partitioned_without_the_pg_partman_extension_fails_on_both(pair: Pair) -> None:
    create(pair)
    send_many(pair, [{"n": 1}])
    pair.same("SELECT * FROM pgmq.archive(%s, 1::bigint)", [Q])
    # The reference fails by accident: it formats pg_partman's schema (NULL) as an identifier.
    pair.both_fail("SELECT pgmq.convert_archive_partitioned(%s)", [Q], reference="22004")
    pair.assert_same_state()  # and nothing was changed


# -- random operation sequences ---------------------------------------------------------------

VtChoice = Literal[0, 3600, "past", "future"]


@dataclass(frozen=True)
class Op:
    """One call of a random sequence; ``kind`` names it, the other fields are its arguments."""

    kind: str
    msgs: tuple[Any, ...] = ()
    headers: tuple[Any, ...] | None = None
    delay: VtChoice | None = None
    vt: VtChoice = 0
    qty: int = 1
    ids: tuple[int, ...] = ()
    conditional: Any = None

    def call(self, queue: str) -> tuple[sql.Composed, list[Any], bool]:
        """(SQL, parameters, whether rows are compared in order)."""
        args: list[Arg] = [("queue_name", "", queue)]
        if self.kind in ("send", "send_batch"):
            single = self.kind == "send"
            if single:
                args.append(("msg", "::jsonb", Jsonb(self.msgs[0])))
            else:
                args.append(("msgs", "::jsonb[]", jsonb_array(self.msgs)))
            if self.headers is not None:
                head = ("headers", "::jsonb", Jsonb(self.headers[0]))
                args.append(head if single else ("headers", "::jsonb[]", jsonb_array(self.headers)))
            return (*named_call(self.kind, [*args, *_time_arg("delay", self.delay)]), True)
        if self.kind == "read":
            args += [("vt", "::integer", self.vt), ("qty", "::integer", self.qty)]
            if self.conditional is not None:
                args.append(("conditional", "::jsonb", Jsonb(self.conditional)))
            return (*named_call("read", args), False)
        if self.kind == "pop":
            return (*named_call("pop", [*args, ("qty", "::integer", self.qty)]), False)
        if self.kind in ("delete", "archive", "set_vt"):
            single = len(self.ids) == 1
            if single:
                args.append(("msg_id", "::bigint", self.ids[0]))
            else:
                args.append(("msg_ids", "::bigint[]", list(self.ids)))
            if self.kind == "set_vt":
                return (*named_call("set_vt", [*args, *_time_arg("vt", self.vt)]), False)
            # The single forms return a boolean, the array forms the ids (D5: in any order).
            return (*named_call(self.kind, args, rows=not single), single)
        if self.kind == "purge":
            return (*named_call("purge_queue", args, rows=False), True)
        assert self.kind == "metrics"
        query, params = named_call("metrics", args)
        # default_partition_length has a test of its own (test_metrics_default_partition_length_*).
        return sql.SQL("SELECT {} FROM ({}) m").format(METRICS, query), params, True


def _time_arg(name: str, choice: VtChoice | None) -> list[Arg]:
    if choice is None:
        return []
    if choice == "past":
        return [(name, "::timestamptz", PAST)]
    if choice == "future":
        return [(name, "::timestamptz", FUTURE)]
    return [(name, "::integer", choice)]


messages = st.fixed_dictionaries({"tag": st.sampled_from(["a", "b"]), "n": st.integers(0, 99)})
header_values = st.one_of(st.none(), st.fixed_dictionaries({"h": st.integers(0, 9)}))
times: st.SearchStrategy[VtChoice] = st.sampled_from([0, 3600, "past", "future"])
short_times: st.SearchStrategy[VtChoice] = st.sampled_from([0, 3600])
msg_ids = st.integers(1, 14)


@st.composite
def batches(draw: st.DrawFn) -> Op:
    msgs = tuple(draw(st.lists(messages, min_size=1, max_size=4)))
    headers = draw(st.none() | st.lists(header_values, min_size=len(msgs), max_size=len(msgs)).map(tuple))
    return Op("send_batch", msgs=msgs, headers=headers, delay=draw(st.none() | times))


operations = st.one_of(
    st.builds(
        Op,
        kind=st.just("send"),
        msgs=messages.map(lambda m: (m,)),
        headers=st.none() | header_values.map(lambda h: (h,)),
        delay=st.none() | times,
    ),
    batches(),
    st.builds(
        Op,
        kind=st.just("read"),
        vt=short_times,
        qty=st.integers(0, 5),
        conditional=st.none() | st.sampled_from([{}, {"tag": "a"}, {"tag": "b"}]),
    ),
    st.builds(Op, kind=st.just("pop"), qty=st.integers(0, 4)),
    st.builds(
        Op,
        kind=st.sampled_from(["delete", "archive"]),
        ids=st.lists(msg_ids, min_size=1, max_size=4).map(tuple),
    ),
    st.builds(Op, kind=st.just("set_vt"), ids=st.lists(msg_ids, min_size=1, max_size=4).map(tuple), vt=times),
    st.just(Op("purge")),
    st.just(Op("metrics")),
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(operations, min_size=1, max_size=20))
def test_random_sequences_give_the_same_results(pair: Pair, ops: list[Op]) -> None:
    queue = f"h_{uuid.uuid4().hex[:12]}"  # one queue per example, in the same two databases
    create(pair, queue)
    try:
        for op in ops:
            query, params, ordered = op.call(queue)
            outcome = pair.same(query, params, ordered=ordered)
            if op.kind in ("read", "pop", "set_vt"):
                assert_ordered_by_msg_id(outcome)
            assert queue_state(pair.a, queue) == queue_state(pair.b, queue), f"after {op}"
    finally:
        pair.a.execute("SELECT pgmq.drop_queue(%s)", [queue])
        pair.b.execute("SELECT pgmq.drop_queue(%s)", [queue])
