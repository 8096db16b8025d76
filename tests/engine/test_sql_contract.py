"""The pgmq 1.13 SQL contract, called through SQL exactly as other pgmq clients call it.

Every call uses named arguments (``queue_name => ...``), so a renamed argument fails here, and
result columns are checked by name and type where clients depend on them.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgbroker.errors import InvalidQueueName, from_postgres
from tests.support.tables import (
    Conn,
    a_rows,
    describe,
    jsonb_array,
    meta,
    pgmq_relations,
    q_ids,
    q_rows,
    visible_ids,
)


@pytest.fixture
def conn(module_conn: Conn) -> Conn:
    """In this module every test shares one database and works on its own queue name, ``q``."""
    return module_conn


@pytest.fixture
def q() -> str:
    """A queue name no other test uses (not created)."""
    return f"q{uuid.uuid4().hex[:16]}"


MESSAGE_RECORD = [
    ("msg_id", "bigint"),
    ("read_ct", "integer"),
    ("enqueued_at", "timestamp with time zone"),
    ("last_read_at", "timestamp with time zone"),
    ("vt", "timestamp with time zone"),
    ("message", "jsonb"),
    ("headers", "jsonb"),
]


def create(conn: Conn, name: str) -> None:
    conn.execute("SELECT pgmq.create(queue_name => %s)", [name])


def send(conn: Conn, msg: Any, name: str) -> int:
    row = conn.execute("SELECT * FROM pgmq.send(queue_name => %s, msg => %s)", [name, Jsonb(msg)]).fetchone()
    assert row is not None
    return int(row[0])


def scalar(conn: Conn, query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def db_now(conn: Conn) -> datetime:
    value = scalar(conn, "SELECT clock_timestamp()")
    assert isinstance(value, datetime)
    return value


def meta_of(conn: Conn, *names: str) -> list[tuple[Any, ...]]:
    """pgmq.meta rows (without created_at) of the given queues, by name."""
    wanted = {n.lower() for n in names}
    return [row[:3] for row in meta(conn) if row[0].lower() in wanted]


def relations_of(conn: Conn, name: str) -> list[str]:
    """The pgmq relations (tables, indexes, sequences) whose names contain the queue's name."""
    return [rel for rel in pgmq_relations(conn) if name.lower() in rel]


def relpersistence(conn: Conn, table: str) -> str:
    return str(scalar(conn, "SELECT relpersistence FROM pg_class WHERE oid = %s::regclass", [table]))


# -- signatures -------------------------------------------------------------------------------

# (name, arguments with defaults as pg_get_function_arguments prints them, result)
CONTRACT_SIGNATURES = {
    ("create", "queue_name text", "void"),
    ("create_non_partitioned", "queue_name text", "void"),
    ("create_unlogged", "queue_name text", "void"),
    ("drop_queue", "queue_name text", "boolean"),
    ("drop_queue", "queue_name text, partitioned boolean", "boolean"),
    ("purge_queue", "queue_name text", "bigint"),
    ("list_queues", "", "SETOF pgmq.queue_record"),
    ("metrics", "queue_name text", "pgmq.metrics_result"),
    ("metrics_all", "", "SETOF pgmq.metrics_result"),
    ("send", "queue_name text, msg jsonb", "SETOF bigint"),
    ("send", "queue_name text, msg jsonb, headers jsonb", "SETOF bigint"),
    ("send", "queue_name text, msg jsonb, delay integer", "SETOF bigint"),
    ("send", "queue_name text, msg jsonb, delay timestamp with time zone", "SETOF bigint"),
    ("send", "queue_name text, msg jsonb, headers jsonb, delay integer", "SETOF bigint"),
    ("send", "queue_name text, msg jsonb, headers jsonb, delay timestamp with time zone", "SETOF bigint"),
    ("send_batch", "queue_name text, msgs jsonb[]", "SETOF bigint"),
    ("send_batch", "queue_name text, msgs jsonb[], headers jsonb[]", "SETOF bigint"),
    ("send_batch", "queue_name text, msgs jsonb[], delay integer", "SETOF bigint"),
    ("send_batch", "queue_name text, msgs jsonb[], delay timestamp with time zone", "SETOF bigint"),
    ("send_batch", "queue_name text, msgs jsonb[], headers jsonb[], delay integer", "SETOF bigint"),
    (
        "send_batch",
        "queue_name text, msgs jsonb[], headers jsonb[], delay timestamp with time zone",
        "SETOF bigint",
    ),
    (
        "read",
        "queue_name text, vt integer, qty integer, conditional jsonb DEFAULT '{}'::jsonb",
        "SETOF pgmq.message_record",
    ),
    (
        "read_with_poll",
        "queue_name text, vt integer, qty integer, max_poll_seconds integer DEFAULT 5, "
        "poll_interval_ms integer DEFAULT 100, conditional jsonb DEFAULT '{}'::jsonb",
        "SETOF pgmq.message_record",
    ),
    ("pop", "queue_name text, qty integer DEFAULT 1", "SETOF pgmq.message_record"),
    ("delete", "queue_name text, msg_id bigint", "boolean"),
    ("delete", "queue_name text, msg_ids bigint[]", "SETOF bigint"),
    ("archive", "queue_name text, msg_id bigint", "boolean"),
    ("archive", "queue_name text, msg_ids bigint[]", "SETOF bigint"),
    ("set_vt", "queue_name text, msg_id bigint, vt integer", "SETOF pgmq.message_record"),
    ("set_vt", "queue_name text, msg_id bigint, vt timestamp with time zone", "SETOF pgmq.message_record"),
    ("set_vt", "queue_name text, msg_ids bigint[], vt integer", "SETOF pgmq.message_record"),
    (
        "set_vt",
        "queue_name text, msg_ids bigint[], vt timestamp with time zone",
        "SETOF pgmq.message_record",
    ),
    ("validate_queue_name", "queue_name text", "void"),
    ("format_table_name", "queue_name text, prefix text", "text"),
}


def test_pgmq_functions_have_the_contract_signatures_and_defaults(conn: Conn) -> None:
    found = set(
        conn.execute(
            """
            SELECT proname, pg_get_function_arguments(oid), pg_get_function_result(oid)
            FROM pg_proc WHERE pronamespace = 'pgmq'::regnamespace
            """
        ).fetchall()
    )
    assert CONTRACT_SIGNATURES - found == set()


def test_contract_types_have_the_contract_field_order(conn: Conn) -> None:
    def fields(type_name: str) -> list[tuple[str, str]]:
        return [
            (str(name), str(typ))
            for name, typ in conn.execute(
                """
                SELECT a.attname, format_type(a.atttypid, a.atttypmod)
                FROM pg_attribute a WHERE a.attrelid = (SELECT typrelid FROM pg_type WHERE oid = %s::regtype)
                  AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum
                """,
                [type_name],
            ).fetchall()
        ]

    assert fields("pgmq.message_record") == MESSAGE_RECORD
    assert fields("pgmq.queue_record") == [
        ("queue_name", "character varying"),
        ("is_partitioned", "boolean"),
        ("is_unlogged", "boolean"),
        ("created_at", "timestamp with time zone"),
    ]
    assert fields("pgmq.metrics_result") == [
        ("queue_name", "text"),
        ("queue_length", "bigint"),
        ("newest_msg_age_sec", "integer"),
        ("oldest_msg_age_sec", "integer"),
        ("total_messages", "bigint"),
        ("scrape_time", "timestamp with time zone"),
        ("queue_visible_length", "bigint"),
        ("default_partition_length", "bigint"),
    ]


# -- queue management -------------------------------------------------------------------------


def _table_columns(conn: Conn, table: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        """
        SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
               pg_get_expr(d.adbin, d.adrelid)
        FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum
        """,
        [table],
    ).fetchall()


def test_create_makes_queue_and_archive_tables_of_the_contract_shape(conn: Conn, q: str) -> None:
    name = q.upper()  # mixed case: tables are named after the lower-cased name
    cur = conn.execute("SELECT pgmq.create(queue_name => %s)", [name])
    assert describe(conn, cur) == [("create", "void")]

    q_cols = _table_columns(conn, f"pgmq.q_{q}")
    assert q_cols == [
        ("msg_id", "bigint", True, "a", None),
        ("read_ct", "integer", True, "", "0"),
        ("enqueued_at", "timestamp with time zone", True, "", "now()"),
        ("last_read_at", "timestamp with time zone", False, "", None),
        ("vt", "timestamp with time zone", True, "", None),
        ("message", "jsonb", False, "", None),
        ("headers", "jsonb", False, "", None),
    ]
    a_cols = {row[0]: row for row in _table_columns(conn, f"pgmq.a_{q}")}
    assert set(a_cols) == {row[0] for row in q_cols} | {"archived_at"}
    assert a_cols["msg_id"] == ("msg_id", "bigint", True, "", None)
    assert a_cols["archived_at"] == ("archived_at", "timestamp with time zone", True, "", "now()")
    primary_keys = conn.execute(
        """
        SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint
        WHERE contype = 'p' AND conrelid IN (%s::regclass, %s::regclass) ORDER BY 1
        """,
        [f"pgmq.q_{q}", f"pgmq.a_{q}"],
    ).fetchall()
    assert primary_keys == [
        (f"pgmq.a_{q}", "PRIMARY KEY (msg_id)"),
        (f"pgmq.q_{q}", "PRIMARY KEY (msg_id)"),
    ]
    assert f"q_{q}_msg_id_seq" in pgmq_relations(conn)
    assert meta_of(conn, q) == [(name, False, False)]
    assert relpersistence(conn, f"pgmq.q_{q}") == "p"


def test_create_is_idempotent(conn: Conn, q: str) -> None:
    create(conn, q)
    msg_id = send(conn, {"a": 1}, q)
    create(conn, q)
    assert meta_of(conn, q) == [(q, False, False)]
    assert q_ids(conn, q) == [msg_id]


def test_create_non_partitioned_creates_a_logged_queue(conn: Conn, q: str) -> None:
    cur = conn.execute("SELECT pgmq.create_non_partitioned(queue_name => %s)", [q])
    assert describe(conn, cur) == [("create_non_partitioned", "void")]
    assert meta_of(conn, q) == [(q, False, False)]
    assert relpersistence(conn, f"pgmq.q_{q}") == "p"
    assert relpersistence(conn, f"pgmq.a_{q}") == "p"


def test_create_unlogged_makes_the_queue_table_unlogged_and_the_archive_logged(conn: Conn, q: str) -> None:
    conn.execute("SELECT pgmq.create_unlogged(queue_name => %s)", [q])
    assert meta_of(conn, q) == [(q, False, True)]
    assert relpersistence(conn, f"pgmq.q_{q}") == "u"
    assert relpersistence(conn, f"pgmq.a_{q}") == "p"
    msg_id = send(conn, {"a": 1}, q)
    assert q_ids(conn, q) == [msg_id]


def test_drop_queue_returns_true_then_false_and_removes_everything(conn: Conn, q: str) -> None:
    create(conn, q)
    send(conn, {"a": 1}, q)
    assert len(relations_of(conn, q)) >= 5  # tables, their keys and indexes, the sequence
    assert scalar(conn, "SELECT pgmq.drop_queue(queue_name => %s)", [q]) is True
    assert meta_of(conn, q) == []
    assert relations_of(conn, q) == []
    assert scalar(conn, "SELECT pgmq.drop_queue(queue_name => %s)", [q]) is False


def test_deprecated_drop_queue_with_partitioned_flag_drops_the_queue_with_a_warning(
    conn: Conn, q: str
) -> None:
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(f"{diag.severity}: {diag.message_primary}"))
    create(conn, q)
    assert scalar(conn, "SELECT pgmq.drop_queue(queue_name => %s, partitioned => false)", [q]) is True
    assert meta_of(conn, q) == []
    assert relations_of(conn, q) == []
    assert any(n.startswith("WARNING") and "deprecated" in n for n in notices)


def test_purge_queue_returns_the_count_and_keeps_the_archive(conn: Conn, q: str) -> None:
    create(conn, q)
    ids = [send(conn, {"n": n}, q) for n in range(4)]
    conn.execute("SELECT pgmq.archive(queue_name => %s, msg_id => %s)", [q, ids[0]])
    cur = conn.execute("SELECT pgmq.purge_queue(queue_name => %s)", [q])
    assert describe(conn, cur) == [("purge_queue", "bigint")]
    assert cur.fetchone() == (3,)
    assert q_rows(conn, q) == []
    assert [row[0] for row in a_rows(conn, q)] == [ids[0]]
    assert scalar(conn, "SELECT pgmq.purge_queue(queue_name => %s)", [q]) == 0


def test_list_queues_returns_queue_records_of_every_queue(conn: Conn, q: str) -> None:
    create(conn, f"{q}_b")
    conn.execute("SELECT pgmq.create_unlogged(queue_name => %s)", [f"{q}_a"])
    cur = conn.execute("SELECT * FROM pgmq.list_queues()")
    assert describe(conn, cur) == [
        ("queue_name", "character varying"),
        ("is_partitioned", "boolean"),
        ("is_unlogged", "boolean"),
        ("created_at", "timestamp with time zone"),
    ]
    rows = [row for row in cur.fetchall() if row[0].startswith(q)]
    assert sorted(row[:3] for row in rows) == [(f"{q}_a", False, True), (f"{q}_b", False, False)]
    assert all(isinstance(row[3], datetime) for row in rows)


METRICS_COLUMNS = [
    ("queue_name", "text"),
    ("queue_length", "bigint"),
    ("newest_msg_age_sec", "integer"),
    ("oldest_msg_age_sec", "integer"),
    ("total_messages", "bigint"),
    ("scrape_time", "timestamp with time zone"),
    ("queue_visible_length", "bigint"),
    ("default_partition_length", "bigint"),
]


def test_metrics_of_an_empty_queue_have_null_ages_and_zero_counts(conn: Conn, q: str) -> None:
    create(conn, q)
    cur = conn.execute("SELECT * FROM pgmq.metrics(queue_name => %s)", [q])
    assert describe(conn, cur) == METRICS_COLUMNS
    row = cur.fetchone()
    assert row is not None
    assert row[:5] == (q, 0, None, None, 0)
    assert isinstance(row[5], datetime)
    assert row[6:] == (0, None)  # default_partition_length: NULL unless partitioned, as in pgmq


def test_metrics_count_messages_ever_sent_and_visible_ones(conn: Conn, q: str) -> None:
    create(conn, q)
    ids = [send(conn, {"n": n}, q) for n in range(5)]
    conn.execute("SELECT * FROM pgmq.read(queue_name => %s, vt => 60, qty => 2)", [q])
    conn.execute("SELECT pgmq.delete(queue_name => %s, msg_id => %s)", [q, ids[4]])
    row = conn.execute("SELECT * FROM pgmq.metrics(queue_name => %s)", [q]).fetchone()
    assert row is not None
    name, length, newest, oldest, total, _scrape, visible, default_partition = row
    assert (name, length, total, visible, default_partition) == (q, 4, 5, 2, None)
    assert isinstance(newest, int)
    assert isinstance(oldest, int)
    assert 0 <= newest <= oldest <= 5


def test_metrics_all_returns_one_metrics_row_per_queue(conn: Conn, q: str) -> None:
    create(conn, f"{q}_1")
    create(conn, f"{q}_2")
    send(conn, {"a": 1}, f"{q}_2")
    cur = conn.execute("SELECT * FROM pgmq.metrics_all()")
    assert describe(conn, cur) == METRICS_COLUMNS
    rows = [row for row in cur.fetchall() if row[0].startswith(q)]
    assert sorted((row[0], row[1], row[4]) for row in rows) == [(f"{q}_1", 0, 0), (f"{q}_2", 1, 1)]


# -- sending ----------------------------------------------------------------------------------

AT = datetime(2001, 2, 3, 4, 5, 6, 789000, tzinfo=UTC)
FUTURE_SECONDS = 3600


@pytest.mark.parametrize(
    ("call", "extra", "headers", "delay"),
    [
        ("pgmq.send(queue_name => %s, msg => %s)", [], None, None),
        ("pgmq.send(queue_name => %s, msg => %s, headers => %s)", [Jsonb({"h": 1})], {"h": 1}, None),
        ("pgmq.send(queue_name => %s, msg => %s, delay => %s::integer)", [FUTURE_SECONDS], None, "seconds"),
        ("pgmq.send(queue_name => %s, msg => %s, delay => %s::timestamptz)", [AT], None, "at"),
        (
            "pgmq.send(queue_name => %s, msg => %s, headers => %s, delay => %s::integer)",
            [Jsonb({"h": 2}), FUTURE_SECONDS],
            {"h": 2},
            "seconds",
        ),
        (
            "pgmq.send(queue_name => %s, msg => %s, headers => %s, delay => %s::timestamptz)",
            [Jsonb({"h": 3}), AT],
            {"h": 3},
            "at",
        ),
    ],
    ids=["msg", "headers", "delay-seconds", "delay-at", "headers-delay-seconds", "headers-delay-at"],
)
def test_every_send_form_inserts_one_message_with_its_headers_and_delay(
    conn: Conn, q: str, call: str, extra: list[Any], headers: Any, delay: str | None
) -> None:
    create(conn, q)
    before = db_now(conn)
    cur = conn.execute(f"SELECT * FROM {call}", [q, Jsonb({"body": 1}), *extra])  # noqa: S608 - fixed texts
    assert describe(conn, cur) == [(call.split("(")[0].split(".")[1], "bigint")]
    (msg_id,) = cur.fetchall()[0]
    [(row_id, read_ct, vt, message, row_headers)] = q_rows(conn, q)
    assert (row_id, read_ct, message, row_headers) == (msg_id, 0, {"body": 1}, headers)
    if delay is None:
        assert vt <= db_now(conn)
        assert visible_ids(conn, q) == [msg_id]
    elif delay == "seconds":
        assert (
            before + timedelta(seconds=FUTURE_SECONDS - 1)
            <= vt
            <= db_now(conn) + timedelta(seconds=FUTURE_SECONDS)
        )
        assert visible_ids(conn, q) == []
    else:
        assert vt == AT
        assert visible_ids(conn, q) == [msg_id]


@pytest.mark.parametrize(
    ("call", "extra", "headers", "delay"),
    [
        ("pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[])", [], None, None),
        (
            "pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], headers => %s::jsonb[])",
            [jsonb_array([{"h": 0}, {"h": 1}, {"h": 2}])],
            [{"h": 0}, {"h": 1}, {"h": 2}],
            None,
        ),
        (
            "pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], delay => %s::integer)",
            [FUTURE_SECONDS],
            None,
            "seconds",
        ),
        (
            "pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], delay => %s::timestamptz)",
            [AT],
            None,
            "at",
        ),
        (
            "pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], headers => %s::jsonb[],"
            " delay => %s::integer)",
            [jsonb_array([None, {"h": 1}, {}]), FUTURE_SECONDS],
            [None, {"h": 1}, {}],
            "seconds",
        ),
        (
            "pgmq.send_batch(queue_name => %s, msgs => %s::jsonb[], headers => %s::jsonb[],"
            " delay => %s::timestamptz)",
            [jsonb_array([{"h": 0}, {"h": 1}, {"h": 2}]), AT],
            [{"h": 0}, {"h": 1}, {"h": 2}],
            "at",
        ),
    ],
    ids=["msgs", "headers", "delay-seconds", "delay-at", "headers-delay-seconds", "headers-delay-at"],
)
def test_every_send_batch_form_inserts_the_messages_in_order(
    conn: Conn, q: str, call: str, extra: list[Any], headers: list[Any] | None, delay: str | None
) -> None:
    create(conn, q)
    msgs = [{"n": 0}, {"n": 1}, {"n": 2}]
    cur = conn.execute(f"SELECT * FROM {call}", [q, jsonb_array(msgs), *extra])  # noqa: S608 - fixed texts
    assert describe(conn, cur) == [("send_batch", "bigint")]
    ids = [row[0] for row in cur.fetchall()]
    assert len(ids) == 3
    assert ids == sorted(ids)
    rows = q_rows(conn, q)
    assert [(row[0], row[3], row[4]) for row in rows] == list(
        zip(ids, msgs, headers or [None, None, None], strict=True)
    )
    if delay == "seconds":
        assert visible_ids(conn, q) == []
    else:
        assert visible_ids(conn, q) == ids
        if delay == "at":
            assert {row[2] for row in rows} == {AT}


def test_send_with_zero_delay_is_visible_at_once(conn: Conn, q: str) -> None:
    create(conn, q)
    msg_id = scalar(conn, "SELECT * FROM pgmq.send(queue_name => %s, msg => '1', delay => 0)", [q])
    assert visible_ids(conn, q) == [msg_id]


# -- reading ----------------------------------------------------------------------------------


def test_read_leases_messages_and_returns_message_records(conn: Conn, q: str) -> None:
    create(conn, q)
    ids = [send(conn, {"n": n}, q) for n in range(3)]
    before = db_now(conn)
    cur = conn.execute("SELECT * FROM pgmq.read(queue_name => %s, vt => %s, qty => %s)", [q, 60, 2])
    assert describe(conn, cur) == MESSAGE_RECORD
    rows = cur.fetchall()
    assert [(r[0], r[1], r[5], r[6]) for r in rows] == [
        (ids[0], 1, {"n": 0}, None),
        (ids[1], 1, {"n": 1}, None),
    ]
    for row in rows:
        assert row[3] is not None
        assert row[3] >= before
        assert before + timedelta(seconds=59) <= row[4] <= db_now(conn) + timedelta(seconds=60)
    assert visible_ids(conn, q) == [ids[2]]


def test_read_with_conditional_returns_only_matching_messages(conn: Conn, q: str) -> None:
    create(conn, q)
    ids = [send(conn, {"kind": kind, "n": n}, q) for n, kind in enumerate(["a", "b", "a", "b"])]
    rows = conn.execute(
        "SELECT msg_id FROM pgmq.read(queue_name => %s, vt => 60, qty => 10, conditional => %s)",
        [q, Jsonb({"kind": "b"})],
    ).fetchall()
    assert [r[0] for r in rows] == [ids[1], ids[3]]
    rows = conn.execute(
        "SELECT msg_id FROM pgmq.read(queue_name => %s, vt => 60, qty => 10, conditional => '{}')", [q]
    ).fetchall()
    assert [r[0] for r in rows] == [ids[0], ids[2]]


def test_read_with_poll_returns_as_soon_as_another_connection_sends(
    conn: Conn, q: str, module_dsn: str
) -> None:
    create(conn, q)

    def send_later() -> None:
        time.sleep(0.5)
        with psycopg.connect(module_dsn, autocommit=True) as other:
            send(other, {"late": True}, q)

    sender = threading.Thread(target=send_later)
    started = time.monotonic()
    sender.start()
    cur = conn.execute(
        "SELECT * FROM pgmq.read_with_poll(queue_name => %s, vt => 60, qty => 1,"
        " max_poll_seconds => 10, poll_interval_ms => 50)",
        [q],
    )
    elapsed = time.monotonic() - started
    sender.join()
    assert describe(conn, cur) == MESSAGE_RECORD
    rows = cur.fetchall()
    assert [(r[1], r[5]) for r in rows] == [(1, {"late": True})]
    assert 0.4 <= elapsed < 5


def test_read_with_poll_times_out_empty_after_max_poll_seconds(conn: Conn, q: str) -> None:
    create(conn, q)
    started = time.monotonic()
    rows = conn.execute(
        "SELECT * FROM pgmq.read_with_poll(queue_name => %s, vt => 60, qty => 1, max_poll_seconds => 1)", [q]
    ).fetchall()
    elapsed = time.monotonic() - started
    assert rows == []
    assert 0.9 <= elapsed < 4


def test_pop_deletes_and_returns_one_message_by_default(conn: Conn, q: str) -> None:
    create(conn, q)
    ids = [send(conn, {"n": n}, q) for n in range(3)]
    cur = conn.execute("SELECT * FROM pgmq.pop(queue_name => %s)", [q])
    assert describe(conn, cur) == MESSAGE_RECORD
    rows = cur.fetchall()
    assert [(r[0], r[1], r[5]) for r in rows] == [(ids[0], 0, {"n": 0})]
    assert q_ids(conn, q) == ids[1:]
    assert a_rows(conn, q) == []


def test_pop_with_qty_deletes_up_to_qty_visible_messages(conn: Conn, q: str) -> None:
    create(conn, q)
    ids = [send(conn, {"n": n}, q) for n in range(4)]
    conn.execute("SELECT * FROM pgmq.read(queue_name => %s, vt => 60, qty => 1)", [q])
    rows = conn.execute("SELECT msg_id FROM pgmq.pop(queue_name => %s, qty => %s)", [q, 2]).fetchall()
    assert [r[0] for r in rows] == ids[1:3]
    assert q_ids(conn, q) == [ids[0], ids[3]]


# -- delete, archive --------------------------------------------------------------------------


def test_delete_by_id_returns_whether_a_message_was_deleted(conn: Conn, q: str) -> None:
    create(conn, q)
    ids = [send(conn, n, q) for n in range(2)]
    cur = conn.execute("SELECT pgmq.delete(queue_name => %s, msg_id => %s::bigint)", [q, ids[0]])
    assert describe(conn, cur) == [("delete", "boolean")]
    assert cur.fetchone() == (True,)
    assert scalar(conn, "SELECT pgmq.delete(queue_name => %s, msg_id => %s::bigint)", [q, ids[0]]) is False
    assert q_ids(conn, q) == [ids[1]]
    assert a_rows(conn, q) == []


def test_delete_by_ids_returns_only_the_ids_actually_deleted(conn: Conn, q: str) -> None:
    create(conn, q)
    ids = [send(conn, n, q) for n in range(3)]
    rows = conn.execute(
        "SELECT * FROM pgmq.delete(queue_name => %s, msg_ids => %s::bigint[])", [q, [ids[0], ids[2], 999]]
    ).fetchall()
    assert sorted(r[0] for r in rows) == [ids[0], ids[2]]
    assert q_ids(conn, q) == [ids[1]]


def test_archive_by_id_moves_the_row_into_the_archive(conn: Conn, q: str) -> None:
    create(conn, q)
    ids = [send(conn, {"n": n}, q) for n in range(2)]
    conn.execute("SELECT * FROM pgmq.read(queue_name => %s, vt => 60, qty => 1)", [q])
    before = db_now(conn)
    cur = conn.execute("SELECT pgmq.archive(queue_name => %s, msg_id => %s::bigint)", [q, ids[0]])
    assert describe(conn, cur) == [("archive", "boolean")]
    assert cur.fetchone() == (True,)
    assert scalar(conn, "SELECT pgmq.archive(queue_name => %s, msg_id => %s::bigint)", [q, ids[0]]) is False
    assert q_ids(conn, q) == [ids[1]]
    [(msg_id, read_ct, message, archived_at)] = a_rows(conn, q)
    assert (msg_id, read_ct, message) == (ids[0], 1, {"n": 0})
    assert archived_at >= before - timedelta(seconds=1)


def test_archive_by_ids_returns_only_the_ids_actually_archived(conn: Conn, q: str) -> None:
    create(conn, q)
    ids = [send(conn, n, q) for n in range(3)]
    rows = conn.execute(
        "SELECT * FROM pgmq.archive(queue_name => %s, msg_ids => %s::bigint[])", [q, [ids[1], ids[2], 999]]
    ).fetchall()
    assert sorted(r[0] for r in rows) == ids[1:]
    assert q_ids(conn, q) == [ids[0]]
    assert [row[0] for row in a_rows(conn, q)] == ids[1:]
    assert all(row[3] is not None for row in a_rows(conn, q))


# -- set_vt -----------------------------------------------------------------------------------

SET_VT_AT = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


@pytest.mark.parametrize(
    ("call", "by_array", "absolute"),
    [
        ("pgmq.set_vt(queue_name => %s, msg_id => %s::bigint, vt => %s::integer)", False, False),
        ("pgmq.set_vt(queue_name => %s, msg_id => %s::bigint, vt => %s::timestamptz)", False, True),
        ("pgmq.set_vt(queue_name => %s, msg_ids => %s::bigint[], vt => %s::integer)", True, False),
        ("pgmq.set_vt(queue_name => %s, msg_ids => %s::bigint[], vt => %s::timestamptz)", True, True),
    ],
    ids=["id-seconds", "id-at", "ids-seconds", "ids-at"],
)
def test_every_set_vt_form_changes_vt_and_keeps_read_ct(
    conn: Conn, q: str, call: str, by_array: bool, absolute: bool
) -> None:
    create(conn, q)
    ids = [send(conn, {"n": n}, q) for n in range(3)]
    conn.execute("SELECT * FROM pgmq.read(queue_name => %s, vt => 60, qty => 1)", [q])
    target: Any = [ids[0], ids[1], 999] if by_array else ids[0]
    vt: Any = SET_VT_AT if absolute else 7200
    before = db_now(conn)
    cur = conn.execute(f"SELECT * FROM {call}", [q, target, vt])  # noqa: S608 - fixed texts
    assert describe(conn, cur) == MESSAGE_RECORD
    rows = cur.fetchall()
    changed = ids[:2] if by_array else ids[:1]
    assert [(r[0], r[1]) for r in rows] == [(i, 1 if i == ids[0] else 0) for i in changed]
    stored = {row[0]: row for row in q_rows(conn, q)}
    for row in rows:
        assert stored[row[0]][2] == row[4]
        assert stored[row[0]][1] == row[1]
        if absolute:
            assert row[4] == SET_VT_AT
        else:
            assert before + timedelta(seconds=7199) <= row[4] <= db_now(conn) + timedelta(seconds=7200)
    assert visible_ids(conn, q) == ([] if by_array else [ids[1]]) + [ids[2]]


def test_set_vt_of_a_missing_message_returns_no_rows(conn: Conn, q: str) -> None:
    create(conn, q)
    rows = conn.execute("SELECT * FROM pgmq.set_vt(queue_name => %s, msg_id => 42, vt => 10)", [q]).fetchall()
    assert rows == []


# -- names ------------------------------------------------------------------------------------


def test_validate_queue_name_accepts_47_characters_and_refuses_48(conn: Conn) -> None:
    cur = conn.execute("SELECT pgmq.validate_queue_name(queue_name => %s)", ["x" * 47])
    assert describe(conn, cur) == [("validate_queue_name", "void")]
    with pytest.raises(psycopg.Error, match="queue name is too long, maximum length is 47 characters"):
        conn.execute("SELECT pgmq.validate_queue_name(queue_name => %s)", ["x" * 48])


def test_format_table_name_lowercases_and_prefixes(conn: Conn, q: str) -> None:
    assert scalar(
        conn, "SELECT pgmq.format_table_name(queue_name => %s, prefix => %s)", ["MyQueue", "q"]
    ) == ("q_myqueue")
    assert scalar(
        conn, "SELECT pgmq.format_table_name(queue_name => %s, prefix => %s)", ["MyQueue", "a"]
    ) == ("a_myqueue")


@pytest.mark.parametrize("name", ["a$b", "a;b", "a--b", "a'b"])
def test_format_table_name_refuses_invalid_characters(conn: Conn, q: str, name: str) -> None:
    with pytest.raises(psycopg.errors.RaiseException, match="invalid characters") as info:
        conn.execute("SELECT pgmq.format_table_name(queue_name => %s, prefix => 'q')", [name])
    assert info.value.sqlstate == "P0001"  # pgmq's
    assert isinstance(from_postgres(info.value), InvalidQueueName)  # pgbroker's code in DETAIL


def test_queue_names_are_found_whatever_their_case(conn: Conn, q: str) -> None:
    name = q.capitalize()
    create(conn, name)
    msg_id = send(conn, {"a": 1}, name.upper())
    rows = conn.execute(
        "SELECT msg_id FROM pgmq.read(queue_name => %s, vt => 60, qty => 1)", [name.lower()]
    ).fetchall()
    assert rows == [(msg_id,)]
    assert meta_of(conn, q) == [(name, False, False)]
