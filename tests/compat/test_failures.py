"""pgmq's contract from the pgmq side, failures included: every pgmq function, called as pgmq's
users and tests call it, fails (or succeeds) in pgbroker exactly as in the reference pgmq 1.13 SQL.

Each call runs on a pgbroker database and on a reference one (see test_differential.py, whose
harness this uses) and must give the same SQLSTATE, the same message and the same notices and
warnings (level, SQLSTATE, text) before it; a call that succeeds must give the same rows and the
same notices. pgbroker's errors carry its own code in DETAIL (``pgbroker PB00n``), which its
client maps to its typed exceptions: ``test_pgbroker_codes_map_to_typed_errors`` checks that
mapping for every failing call here. The differences that remain are in
``DELIBERATE_DIFFERENCES`` (deliberate.py) and are asserted at the end of this module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from pgbroker import errors
from tests.compat.deliberate import DELIBERATE_DIFFERENCES
from tests.compat.differential import Pair, connected_pair, create, left_unchanged, run, send_many

# The queue every failing call may use; it holds two messages.
JOBS = "jobs"
LONG_NAME = "x" * 48

# (SQLSTATE of the reference, call). Grouped by function; named arguments as clients write them.
FAILURES: list[tuple[str, str]] = [
    # names: pgmq checks the characters first (format_table_name), then the length
    ("P0001", "SELECT pgmq.create('a$b')"),
    ("P0001", "SELECT pgmq.create('a;b')"),
    ("P0001", "SELECT pgmq.create('a--b')"),
    ("P0001", "SELECT pgmq.create($$a'b$$)"),
    ("P0001", "SELECT pgmq.create(repeat('x', 48))"),
    ("P0001", "SELECT pgmq.create(repeat('x', 48) || '$')"),
    ("22004", "SELECT pgmq.create(NULL)"),
    ("P0001", "SELECT pgmq.create_non_partitioned('a$b')"),
    ("P0001", "SELECT pgmq.create_non_partitioned(repeat('x', 48))"),
    ("P0001", "SELECT pgmq.create_unlogged('a;b')"),
    ("P0001", "SELECT pgmq.create_unlogged(repeat('x', 48))"),
    ("22004", "SELECT pgmq.create_unlogged(NULL)"),
    ("P0001", "SELECT pgmq.validate_queue_name(repeat('x', 48))"),
    ("P0001", "SELECT pgmq.format_table_name('dollar$fail', 'q')"),
    ("P0001", "SELECT pgmq.format_table_name('double--hyphen-fail', 'a')"),
    ("P0001", "SELECT pgmq.format_table_name('semicolon;fail', 'a')"),
    ("P0001", "SELECT pgmq.format_table_name($$single'quote-fail$$, 'a')"),
    ("P0001", "SELECT pgmq.delete('abc where false; create table public.attack_vector(id int); x', 1)"),
    ("P0001", "SELECT pgmq.drop_queue('a$b')"),
    ("P0001", "SELECT pgmq.drop_queue('a$b', true)"),
    # a queue that does not exist: the missing table (42P01), or a NULL name (22004)
    ("42P01", "SELECT pgmq.purge_queue('nope')"),
    ("42P01", "SELECT pgmq.purge_queue('')"),
    ("22004", "SELECT pgmq.purge_queue(NULL)"),
    ("P0001", "SELECT pgmq.purge_queue('a$b')"),
    ("42P01", "SELECT * FROM pgmq.metrics('nope')"),
    ("22004", "SELECT * FROM pgmq.metrics(NULL)"),
    ("42P01", "SELECT * FROM pgmq.send('nope', '{}')"),
    ("42P01", "SELECT * FROM pgmq.send(repeat('x', 48), '{}')"),
    ("42P01", "SELECT * FROM pgmq.send('', '{}')"),
    ("22004", "SELECT * FROM pgmq.send(NULL, '{}')"),
    ("P0001", "SELECT * FROM pgmq.send('a$b', '{}')"),
    ("42P01", "SELECT * FROM pgmq.send('nope', '{}', '{}'::jsonb)"),
    ("42P01", "SELECT * FROM pgmq.send('nope', '{}', 1)"),
    ("42P01", "SELECT * FROM pgmq.send('nope', '{}', now())"),
    ("42P01", "SELECT * FROM pgmq.send_batch('nope', ARRAY['{}'::jsonb])"),
    ("42P01", "SELECT * FROM pgmq.send_batch('nope', ARRAY['{}'::jsonb], ARRAY['{}'::jsonb])"),
    ("42P01", "SELECT * FROM pgmq.read('nope', 1, 1)"),
    ("42P01", "SELECT * FROM pgmq.read('nope', 1, 1, '{\"a\": 1}')"),
    ("P0001", "SELECT * FROM pgmq.read('a$b', 1, 1)"),
    ("22004", "SELECT * FROM pgmq.read(NULL, 1, 1)"),
    ("42P01", "SELECT * FROM pgmq.read_with_poll('nope', 1, 1, 1)"),
    ("42P01", "SELECT * FROM pgmq.pop('nope')"),
    ("42P01", "SELECT * FROM pgmq.pop('nope', 3)"),
    ("42P01", "SELECT pgmq.delete('nope', 1)"),
    ("42P01", "SELECT * FROM pgmq.delete('nope', ARRAY[1::bigint])"),
    ("42P01", "SELECT pgmq.archive('nope', 1)"),
    ("42P01", "SELECT * FROM pgmq.archive('nope', ARRAY[1::bigint])"),
    ("42P01", "SELECT * FROM pgmq.set_vt('nope', 1, 1)"),
    ("42P01", "SELECT * FROM pgmq.set_vt('nope', 1, now())"),
    ("42P01", "SELECT * FROM pgmq.set_vt('nope', ARRAY[1::bigint], 1)"),
    ("42P01", "SELECT * FROM pgmq.set_vt('nope', ARRAY[1::bigint], now())"),
    ("42P01", "SELECT * FROM pgmq.read_grouped('nope', 1, 1)"),
    ("42P01", "SELECT * FROM pgmq.read_grouped_rr('nope', 1, 1)"),
    ("42P01", "SELECT * FROM pgmq.read_grouped_head('nope', 1, 1)"),
    ("42P01", "SELECT * FROM pgmq.read_grouped_with_poll('nope', 1, 1, 1)"),
    ("42P01", "SELECT * FROM pgmq.read_grouped_rr_with_poll('nope', 1, 1, 1)"),
    ("42P01", "SELECT * FROM pgmq.read_grouped_head_with_poll('nope', 1, 1, 1)"),
    ("42P01", "SELECT pgmq.create_fifo_index('nope')"),
    ("P0001", "SELECT pgmq.create_fifo_index('a$b')"),
    # arguments: batches, a negative qty (pgmq's LIMIT), bad JSON
    ("P0001", "SELECT * FROM pgmq.send_batch('jobs', ARRAY[]::jsonb[])"),
    ("P0001", "SELECT * FROM pgmq.send_batch('jobs', NULL::jsonb[])"),
    ("P0001", "SELECT * FROM pgmq.send_batch('nope', ARRAY[]::jsonb[])"),  # the batch before the queue
    ("P0001", "SELECT * FROM pgmq.send_batch('jobs', ARRAY['1'::jsonb, '2'], ARRAY['1'::jsonb])"),
    ("P0001", "SELECT * FROM pgmq.send_batch('jobs', ARRAY['1'::jsonb], ARRAY[]::jsonb[])"),
    ("P0001", "SELECT * FROM pgmq.send_batch('jobs', ARRAY['1'::jsonb], ARRAY[]::jsonb[], 5)"),
    ("2201W", "SELECT * FROM pgmq.read('jobs', 1, -1)"),
    ("2201W", "SELECT * FROM pgmq.read('jobs', -1, -1)"),
    ("2201W", "SELECT * FROM pgmq.read_with_poll('jobs', 1, -1, 1)"),
    ("2201W", "SELECT * FROM pgmq.pop('jobs', -1)"),
    ("2201W", "SELECT * FROM pgmq.read_grouped('jobs', 1, -1)"),
    ("2201W", "SELECT * FROM pgmq.read_grouped_head('jobs', 1, -1)"),
    # notifications
    ("P0001", "SELECT pgmq.enable_notify_insert('nope')"),
    ("P0001", "SELECT pgmq.enable_notify_insert('jobs', -1)"),
    ("P0001", "SELECT pgmq.enable_notify_insert('nope', -1)"),
    ("P0001", "SELECT pgmq.enable_notify_insert('a$b')"),
    ("P0001", "SELECT pgmq.update_notify_insert('jobs', -1)"),
    ("P0001", "SELECT pgmq.update_notify_insert('nope', 10)"),
    ("P0001", "SELECT pgmq.update_notify_insert('jobs', 10)"),  # not enabled
    ("P0001", "SELECT pgmq.disable_notify_insert('a$b')"),
    ("22004", "SELECT pgmq.disable_notify_insert(NULL)"),
    # partitioned queues, in a database without pg_partman
    ("P0001", "SELECT pgmq.create_partitioned('parts')"),
    ("P0001", "SELECT pgmq.create_partitioned('parts', '1 day', '7 days')"),
    ("P0001", "SELECT pgmq.create_partitioned('a$b')"),
    ("P0001", "SELECT pgmq.create_partitioned(repeat('x', 48))"),
    ("P0001", "SELECT pgmq.create_partitioned(NULL)"),
    ("22004", "SELECT pgmq.convert_archive_partitioned('jobs')"),
    ("P0001", "SELECT pgmq.convert_archive_partitioned('a$b')"),
    ("22004", "SELECT pgmq.convert_archive_partitioned(NULL)"),
    # topics
    ("P0001", "SELECT pgmq.validate_routing_key('')"),
    ("P0001", "SELECT pgmq.validate_routing_key(NULL)"),
    ("P0001", "SELECT pgmq.validate_routing_key('a b')"),
    ("P0001", "SELECT pgmq.validate_routing_key('.a')"),
    ("P0001", "SELECT pgmq.validate_routing_key('a.')"),
    ("P0001", "SELECT pgmq.validate_routing_key('a..b')"),
    ("P0001", "SELECT pgmq.validate_routing_key('a.*')"),
    ("P0001", "SELECT pgmq.validate_routing_key(repeat('x', 256))"),
    ("P0001", "SELECT pgmq.validate_topic_pattern('')"),
    ("P0001", "SELECT pgmq.validate_topic_pattern('a!')"),
    ("P0001", "SELECT pgmq.validate_topic_pattern('a.**')"),
    ("P0001", "SELECT pgmq.validate_topic_pattern('a.##')"),
    ("P0001", "SELECT pgmq.validate_topic_pattern('a.*#')"),
    ("P0001", "SELECT pgmq.validate_topic_pattern('a.#*')"),
    ("P0001", "SELECT pgmq.validate_topic_pattern('.a')"),
    ("P0001", "SELECT pgmq.bind_topic('a.*', 'nope')"),
    ("P0001", "SELECT pgmq.bind_topic('a..b', 'jobs')"),
    ("P0001", "SELECT pgmq.bind_topic('a..b', 'nope')"),  # the pattern before the queue
    ("P0001", "SELECT pgmq.bind_topic('a.*', '')"),
    ("P0001", "SELECT pgmq.bind_topic('a.*', NULL)"),
    ("P0001", "SELECT pgmq.bind_topic(NULL, 'jobs')"),
    ("P0001", "SELECT pgmq.unbind_topic('', 'jobs')"),
    ("P0001", "SELECT pgmq.unbind_topic('a', '')"),
    ("P0001", "SELECT pgmq.unbind_topic(NULL, NULL)"),
    ("P0001", "SELECT * FROM pgmq.test_routing('a..b')"),
    ("P0001", "SELECT pgmq.send_topic('a..b', '{}')"),
    ("P0001", "SELECT pgmq.send_topic('x.y', NULL::jsonb)"),
    ("P0001", "SELECT pgmq.send_topic('x.y', '{}', -1)"),
    ("P0001", "SELECT pgmq.send_topic('x.y', '{}', '{}'::jsonb, -1)"),
    ("P0001", "SELECT * FROM pgmq.send_batch_topic('x.y', ARRAY[]::jsonb[])"),
    ("P0001", "SELECT * FROM pgmq.send_batch_topic('x.y', NULL::jsonb[])"),
    ("P0001", "SELECT * FROM pgmq.send_batch_topic('x..y', ARRAY['1'::jsonb])"),
    ("P0001", "SELECT * FROM pgmq.send_batch_topic('x.y', ARRAY['1'::jsonb, '2'], ARRAY['1'::jsonb])"),
]

# Calls that fail in Postgres itself, with no pgbroker code: bad input on the way in, a NULL in a
# NOT NULL column. The same error on both; kept here so that a change cannot turn one into a success.
POSTGRES_FAILURES: list[tuple[str, str]] = [
    ("23502", "SELECT pgmq.enable_notify_insert('jobs', NULL)"),
    ("22P02", "SELECT * FROM pgmq.send('jobs', '{bad json')"),
    ("22P02", "SELECT * FROM pgmq.send_batch('jobs', ARRAY['{\"a\": '::jsonb])"),
    ("22P02", "SELECT * FROM pgmq.read('jobs', 1, 1, 'nope')"),
    ("22P05", "SELECT * FROM pgmq.send('jobs', '\"\\u0000\"')"),
]


@pytest.fixture(scope="module")
def prepared(module_dsns: tuple[str, str]) -> Iterator[Pair]:
    """The module's pair of databases, each with queue 'jobs' holding two messages."""
    with connected_pair(module_dsns) as pair:
        create(pair, JOBS)
        send_many(pair, [{"n": 1}, {"n": 2}], name=JOBS)
        yield pair


@pytest.fixture
def unchanged(prepared: Pair) -> Iterator[Pair]:
    """The prepared pair, which the test must leave as it found it."""
    with left_unchanged(prepared) as pair:
        yield pair


@pytest.mark.parametrize(("reference", "query"), FAILURES)
def test_fails_as_pgmq_fails(unchanged: Pair, reference: str, query: str) -> None:
    unchanged.both_fail(query, reference=reference)


@pytest.mark.parametrize(("reference", "query"), POSTGRES_FAILURES)
def test_postgres_errors_are_the_same(unchanged: Pair, reference: str, query: str) -> None:
    a, b = unchanged.both(query)
    assert b.sqlstate == reference
    assert (a.sqlstate, a.error, a.notices) == (b.sqlstate, b.error, b.notices)


def test_round_robin_with_a_negative_qty_reads_nothing(unchanged: Pair) -> None:
    """pgmq's read_grouped_rr compares a row number with qty instead of using LIMIT."""
    assert unchanged.same("SELECT * FROM pgmq.read_grouped_rr('jobs', 1, -1)").rows == ()


# pgbroker's code in DETAIL and the typed exception it maps to, for every SQLSTATE above.
TYPED: dict[str, type[errors.PgbrokerError]] = {
    "PB001": errors.InvalidQueueName,
    "PB002": errors.QueueNotFound,
    "PB007": errors.InvalidArgument,
    "PB008": errors.MissingExtension,
}


@pytest.mark.parametrize(("reference", "query"), FAILURES)
def test_pgbroker_codes_map_to_typed_errors(prepared: Pair, reference: str, query: str) -> None:
    """The client reads pgbroker's code from DETAIL: a pgmq error is still a typed exception, with
    the server's SQLSTATE, pgbroker's code and a hint saying how to fix it."""
    with pytest.raises(psycopg.Error) as caught:
        prepared.a.execute(query)
    error = errors.from_postgres(caught.value)
    assert error.sqlstate == reference
    assert isinstance(error, TYPED[error.code or ""]), (error.code, error)
    assert error.hint, f"no hint for {query}"
    missing = reference in ("42P01",) or "does not exist" in (caught.value.diag.message_primary or "")
    if missing and error.code == "PB002":
        assert isinstance(error, errors.QueueNotFound)


def test_names_map_to_the_typed_error_of_their_problem(prepared: Pair) -> None:
    """A missing queue is QueueNotFound; a name pgbroker could never create, InvalidQueueName."""
    cases = {
        "SELECT * FROM pgmq.send('nope', '{}')": errors.QueueNotFound,
        "SELECT * FROM pgmq.send(repeat('x', 48), '{}')": errors.InvalidQueueName,
        "SELECT * FROM pgmq.send('', '{}')": errors.InvalidQueueName,
        "SELECT * FROM pgmq.send('a$b', '{}')": errors.InvalidQueueName,
        "SELECT pgmq.bind_topic('a.*', 'nope')": errors.QueueNotFound,
        "SELECT pgmq.enable_notify_insert('nope')": errors.QueueNotFound,
    }
    for query, cls in cases.items():
        with pytest.raises(psycopg.Error) as caught:
            prepared.a.execute(query)
        assert type(errors.from_postgres(caught.value)) is cls, query


# Calls that succeed, in this order, on a fresh pair: the same rows and the same notices and
# warnings (pgmq's CREATE ... IF NOT EXISTS notices, its deprecation warnings, ...).
SUCCESSES: list[str] = [
    "SELECT pgmq.create('jobs')",
    "SELECT pgmq.create('jobs')",
    "SELECT pgmq.create_non_partitioned('jobs')",
    "SELECT pgmq.create_unlogged('jobs')",
    "SELECT pgmq.create_unlogged('fast')",
    "SELECT pgmq.create_unlogged('fast')",
    "SELECT pgmq.create('Mixed_Case')",
    "SELECT pgmq.create('Mixed_Case')",
    "SELECT pgmq.create(repeat('y', 47))",
    "SELECT pgmq.create(repeat('y', 47))",
    "SELECT pgmq.validate_queue_name('a$b')",
    "SELECT pgmq.validate_queue_name(NULL)",
    "SELECT pgmq.format_table_name(NULL, 'q')",
    "SELECT pgmq.format_table_name('cat-dog', 'a')",
    "SELECT pgmq.send('jobs', NULL)",
    "SELECT pgmq.send('JOBS', '{}')",
    "SELECT msg_id, message FROM pgmq.read('jobs', 0, 1)",
    "SELECT msg_id, message FROM pgmq.read('jobs', 1, NULL::integer) WHERE false",
    "SELECT pgmq.drop_queue('nope')",
    "SELECT pgmq.drop_queue(NULL)",
    "SELECT pgmq.drop_queue('nope', true)",
    "SELECT pgmq.drop_queue('fast', false)",
    "SELECT pgmq.detach_archive('jobs')",
    "SELECT pgmq.detach_archive('nope')",
    "SELECT pgmq.enable_notify_insert('jobs')",
    "SELECT pgmq.enable_notify_insert('jobs', 0)",
    "SELECT pgmq.update_notify_insert('jobs', 10)",
    "SELECT pgmq.disable_notify_insert('jobs')",
    "SELECT pgmq.disable_notify_insert('jobs')",
    "SELECT pgmq.disable_notify_insert('nope')",
    "SELECT pgmq.create_fifo_index('jobs')",
    "SELECT pgmq.create_fifo_index('jobs')",
    "SELECT pgmq.create_fifo_indexes_all()",
    "SELECT pgmq.convert_archive_partitioned('nope')",
    "SELECT pgmq.bind_topic('logs.#', 'jobs')",
    "SELECT pgmq.bind_topic('logs.#', 'jobs')",
    "SELECT pgmq.bind_topic('#', 'Mixed_Case')",
    "SELECT pgmq.validate_routing_key('a-b_c.d9')",
    "SELECT pgmq.validate_topic_pattern('app.*.#')",
    "SELECT pattern, queue_name, compiled_regex FROM pgmq.list_topic_bindings() ORDER BY 1, 2",
    "SELECT * FROM pgmq.test_routing('logs')",
    "SELECT * FROM pgmq.test_routing('logs.x')",
    "SELECT pgmq.send_topic('logs', '{}')",
    "SELECT pgmq.send_topic('logs.x', '{}')",
    "SELECT pgmq.send_topic('x.y', '{}', NULL::jsonb, 0)",
    "SELECT pgmq.unbind_topic('logs.#', 'jobs')",
    "SELECT pgmq.unbind_topic('logs.#', 'jobs')",
    "SELECT pgmq.purge_queue('jobs')",
    "SELECT pgmq.drop_queue('Mixed_Case')",
    "SELECT pgmq.drop_queue('jobs')",
]


def test_succeeds_as_pgmq_succeeds(pair: Pair) -> None:
    for query in SUCCESSES:
        pair.same(query)
    pair.assert_same_state()


@pytest.fixture
def pair(dsn: str, reference_dsn: str) -> Iterator[Pair]:
    """A fresh pgbroker database and a fresh reference database."""
    with connected_pair((dsn, reference_dsn)) as fresh:
        yield fresh


def _with_pg_partman(pair: Pair, pg_partman: bool) -> None:
    if not pg_partman:
        pytest.skip("pg_partman is not available on the test server (pg_available_extensions)")
    for conn in (pair.a, pair.b):
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_partman")


def test_convert_archive_partitioned_notices_and_failures(pair: Pair, pg_partman: bool) -> None:
    """pgmq's base test: a 47-character name fails on the index name Postgres truncates; 46
    characters give the truncation notice and succeed; a second conversion is a notice."""
    _with_pg_partman(pair, pg_partman)
    for name in ("z" * 47, "w" * 46, "conv"):
        create(pair, name)
        send_many(pair, [{"n": 1}, {"n": 2}], name=name)
        pair.same("SELECT * FROM pgmq.archive(%s, 1::bigint)", [name])
    failed = pair.both_fail("SELECT pgmq.convert_archive_partitioned(%s)", ["z" * 47], reference="42P07")
    assert failed.notices
    assert failed.notices[0][1] == "42622"  # identifier ... will be truncated
    for name in ("w" * 46, "conv"):
        pair.same("SELECT pgmq.convert_archive_partitioned(%s, '1 day', '7 days')", [name])
        pair.same("SELECT pgmq.convert_archive_partitioned(%s)", [name])  # already partitioned
        pair.same("SELECT * FROM pgmq.archive(%s, 2::bigint)", [name])
    # D12: pgmq leaves the archived rows in a_<name>_old; pgbroker moves them into partitions.
    rows = "SELECT count(*) FROM pgmq.a_conv"
    assert (run(pair.a, rows).rows, run(pair.b, rows).rows) == (((2,),), ((1,),))


def test_create_partitioned_checks_in_pgmq_order(pair: Pair, pg_partman: bool) -> None:
    _with_pg_partman(pair, pg_partman)
    pair.both_fail("SELECT pgmq.create_partitioned('bad', '10', '100', 0)", reference="P0001")
    pair.both_fail("SELECT pgmq.create_partitioned('a$b', '10', '100', 0)", reference="P0001")
    pair.both_fail("SELECT pgmq.create_partitioned(repeat('x', 48), '10', '100', 0)", reference="P0001")
    pair.both_fail("SELECT pgmq.create_partitioned(NULL)", reference="22004")
    pair.same("SELECT pgmq.create_partitioned('parts')")
    pair.same("SELECT pgmq.send('parts', '{}')")
    pair.same("SELECT pgmq.drop_queue('parts', true)")
    pair.assert_same_state()


# -- the deliberate differences that remain (deliberate.py) -----------------------------------


def test_deliberate_names_are_found_in_any_case(pair: Pair) -> None:
    """D2: pgmq's functions that look meta up compare names exactly."""
    create(pair, JOBS)
    for query in ("SELECT pgmq.bind_topic('a.*', 'JOBS')", "SELECT pgmq.enable_notify_insert('Jobs')"):
        a, b = pair.both(query)
        assert not a.failed
        assert b.failed  # 'Queue "JOBS" does not exist' (P0001), a foreign key violation (23503)


def test_deliberate_partitioned_create_is_idempotent(pair: Pair, pg_partman: bool) -> None:
    """D11: pgmq fails inside pg_partman on a second create_partitioned."""
    _with_pg_partman(pair, pg_partman)
    pair.same("SELECT pgmq.create_partitioned('parts')")
    a, b = pair.both("SELECT pgmq.create_partitioned('parts')")
    assert not a.failed
    assert b.failed
    assert pair.deliberate("SELECT pgmq.create_partitioned('p2', 'x', 'y')", pgbroker="PB007").failed


def test_deliberate_convert_archive_of_mixed_case_queue(pair: Pair, pg_partman: bool) -> None:
    """D12: pgmq renames the archive's index through an unquoted identifier."""
    _with_pg_partman(pair, pg_partman)
    for name in ("Mixed_Case", "with-dash"):
        create(pair, name)
        a, b = pair.both("SELECT pgmq.convert_archive_partitioned(%s, '1 day', '7 days')", [name])
        assert not a.failed, a
        assert b.failed, b
    # For any name, pgmq leaves the archived rows in a_<name>_old; pgbroker moves them.
    create(pair, "plain")
    send_many(pair, [{"n": 1}], name="plain")
    pair.same("SELECT * FROM pgmq.archive('plain', 1::bigint)")
    pair.same("SELECT pgmq.convert_archive_partitioned('plain', '1 day', '7 days')")
    old = "SELECT to_regclass('pgmq.a_plain_old') IS NULL, (SELECT count(*) FROM pgmq.a_plain)"
    assert (run(pair.a, old).rows, run(pair.b, old).rows) == (((True, 1),), ((False, 0),))


def test_deliberate_grouped_poll_reads_once_without_waiting(pair: Pair) -> None:
    """D13: with max_poll_seconds = 0 pgmq returns before reading; pgbroker reads once."""
    create(pair, JOBS)
    send_many(pair, [{"n": 1}], name=JOBS)
    for function in ("read_with_poll", "read_grouped_with_poll"):
        poll = sql.SQL("SELECT msg_id FROM pgmq.{}('jobs', 60, 1, 0)").format(sql.Identifier(function))
        a, b = pair.both(poll)
        assert (b.rows, a.failed) == ((), False)
    a, b = pair.both("SELECT * FROM pgmq.read_with_poll('nope', 1, 1, 0)")
    assert (a.sqlstate, b.failed) == ("42P01", False)


def test_deliberate_errors_pgmq_does_not_have_keep_pb_codes(pair: Pair) -> None:
    """D14: limits pgmq does not have fail with their class PB code."""
    create(pair, JOBS)
    pair.a.execute("SELECT * FROM pgbroker.set_policy(%s, max_depth => 1)", [JOBS])
    pair.a.execute("SELECT pgmq.send(%s, %s)", [JOBS, Jsonb({"n": 1})])
    outcome = run(pair.a, "SELECT pgmq.send(%s, %s)", [JOBS, Jsonb({"n": 2})])
    assert outcome.sqlstate == "PB006"
    pair.a.execute("SET pgbroker.max_message_bytes = '10'")
    outcome = run(pair.a, "SELECT pgmq.send(%s, %s)", [JOBS, Jsonb({"x": "y" * 100})])
    assert outcome.sqlstate == "PB005"  # checked before the depth


def test_deliberate_error_context_is_pgbrokers(unchanged: Pair) -> None:
    """D15: the same error, raised from other functions."""
    contexts: list[str] = []
    for conn in (unchanged.a, unchanged.b):
        with pytest.raises(psycopg.errors.RaiseException) as caught:
            conn.execute("SELECT pgmq.create(repeat('a', 48))")
        contexts.append(caught.value.diag.context or "")
    ours, theirs = contexts
    assert "pgmq.create_non_partitioned(text)" in theirs
    assert ours != theirs


def test_every_deliberate_difference_is_asserted() -> None:
    """Each entry of DELIBERATE_DIFFERENCES names tests that exist."""
    here = Path(__file__).parent
    defined: set[str] = set()
    for module in here.glob("test_*.py"):
        tree = ast.parse(module.read_text())
        defined |= {f"{module.name}::{node.name}" for node in tree.body if isinstance(node, ast.FunctionDef)}
    for key, difference in DELIBERATE_DIFFERENCES.items():
        for test in difference.tests:
            assert test in defined, f"{key}: {test} does not exist"
