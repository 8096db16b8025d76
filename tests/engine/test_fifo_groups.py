"""FIFO groups: pgmq.read_grouped, read_grouped_rr, read_grouped_head, their poll forms, the FIFO index.

A message's group is ``headers->>'x-pgmq-group'`` (a default group without it). A group is
served only while none of its messages is in flight, in msg_id order, to one consumer at a time.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from pgbroker.errors import QueueNotFound, from_postgres
from tests.support.tables import Conn, a_ids, describe, q_ids

Q = "fifo"
GROUP = "x-pgmq-group"
READS = ["read_grouped", "read_grouped_rr", "read_grouped_head"]

MESSAGE_RECORD = [
    ("msg_id", "bigint"),
    ("read_ct", "integer"),
    ("enqueued_at", "timestamp with time zone"),
    ("last_read_at", "timestamp with time zone"),
    ("vt", "timestamp with time zone"),
    ("message", "jsonb"),
    ("headers", "jsonb"),
]


@pytest.fixture
def fifo(conn: Conn) -> Conn:
    """``conn`` with the empty queue 'fifo' created."""
    conn.execute("SELECT pgmq.create(%s)", [Q])
    return conn


def send(conn: Conn, group: str | None, body: Any = None, delay: int = 0) -> int:
    """Send one message in ``group`` (None: no group header) and return its msg_id."""
    headers = None if group is None else Jsonb({GROUP: group})
    row = conn.execute(
        "SELECT * FROM pgmq.send(%s, %s, %s::jsonb, %s::integer)",
        [Q, Jsonb(body if body is not None else {"g": group}), headers, delay],
    ).fetchone()
    assert row is not None
    return int(row[0])


def call(conn: Conn, function: str, qty: int, vt: int = 60) -> list[int]:
    """msg_ids one grouped read returns, in the order it returns them."""
    query = sql.SQL("SELECT msg_id FROM pgmq.{}(queue_name => %s, vt => %s, qty => %s)").format(
        sql.Identifier(function)
    )
    return [int(r[0]) for r in conn.execute(query, [Q, vt, qty]).fetchall()]


def delete(conn: Conn, *msg_ids: int) -> None:
    conn.execute("SELECT pgmq.delete(%s, %s::bigint[])", [Q, list(msg_ids)])


# -- contract ---------------------------------------------------------------------------------

SIGNATURES = (
    {(name, "queue_name text, vt integer, qty integer", "SETOF pgmq.message_record") for name in READS}
    | {
        (
            f"{name}_with_poll",
            "queue_name text, vt integer, qty integer, max_poll_seconds integer DEFAULT 5, "
            "poll_interval_ms integer DEFAULT 100",
            "SETOF pgmq.message_record",
        )
        for name in READS
    }
    | {
        ("create_fifo_index", "queue_name text", "void"),
        ("create_fifo_indexes_all", "", "void"),
    }
)


def test_grouped_functions_have_the_contract_signatures(conn: Conn) -> None:
    found = set(
        conn.execute(
            "SELECT proname, pg_get_function_arguments(oid), pg_get_function_result(oid)"
            " FROM pg_proc WHERE pronamespace = 'pgmq'::regnamespace"
        ).fetchall()
    )
    assert SIGNATURES - found == set()


@pytest.mark.parametrize("function", READS)
def test_grouped_reads_return_leased_message_records(fifo: Conn, function: str) -> None:
    msg_id = send(fifo, "a", {"k": 1})
    before = fifo.execute("SELECT clock_timestamp()").fetchone()
    assert before is not None
    cur = fifo.execute(sql.SQL("SELECT * FROM pgmq.{}(%s, 30, 5)").format(sql.Identifier(function)), [Q])
    assert describe(fifo, cur) == MESSAGE_RECORD
    [row] = cur.fetchall()
    assert row[0] == msg_id
    assert row[1] == 1
    assert row[3] >= before[0]
    assert 29 <= (row[4] - before[0]).total_seconds() <= 31
    assert (row[5], row[6]) == ({"k": 1}, {GROUP: "a"})


# -- semantics of each read -------------------------------------------------------------------


def test_read_grouped_fills_the_batch_from_the_oldest_group_first(fifo: Conn) -> None:
    a1, b1, a2, c1, a3, b2 = (send(fifo, g) for g in "abacab")
    assert call(fifo, "read_grouped", 4) == [a1, a2, a3, b1]
    # a and b now have messages in flight: only c is eligible, b2 waits behind b1.
    assert call(fifo, "read_grouped", 10) == [c1]
    assert call(fifo, "read_grouped", 10) == []
    delete(fifo, b1)
    assert call(fifo, "read_grouped", 10) == [b2]


def test_read_grouped_rr_takes_one_message_of_each_group_per_round(fifo: Conn) -> None:
    a1, b1, a2, c1, a3, c2, b2, a4 = (send(fifo, g) for g in "abacacba")
    assert call(fifo, "read_grouped_rr", 7) == [a1, b1, c1, a2, b2, c2, a3]
    assert call(fifo, "read_grouped_rr", 7) == []
    delete(fifo, a1, a2, a3)
    assert call(fifo, "read_grouped_rr", 7) == [a4]


def test_read_grouped_rr_with_fewer_slots_than_groups_takes_the_oldest_heads(fifo: Conn) -> None:
    a1, b1, _a2, c1 = (send(fifo, g) for g in "abac")
    assert call(fifo, "read_grouped_rr", 2) == [a1, b1]
    assert call(fifo, "read_grouped_rr", 2) == [c1]


def test_read_grouped_head_takes_at_most_one_message_per_group(fifo: Conn) -> None:
    a1, a2, b1, b2, c1 = (send(fifo, g) for g in "aabbc")
    assert call(fifo, "read_grouped_head", 2) == [a1, b1]
    assert call(fifo, "read_grouped_head", 10) == [c1]
    assert call(fifo, "read_grouped_head", 10) == []
    delete(fifo, a1, b1)
    assert call(fifo, "read_grouped_head", 10) == [a2, b2]


@pytest.mark.parametrize("function", READS)
def test_messages_without_a_group_header_share_the_default_group(fifo: Conn, function: str) -> None:
    plain = send(fifo, None)
    send(fifo, None)
    fifo.execute("SELECT pgmq.send(%s, '{}'::jsonb, '{\"other\": 1}'::jsonb)", [Q])  # headers without the key
    # pgmq's name for the default group, given explicitly, is the default group too.
    send(fifo, "_default_fifo_group")
    other = send(fifo, "a")
    got = call(fifo, function, 10)
    if function == "read_grouped":
        assert got == q_ids(fifo, Q)  # both groups' runs, the default group's first
    else:
        assert got[:2] == [plain, other]
    assert call(fifo, function, 10) == []


@pytest.mark.parametrize("function", READS)
def test_a_group_waits_while_its_head_is_in_flight_and_returns_when_acked(fifo: Conn, function: str) -> None:
    a1, a2, b1 = (send(fifo, g) for g in "aab")
    fifo.execute("SELECT * FROM pgmq.read(%s, 60, 1)", [Q])  # a plain read leases a1
    assert call(fifo, function, 10) == [b1]
    assert call(fifo, function, 10) == []
    fifo.execute("SELECT pgmq.archive(%s, %s::bigint)", [Q, a1])
    assert call(fifo, function, 10) == [a2]
    assert a_ids(fifo, Q) == [a1]


def test_an_expired_lease_hands_the_group_to_the_next_reader(fifo: Conn) -> None:
    a1, a2 = send(fifo, "a"), send(fifo, "a")
    assert call(fifo, "read_grouped", 10, vt=1) == [a1, a2]
    assert call(fifo, "read_grouped", 10) == []
    time.sleep(1.2)
    rows = fifo.execute("SELECT msg_id, read_ct FROM pgmq.read_grouped(%s, 60, 10)", [Q]).fetchall()
    assert rows == [(a1, 2), (a2, 2)]


@pytest.mark.parametrize("function", READS)
def test_a_delayed_message_holds_back_the_later_messages_of_its_group(fifo: Conn, function: str) -> None:
    # As in pgmq: a group's order is msg_id order, so nothing after a delayed message goes first.
    a1 = send(fifo, "a", delay=3600)
    a2, b1 = send(fifo, "a"), send(fifo, "b")
    assert call(fifo, function, 10) == [b1]
    fifo.execute("SELECT pgmq.set_vt(%s, %s::bigint, 0)", [Q, a1])  # a1 is due now
    expected = [a1, a2] if function != "read_grouped_head" else [a1]
    assert call(fifo, function, 10) == expected


@pytest.mark.parametrize("function", ["read_grouped", "read_grouped_rr"])
def test_a_run_stops_at_the_first_message_of_the_group_still_in_flight(fifo: Conn, function: str) -> None:
    # After a1 is nacked, a2 is still in flight: a1 may go again, a3 must wait for a2.
    # (pgmq would return a3 too: it takes every visible message of an eligible group.)
    a1, a2, a3 = send(fifo, "a"), send(fifo, "a"), send(fifo, "a")
    assert call(fifo, function, 2) == [a1, a2]
    fifo.execute("SELECT pgmq.set_vt(%s, %s::bigint, 0)", [Q, a1])
    assert call(fifo, function, 10) == [a1]
    delete(fifo, a1, a2)
    assert call(fifo, function, 10) == [a3]


@pytest.mark.parametrize("function", READS)
def test_a_group_leased_in_an_open_transaction_is_skipped_by_other_readers(
    fifo: Conn, dsn: str, function: str
) -> None:
    a1, b1, a2, b2 = (send(fifo, g) for g in "abab")
    with psycopg.connect(dsn) as holder:  # not autocommit: the read stays uncommitted
        assert call(holder, function, 1) == [a1]
        got = call(fifo, function, 10)
        assert got == ([b1] if function == "read_grouped_head" else [b1, b2])
        holder.rollback()
    # The rollback gave group a back, with a1 unread.
    rows = fifo.execute(
        sql.SQL("SELECT msg_id, read_ct FROM pgmq.{}(%s, 60, 10)").format(sql.Identifier(function)), [Q]
    ).fetchall()
    assert rows == ([(a1, 1), (a2, 1)] if function != "read_grouped_head" else [(a1, 1)])


# -- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize("function", READS + [f"{name}_with_poll" for name in READS])
def test_grouped_reads_take_pgmqs_arguments(fifo: Conn, function: str) -> None:
    """pgmq's terms (0018; tests/compat compares them with pgmq): a negative qty fails as pgmq's
    LIMIT does (2201W, pgbroker's PB007 in DETAIL), except in round robin, which compares a row
    number with it and reads nothing; a NULL vt fails on the row it would lease (23502); a
    negative vt leases into the past, so the message is read again at once."""
    send(fifo, "a")
    fn = sql.Identifier(function)
    call = sql.SQL("SELECT msg_id, read_ct FROM pgmq.{}(%s, %s, %s)").format(fn)
    if function.startswith("read_grouped_rr"):
        if function == "read_grouped_rr":  # a poll of nothing would wait its 5 s
            assert fifo.execute(call, [Q, 10, -1]).fetchall() == []
    else:
        with pytest.raises(psycopg.Error) as info:
            fifo.execute(call, [Q, 10, -1])
        assert info.value.sqlstate == "2201W"
        assert from_postgres(info.value).code == "PB007"
    with pytest.raises(psycopg.errors.NotNullViolation):
        fifo.execute(call, [Q, None, 1])
    assert fifo.execute("SELECT read_ct FROM pgmq.q_fifo").fetchall() == [(0,)]  # nothing leased
    assert fifo.execute(call, [Q, -1, 1]).fetchall() == [(1, 1)]
    assert fifo.execute(call, [Q, 60, 1]).fetchall() == [(1, 2)]  # the lease had ended
    with pytest.raises(psycopg.errors.UndefinedTable) as missing:
        fifo.execute(sql.SQL("SELECT * FROM pgmq.{}('missing', 10, 1)").format(fn))
    assert str(missing.value.diag.message_primary) == 'relation "pgmq.q_missing" does not exist'
    assert isinstance(from_postgres(missing.value), QueueNotFound)
    if not function.endswith("_with_poll"):  # a poll for 0 messages would wait its 5 s
        assert fifo.execute(sql.SQL("SELECT * FROM pgmq.{}(%s, 10, 0)").format(fn), [Q]).fetchall() == []


@pytest.mark.parametrize("function", [f"{name}_with_poll" for name in READS])
def test_poll_forms_take_pgmqs_poll_arguments(fifo: Conn, function: str) -> None:
    """A negative wait returns at once without reading; no pause between reads, or no deadline,
    still returns the messages there are (pgmq's terms, 0018)."""
    send(fifo, "a")
    poll = sql.SQL("SELECT msg_id FROM pgmq.{}(%s, 0, 1, %s, %s)").format(sql.Identifier(function))
    assert fifo.execute(poll, [Q, -1, 100]).fetchall() == []
    for seconds, interval in [(1, 0), (1, None), (None, 100)]:
        assert fifo.execute(poll, [Q, seconds, interval]).fetchall() == [(1,)]


# -- polling ----------------------------------------------------------------------------------


@pytest.mark.parametrize("function", [f"{name}_with_poll" for name in READS])
def test_poll_forms_return_as_soon_as_a_message_arrives(fifo: Conn, dsn: str, function: str) -> None:
    def send_later() -> None:
        time.sleep(0.5)
        with psycopg.connect(dsn, autocommit=True) as other:
            send(other, "late")

    sender = threading.Thread(target=send_later)
    started = time.monotonic()
    sender.start()
    cur = fifo.execute(
        sql.SQL(
            "SELECT * FROM pgmq.{}(queue_name => %s, vt => 60, qty => 5,"
            " max_poll_seconds => 10, poll_interval_ms => 50)"
        ).format(sql.Identifier(function)),
        [Q],
    )
    elapsed = time.monotonic() - started
    sender.join()
    assert describe(fifo, cur) == MESSAGE_RECORD
    assert [(r[1], r[6]) for r in cur.fetchall()] == [(1, {GROUP: "late"})]
    assert 0.4 <= elapsed < 5


@pytest.mark.parametrize("function", [f"{name}_with_poll" for name in READS])
def test_poll_forms_wait_max_poll_seconds_then_return_empty(fifo: Conn, function: str) -> None:
    send(fifo, "a", delay=3600)  # a group held back the whole time
    started = time.monotonic()
    rows = fifo.execute(
        sql.SQL("SELECT * FROM pgmq.{}(%s, 60, 5, max_poll_seconds => 1)").format(sql.Identifier(function)),
        [Q],
    ).fetchall()
    elapsed = time.monotonic() - started
    assert rows == []
    assert 0.9 <= elapsed < 4


def test_poll_defaults_are_five_seconds_and_100_ms(fifo: Conn) -> None:
    send(fifo, "a")
    rows = fifo.execute("SELECT msg_id FROM pgmq.read_grouped_with_poll(%s, 60, 1)", [Q]).fetchall()
    assert len(rows) == 1


# -- the FIFO index ---------------------------------------------------------------------------


def fifo_indexes(conn: Conn) -> list[tuple[str, str]]:
    return [
        (str(r[0]), str(r[1]))
        for r in conn.execute(
            "SELECT tablename, indexname FROM pg_indexes"
            " WHERE schemaname = 'pgmq' AND right(indexname, 9) = '_fifo_idx' ORDER BY 1, 2"
        ).fetchall()
    ]


def test_create_fifo_index_is_idempotent(fifo: Conn) -> None:
    fifo.execute("SELECT pgmq.create_fifo_index(%s)", [Q])
    fifo.execute("SELECT pgmq.create_fifo_index(%s)", [Q.upper()])  # any spelling of the name
    assert fifo_indexes(fifo) == [("q_fifo", "q_fifo_fifo_idx")]
    with pytest.raises(psycopg.errors.UndefinedTable) as info:
        fifo.execute("SELECT pgmq.create_fifo_index('missing')")
    assert isinstance(from_postgres(info.value), QueueNotFound)


def test_create_fifo_indexes_all_indexes_every_queue_once(fifo: Conn) -> None:
    fifo.execute("SELECT pgmq.create('other')")
    fifo.execute("SELECT pgmq.create_fifo_index('other')")
    fifo.execute("SELECT pgmq.create_fifo_indexes_all()")
    fifo.execute("SELECT pgmq.create_fifo_indexes_all()")
    assert fifo_indexes(fifo) == [("q_fifo", "q_fifo_fifo_idx"), ("q_other", "q_other_fifo_idx")]


def nested_plans(conn: Conn, query: sql.Composed) -> str:
    """Every plan (text) of the statements ``query`` runs, nested ones included, via auto_explain."""
    plans: list[str] = []
    conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET client_min_messages = log")
    try:
        conn.execute(query)
    finally:
        conn.execute("SET client_min_messages = notice")
    return "\n".join(plans)


@pytest.mark.parametrize("function", READS)
def test_grouped_reads_walk_the_fifo_index_once_it_exists(fifo: Conn, function: str) -> None:
    fifo.execute(
        "SELECT pgmq.send_batch(%s, array_agg('{}'::jsonb),"
        " array_agg(jsonb_build_object(%s::text, 'g' || i %% 200))) FROM generate_series(1, 4000) i",
        [Q, GROUP],
    )
    fifo.execute("ANALYZE pgmq.q_fifo")
    query = sql.SQL("SELECT * FROM pgmq.{}({}, 60, 5)").format(sql.Identifier(function), sql.Literal(Q))
    without = nested_plans(fifo, query)
    assert "Aggregate" in without  # heads from an aggregate over the whole table
    assert "q_fifo_fifo_idx" not in without

    fifo.execute("SELECT pgmq.create_fifo_index(%s)", [Q])
    fifo.execute("ANALYZE pgmq.q_fifo")
    with_index = nested_plans(fifo, query)
    # Heads come from a walk of the index, one probe per group; the run of an owned group is a
    # range scan of the same index. Nothing reads the whole table.
    assert "Recursive Union" in with_index
    assert "Index Scan using q_fifo_fifo_idx" in with_index
    assert "HashAggregate" not in with_index
    assert "Seq Scan on q_fifo" not in with_index


# -- concurrent consumers ---------------------------------------------------------------------


@pytest.mark.parametrize("function", READS)
def test_concurrent_grouped_consumers_never_share_a_group_and_keep_its_order(
    fifo: Conn, dsn: str, function: str
) -> None:
    groups: list[str | None] = [None, "a", "b", "c", "d"]
    per_group = 16
    rng = random.Random(7)
    plan = [(g, n) for g in groups for n in range(per_group)]
    # Interleave the groups randomly while keeping each group's own sequence in order.
    order = sorted(range(len(plan)), key=lambda i: (rng.random(), plan[i][1]))
    counters: dict[str | None, int] = defaultdict(int)
    for i in order:
        g = plan[i][0]
        send(fifo, g, {"g": g, "seq": counters[g]})
        counters[g] += 1
    total = len(plan)

    state = threading.Lock()
    holders: dict[str | None, set[int]] = defaultdict(set)  # group -> consumers holding it now
    delivered: dict[str | None, list[int]] = defaultdict(list)
    violations: list[str] = []
    acked: list[int] = []
    errors: list[BaseException] = []
    deadline = time.monotonic() + 60

    def consume(me: int) -> None:
        local = random.Random(me)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while time.monotonic() < deadline and not (violations or errors):
                    query = sql.SQL("SELECT msg_id, message FROM pgmq.{}(%s, 30, 3)").format(
                        sql.Identifier(function)
                    )
                    batch = conn.execute(query, [Q]).fetchall()
                    if not batch:
                        with state:
                            if len(acked) == total:
                                return
                        time.sleep(0.002)
                        continue
                    mine: dict[str | None, list[int]] = defaultdict(list)
                    with state:
                        for msg_id, message in batch:
                            g = message["g"]
                            if holders[g] - {me}:
                                violations.append(
                                    f"group {g}: consumer {me} got {msg_id} "
                                    f"while consumers {holders[g]} hold it"
                                )
                            holders[g].add(me)
                            delivered[g].append(message["seq"])
                            mine[g].append(int(msg_id))
                    for g, ids in mine.items():
                        time.sleep(local.uniform(0, 0.004))
                        # Released in the tracker before the ack commits: once the ack is
                        # visible another consumer may take the group at once.
                        with state:
                            holders[g].discard(me)
                            acked.extend(ids)
                        if local.random() < 0.5:
                            conn.execute("SELECT pgmq.delete(%s, %s::bigint[])", [Q, ids])
                        else:
                            conn.execute("SELECT pgmq.archive(%s, %s::bigint[])", [Q, ids])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert violations == []
    assert sorted(acked) == sorted(set(acked))
    assert len(acked) == total
    for g in groups:
        assert delivered[g] == list(range(per_group)), g
    assert q_ids(fifo, Q) == []
