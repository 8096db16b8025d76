"""Query-plan regression tests: a read finds its rows through the ready and timed partial indexes and
touches a number of buffers set by the batch, not by the backlog.

Two queues are built (fast, with INSERT ... SELECT, then a real pgmq.read that leases the oldest
messages for an hour): a big one with 200k ready and 20k in flight, and one ten times smaller.
The statement that picks the rows is the engine's own: its text comes from
pgbroker._visible_sql, the fragment pgmq.read and pgmq.pop run, so these tests follow the engine
as it changes. It is explained with EXPLAIN (ANALYZE, BUFFERS). The whole read (pick and lease,
as pgmq.read runs it inside PL/pgSQL) is seen through auto_explain with log_nested_statements,
whose plans come back to the test's session as notices (bench.buffers.PlanCapture).
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Iterator
from typing import Any, LiteralString

import psycopg
import pytest
from bench.buffers import PlanCapture
from psycopg import sql

from tests.support.postgres import dsn_for_db

pytestmark = pytest.mark.slow

BIG = ("plan_big", 200_000, 20_000)
SMALL = ("plan_small", 20_000, 2_000)
BATCH = 10

#: Shared buffers a pick of 10 may touch: index descents and the ten heap rows, whatever the backlog.
PICK_BOUND = 50
#: Shared buffers a whole read of 10 may touch, the lease (UPDATE) of the ten rows included.
READ_BOUND = 200

Conn = psycopg.Connection[tuple[Any, ...]]


def _build(conn: Conn, name: str, ready: int, in_flight: int) -> None:
    table = sql.Identifier(f"q_{name}")
    conn.execute("SELECT pgmq.create(%s)", [name])
    # vt = enqueued_at = now(): exactly what a send without delay stores.
    conn.execute(
        sql.SQL(
            "INSERT INTO pgmq.{} (vt, message) SELECT now(), jsonb_build_object('n', g) "
            "FROM generate_series(1, %s) g"
        ).format(table),
        [ready + in_flight],
    )
    conn.execute("SELECT count(*) FROM pgmq.read(%s, 3600, %s)", [name, in_flight])
    conn.execute(sql.SQL("VACUUM ANALYZE pgmq.{}").format(table))


@pytest.fixture(scope="module")
def plan_dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    """A database with the two backlogs, shared by this module's tests (each read leases 10 more)."""
    name = f"plans_{uuid.uuid4().hex}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template_db)
            )
        )
    try:
        dsn = dsn_for_db(pg_admin_dsn, name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for queue, ready, in_flight in (BIG, SMALL):
                _build(conn, queue, ready, in_flight)
        yield dsn
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def plan_conn(plan_dsn: str) -> Iterator[Conn]:
    with psycopg.connect(plan_dsn, autocommit=True) as conn:
        # PL/pgSQL's EXECUTE ... USING plans with the values at hand; so does a custom plan.
        conn.execute("SET plan_cache_mode = force_custom_plan")
        yield conn


def _explain_pick(conn: Conn, queue: str) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the engine's pick of 10 on ``queue``: the top plan node."""
    fragment = conn.execute("SELECT pgbroker._visible_sql(%s, NULL)", [f"q_{queue}"]).fetchone()
    assert fragment is not None
    assert fragment[0], "pgbroker._visible_sql returned nothing"
    statement = f"p_{uuid.uuid4().hex[:12]}"
    # $1 qty, $2 conditional (unused without one), $3 the reader's clock: as pgmq.read passes them.
    conn.execute(
        sql.SQL("PREPARE {} (integer, jsonb, timestamptz) AS WITH {} SELECT msg_id FROM picked").format(
            sql.Identifier(statement), sql.SQL(fragment[0])
        )
    )
    try:
        # EXPLAIN takes no parameters: the arguments are literals.
        explain = sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {} ({}, NULL, clock_timestamp())")
        row = conn.execute(explain.format(sql.Identifier(statement), sql.Literal(BATCH))).fetchone()
    finally:
        conn.execute(sql.SQL("DEALLOCATE {}").format(sql.Identifier(statement)))
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _buffers(node: dict[str, Any]) -> int:
    return int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])


def _assert_scans_are_targeted(plan: dict[str, Any], queue: str) -> None:
    table = f"q_{queue}"
    for node in _nodes(plan):
        if node.get("Relation Name") != table:
            continue
        assert node["Node Type"] not in ("Seq Scan", "Bitmap Heap Scan"), (
            f"{node['Node Type']} on {table}: a read must walk an index, never the table"
        )
        if node.get("Index Name") == f"{table}_pkey":
            # The primary key serves lookups of known msg_ids only, never a walk in msg_id order.
            assert "Index Cond" in node, f"a scan of {table}_pkey without a condition walks every message"
        assert node.get("Rows Removed by Filter", 0) <= BATCH, (
            f"{node.get('Index Name')} scanned {node.get('Rows Removed by Filter')} rows it then discarded"
        )


def test_pick_uses_the_ready_and_timed_partial_indexes(plan_conn: Conn) -> None:
    queue = BIG[0]
    plan = _explain_pick(plan_conn, queue)

    indexes = {node.get("Index Name") for node in _nodes(plan)}
    assert f"q_{queue}_ready_idx" in indexes
    assert f"q_{queue}_vt_idx" in indexes
    _assert_scans_are_targeted(plan, queue)
    assert plan["Actual Rows"] == BATCH


def test_pick_buffers_stay_flat_with_the_backlog(plan_conn: Conn) -> None:
    big = _buffers(_explain_pick(plan_conn, BIG[0]))
    small = _buffers(_explain_pick(plan_conn, SMALL[0]))

    assert big <= PICK_BOUND, f"a pick of {BATCH} touched {big} buffers ({BIG[1]:,} ready, {BIG[2]:,} leased)"
    assert small <= PICK_BOUND
    # Ten times the backlog adds at most an index level, never a share of the rows.
    assert big <= small + 10, f"{big} buffers with the big backlog against {small} with the small one"


def _read_buffers(conn: Conn, queue: str, reads: int = 5) -> tuple[int, int, set[str]]:
    """Median buffers of (the whole pgmq.read call, its main statement), and that statement's indexes."""
    capture = PlanCapture(conn)
    assert capture.enable(), "auto_explain needs a superuser session"
    capture.call("SELECT * FROM pgmq.read(%s, 30, %s)", [queue, BATCH])  # warm the caches
    calls, statements, indexes = [], [], set()
    for _ in range(reads):
        plans = capture.call("SELECT * FROM pgmq.read(%s, 30, %s)", [queue, BATCH])
        assert len(plans.rows) == BATCH
        calls.append(plans.top.buffers)
        statements.append(plans.main.buffers)
        indexes |= set(plans.main.indexes)
        assert "Seq Scan" not in plans.main.node_types
    return int(statistics.median(calls)), int(statistics.median(statements)), indexes


def test_read_buffers_including_the_lease_stay_flat_with_the_backlog(plan_conn: Conn) -> None:
    big_call, big_statement, big_indexes = _read_buffers(plan_conn, BIG[0])
    _, small_statement, _ = _read_buffers(plan_conn, SMALL[0])

    assert {f"q_{BIG[0]}_ready_idx", f"q_{BIG[0]}_vt_idx"} <= big_indexes
    assert big_statement <= READ_BOUND, f"a read of {BATCH} touched {big_statement} buffers"
    assert big_call <= READ_BOUND + 20, f"the pgmq.read call touched {big_call} buffers"
    assert small_statement <= READ_BOUND
    # Flat: a backlog ten times as large costs a few index levels more, not ten times the buffers.
    assert big_statement <= small_statement * 1.5, (
        f"{big_statement} buffers with the big backlog against {small_statement} with the small one"
    )


def test_reads_skip_the_dead_entries_left_by_consumed_messages(plan_conn: Conn) -> None:
    """60,000 messages read and acked, no VACUUM: their dead entries sit at the head of the ready
    index. Reads start at queue_head.ready_from instead (see migration 0012_hot_path), so a read of 10 still
    touches about what it does on a settled queue."""
    name = "plan_churn"
    table = sql.Identifier(f"q_{name}")
    plan_conn.execute("SELECT pgmq.create(%s)", [name])
    fill = "INSERT INTO pgmq.{} (vt, message) SELECT now(), '{{}}' FROM generate_series(1, 100000)"
    plan_conn.execute(sql.SQL(fill).format(table))
    plan_conn.execute(sql.SQL("VACUUM ANALYZE pgmq.{}").format(table))
    for _ in range(60):
        read = plan_conn.execute("SELECT receipt FROM pgbroker.read(%s, 30, 1000)", [name])
        receipts = [r[0] for r in read]
        plan_conn.execute("SELECT count(*) FROM pgbroker.ack(%s, %s::text[], false)", [name, receipts])
    # Reads advance ready_from now and then; three advances (each in its own transaction, as this
    # connection is in autocommit) make sure it has passed the consumed messages.
    for _ in range(3):
        plan_conn.execute("SELECT pgbroker._advance_head(%s, %s)", [name, f"q_{name}"])
    head = "SELECT ready_from FROM pgbroker.queue_head WHERE queue_name = %s"
    row = plan_conn.execute(head, [name]).fetchone()
    assert row is not None
    assert row[0] > 60_000

    call, statement, indexes = _read_buffers(plan_conn, name)
    assert f"q_{name}_ready_idx" in indexes
    assert statement <= READ_BOUND, f"a read of {BATCH} after 60,000 acks touched {statement} buffers"
    assert call <= READ_BOUND + 20


def test_the_head_advance_stays_flat_with_a_backlog_the_statistics_have_not_seen(plan_conn: Conn) -> None:
    """A queue analyzed while empty (autovacuum does it to a queue that drains), then a burst: the
    planner expects no rows in the head's range. The advance (one read in 16 runs it) must still
    stop at the first ready message, not walk the burst: a min() the planner may take as an
    aggregate over the whole range did, 30 ms a call over 100,000 messages."""
    name = "plan_stale"
    table = sql.Identifier(f"q_{name}")
    plan_conn.execute("SELECT pgmq.create(%s)", [name])
    plan_conn.execute(sql.SQL("ALTER TABLE pgmq.{} SET (autovacuum_enabled = off)").format(table))
    plan_conn.execute(sql.SQL("ANALYZE pgmq.{}").format(table))
    fill = "INSERT INTO pgmq.{} (vt, message) SELECT now(), '{{}}' FROM generate_series(1, 100000)"
    plan_conn.execute(sql.SQL(fill).format(table))
    advance = "SELECT pgbroker._advance_head(%s, %s)"
    for _ in range(2):  # the first makes the head, the second records the candidates
        plan_conn.execute(advance, [name, f"q_{name}"])

    capture = PlanCapture(plan_conn)
    assert capture.enable(), "auto_explain needs a superuser session"
    plans = capture.call(advance, [name, f"q_{name}"])
    on_queue = [p for p in plans.nested if f"pgmq.q_{name}" in p.text and "msg_id_seq" not in p.text]
    assert on_queue, "the advance ran no statement on the queue's table"
    worst = max(on_queue, key=lambda p: p.buffers)
    assert worst.buffers <= PICK_BOUND, f"the advance touched {worst.buffers} buffers: {worst.text}"
    assert plans.top.buffers <= READ_BOUND


#: Shared buffers a look-up of a queue's bounds may touch: an index descent and one heap page.
HEAD_BOUND = 5


def test_reads_find_the_bounds_in_one_step_whatever_a_held_horizon_keeps(
    plan_conn: Conn, plan_dsn: str
) -> None:
    """A REPEATABLE READ snapshot holds the horizon back (it has no transaction id, so the bounds
    advance as usual) while 600 advances move them: every row version an advance leaves is kept.
    A read must still find the bounds at once. When an advance updated the one row of the queue,
    each look-up walked every version kept (30,000 of them, about nine hours held: 0.7 -> 1.9 ms a
    read and delete); the bounds are now appended, and found by an index walk backwards."""
    name = "plan_head"
    plan_conn.execute("SELECT pgmq.create(%s)", [name])
    advance = "SELECT pgbroker._advance_head(%s, %s)"
    with psycopg.connect(plan_dsn) as pin:
        pin.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT count(*) FROM pgmq.meta")  # the snapshot, held to the end
        for _ in range(300):
            plan_conn.execute("SELECT pgmq.send(%s, '{}')", [name])
            plan_conn.execute("SELECT pgmq.delete(%s, msg_id) FROM pgmq.read(%s, 30, 1)", [name, name])
            for _ in range(2):  # each records a candidate, the second also moves the bound to it
                plan_conn.execute(advance, [name, f"q_{name}"])
        plan_conn.execute("SELECT pgmq.send(%s, '{}')", [name])
        row = plan_conn.execute("SELECT (pgbroker._queue_bounds(%s)).ready_from", [name]).fetchone()
        assert row is not None
        assert row[0] > 250, "the bounds did not move"

        capture = PlanCapture(plan_conn)
        assert capture.enable(), "auto_explain needs a superuser session"
        plans = capture.call("SELECT * FROM pgmq.read(%s, 30, 1)", [name])
        assert len(plans.rows) == 1
        # (the read's own statement, on the queue's table, takes timed_from from the same look-up;
        # an advance, one read in 16, writes the bounds: not a look-up)
        lookups = [
            p
            for p in plans.nested
            if "pgbroker.queue_head" in p.text
            and "pgmq.q_" not in p.text
            and p.text.lstrip().startswith("SELECT")
        ]
        assert lookups, "the read looked up no bounds"
        worst = max(lookups, key=lambda p: p.buffers)
        assert worst.buffers <= HEAD_BOUND, f"a look-up of the bounds touched {worst.buffers}: {worst.text}"
        pin.rollback()


#: What the planner is told a queue of the JIT test holds. A generic plan of a read guesses a tenth
#: of the table for LIMIT $n, so its cost grows with the backlog: about 16,000 at 1.5 million
#: messages, past jit_above_cost (100,000 by default) from about 10 million.
TOLD_ROWS = 100_000_000

#: Every hot call of a queue (%(q)s its name), each on a queue the planner believes huge.
JIT_CALLS: tuple[tuple[str, LiteralString], ...] = (
    ("send", "SELECT * FROM pgmq.send(%(q)s, '{\"n\": 0}')"),
    ("send_batch", "SELECT * FROM pgmq.send_batch(%(q)s, ARRAY['{}', '{}']::jsonb[])"),
    ("read", "SELECT * FROM pgmq.read(%(q)s, 30, 10)"),
    ("read, conditional", "SELECT * FROM pgmq.read(%(q)s, 30, 10, '{\"n\": 7}')"),
    ("read_with_poll", "SELECT * FROM pgmq.read_with_poll(%(q)s, 30, 10, 1, 10)"),
    ("pop", "SELECT * FROM pgmq.pop(%(q)s, 2)"),
    ("delete", "SELECT * FROM pgmq.delete(%(q)s, ARRAY(SELECT msg_id FROM pgmq.read(%(q)s, 30, 2)))"),
    ("archive", "SELECT * FROM pgmq.archive(%(q)s, ARRAY(SELECT msg_id FROM pgmq.read(%(q)s, 30, 2)))"),
    ("set_vt", "SELECT * FROM pgmq.set_vt(%(q)s, ARRAY(SELECT msg_id FROM pgmq.read(%(q)s, 30, 2)), 0)"),
    ("pgbroker.read", "SELECT * FROM pgbroker.read(%(q)s, 30, 10)"),
    (
        "pgbroker.ack",
        "SELECT * FROM pgbroker.ack(%(q)s, ARRAY(SELECT receipt FROM pgbroker.read(%(q)s, 30, 2)), false)",
    ),
    (
        "pgbroker.nack",
        "SELECT * FROM pgbroker.nack(%(q)s, ARRAY(SELECT receipt FROM pgbroker.read(%(q)s, 30, 2)))",
    ),
    (
        "pgbroker.extend",
        "SELECT * FROM pgbroker.extend(%(q)s, ARRAY(SELECT receipt FROM pgbroker.read(%(q)s, 30, 2)), 60)",
    ),
    (
        "pgbroker.fail",
        "SELECT * FROM pgbroker.fail(%(q)s, ARRAY(SELECT receipt FROM pgbroker.read(%(q)s, 30, 2)), 'x')",
    ),
    ("read_grouped", "SELECT * FROM pgmq.read_grouped(%(q)s, 30, 10)"),
    ("read_grouped_rr", "SELECT * FROM pgmq.read_grouped_rr(%(q)s, 30, 10)"),
    ("read_grouped_head", "SELECT * FROM pgmq.read_grouped_head(%(q)s, 30, 10)"),
    ("peek", "SELECT * FROM pgbroker.peek(%(q)s)"),
    (
        "pgbroker.consume",
        "SELECT * FROM pgbroker.consume(%(q)s, 30, 10,"
        " ARRAY(SELECT receipt FROM pgbroker.read(%(q)s, 30, 2)), false)",
    ),
)

#: The queue kinds whose calls take different statements: plain, by priority, limited (max in
#: flight), dead-lettering (max_deliveries) and bounded (max_depth, checked by every send).
JIT_QUEUES: tuple[tuple[str, LiteralString], ...] = (
    ("plan_jit_plain", ""),
    ("plan_jit_priority", ", priorities => true"),
    ("plan_jit_limited", ", max_in_flight => 1000"),
    ("plan_jit_dead_letter", ", max_deliveries => 5"),
    ("plan_jit_bounded", ", max_depth => 1000000000"),
)


def _tell_the_planner_it_is_huge(conn: Conn, name: str, policy: LiteralString) -> None:
    table = sql.Identifier(f"q_{name}")
    conn.execute("SELECT pgmq.create(%s)", [name])
    if policy:
        conn.execute(sql.SQL("SELECT pgbroker.set_policy(%s" + policy + ")"), [name])
    conn.execute(sql.SQL("ALTER TABLE pgmq.{} SET (autovacuum_enabled = off)").format(table))
    fill = (
        "INSERT INTO pgmq.{} (vt, message)"
        " SELECT now(), jsonb_build_object('n', g) FROM generate_series(1, 2000) g"
    )
    conn.execute(sql.SQL(fill).format(table))
    conn.execute(sql.SQL("VACUUM ANALYZE pgmq.{}").format(table))
    # The planner scales reltuples to the table's current size: a density as of a huge backlog.
    conn.execute(
        "UPDATE pg_class SET reltuples = %s WHERE oid = %s::regclass"
        " OR oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass)",
        [TOLD_ROWS, f"pgmq.q_{name}", f"pgmq.q_{name}"],
    )


def test_no_hot_call_compiles_its_statements_however_large_the_backlog(plan_conn: Conn) -> None:
    """A generic plan's cost grows with the table, and past jit_above_cost the server compiles the
    statement with LLVM at every execution (JIT code is not kept with a cached plan): 11-15 ms a
    pop of one message where it takes 0.2, from about ten million messages waiting. pgmq plans
    with its LIMIT known, so it never got there; a queue with a large backlog must not fall off
    this cliff, whatever its kind."""
    available = plan_conn.execute("SELECT pg_jit_available()").fetchone()
    if not (available and available[0]):
        pytest.skip("this server has no JIT provider: nothing to compile")
    plan_conn.execute("RESET plan_cache_mode")  # as a client's session runs
    capture = PlanCapture(plan_conn)
    assert capture.enable(), "auto_explain needs a superuser session"
    compiled = []
    for name, policy in JIT_QUEUES:
        _tell_the_planner_it_is_huge(plan_conn, name, policy)
        for label, call in JIT_CALLS:
            plans = capture.call(call, {"q": name})
            statements = [plans.top, *plans.nested]
            compiled += [f"{name}: {label}: {p.text.strip()[:80]}" for p in statements if p.jit]
    assert not compiled, "statements compiled with JIT:\n" + "\n".join(compiled)


def test_an_ack_of_many_receipts_checks_each_receipt_once(plan_conn: Conn) -> None:
    """An ack deletes the messages its receipts still hold: by msg_id (primary key, between the
    least and the greatest), each row then matched against the receipts. Planned as a join, the
    msg_id range made the planner expect a row or two and rescan the receipts for each: 300 acks
    of a batch compared 45,000 pairs (12 ms where 1.4 do). The receipts are hashed once."""
    name = "plan_acks"
    plan_conn.execute("SELECT pgmq.create(%s)", [name])
    plan_conn.execute("SELECT pgmq.send_batch(%s, array_fill('{}'::jsonb, ARRAY[2000]))", [name])
    receipts = [r[0] for r in plan_conn.execute("SELECT receipt FROM pgbroker.read(%s, 30, 300)", [name])]
    capture = PlanCapture(plan_conn)
    assert capture.enable(), "auto_explain needs a superuser session"
    plans = capture.call("SELECT * FROM pgbroker.ack(%s, %s::text[], false)", [name, receipts])
    assert len(plans.rows) == 300
    [ack] = [p for p in plans.nested if p.text.lstrip().startswith("WITH removed AS")]
    assert ack.max_loops <= 2, f"a node of the ack ran {ack.max_loops} times for 300 receipts"


def test_a_plain_queue_s_statements_probe_their_rows_with_no_range_to_compute(plan_conn: Conn) -> None:
    """A partitioned queue's statements also bound the msg_ids they probe by the least and the
    greatest of them, two subqueries over the array, so that run-time pruning skips the other
    partitions (test_partitioned.py). A plain queue has nothing to prune: computing the range
    anyway cost a pop of one message 7% of its rate and pgbroker.consume of one 11% (15 pgbench
    clients against one server)."""
    name = "plan_plain"
    plan_conn.execute("SELECT pgmq.create(%s)", [name])
    plan_conn.execute("SELECT pgmq.send_batch(%s, array_fill('{}'::jsonb, ARRAY[200]))", [name])
    capture = PlanCapture(plan_conn)
    assert capture.enable(), "auto_explain needs a superuser session"
    for call in (
        "SELECT * FROM pgmq.pop('plan_plain', 1)",
        "SELECT * FROM pgmq.read('plan_plain', 30, 10)",
        "SELECT * FROM pgmq.delete('plan_plain', ARRAY(SELECT msg_id FROM pgmq.read('plan_plain', 30, 10)))",
        "SELECT * FROM pgmq.archive('plan_plain', ARRAY(SELECT msg_id FROM pgmq.read('plan_plain', 30, 10)))",
        "SELECT * FROM pgbroker.ack('plan_plain',"
        " ARRAY(SELECT receipt FROM pgbroker.read('plan_plain', 30, 10)), false)",
        "SELECT * FROM pgbroker.consume('plan_plain', 30, 10,"
        " ARRAY(SELECT receipt FROM pgbroker.read('plan_plain', 30, 10)), true)",
    ):
        plans = capture.call(call, [])
        assert plans.rows, call
        changes = [
            p for p in plans.nested if p.node_types[:1] != ["Function Scan"] and "pgmq.q_plan_plain" in p.text
        ]
        assert changes, f"{call}: no statement on the queue's table"
        ranged = [p.text.strip()[:80] for p in changes if "Aggregate" in p.node_types]
        assert not ranged, f"{call}: a range computed for a plain queue: {ranged}"
