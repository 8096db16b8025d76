"""Topic routing: bind_topic, send_topic, send_batch_topic, test_routing and key/pattern validation.

Keys and patterns are dot-separated words. A binding matches as pgmq's does: ``*`` is one word
and ``#`` any characters between literal dots ('orders.#' needs a word after 'orders');
pgbroker.bind_topic_amqp binds with AMQP's ``#``, zero or more words. Routing and validation are
compared with the reference pgmq SQL in a database of its own; errors are pgmq's (P0001, with
pgbroker's code in DETAIL).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from pgbroker._db.install import install
from pgbroker.errors import from_postgres
from tests.compat.reference import create_reference_database, drop_database
from tests.support.dev_schema import install_dev
from tests.support.postgres import dsn_for_db
from tests.support.tables import Conn, describe, jsonb_array, q_ids, q_rows

BINDING_COLUMNS = [
    ("pattern", "text"),
    ("queue_name", "text"),
    ("bound_at", "timestamp with time zone"),
    ("compiled_regex", "text"),
]
ROUTING_COLUMNS = [("pattern", "text"), ("queue_name", "text"), ("compiled_regex", "text")]
SENT_COLUMNS = [("queue_name", "text"), ("msg_id", "bigint")]


def create(conn: Conn, *names: str) -> None:
    for name in names:
        conn.execute("SELECT pgmq.create(%s)", [name])


def bind(conn: Conn, pattern: str, queue: str) -> None:
    conn.execute("SELECT pgmq.bind_topic(pattern => %s, queue_name => %s)", [pattern, queue])


def scalar(conn: Conn, query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def routed(conn: Conn, key: str) -> set[str]:
    return {str(r[1]) for r in conn.execute("SELECT * FROM pgmq.test_routing(%s)", [key]).fetchall()}


def refused(conn: Conn, query: str | sql.Composed, params: Any = None) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    return info.value


def assert_pgmq_error(error: psycopg.Error, code: str) -> None:
    """pgmq's RAISE (P0001), with pgbroker's ``code`` in DETAIL for pgbroker's client."""
    assert error.sqlstate == "P0001", error
    assert from_postgres(error).code == code, error.diag.message_detail


@pytest.fixture(scope="module")
def reference(pg_admin_dsn: str) -> Iterator[str]:
    """DSN of a database with the reference pgmq 1.13 SQL installed (never pgbroker)."""
    name = create_reference_database(pg_admin_dsn)
    try:
        yield dsn_for_db(pg_admin_dsn, name)
    finally:
        drop_database(pg_admin_dsn, name)


# -- contract ---------------------------------------------------------------------------------

TOPIC_FUNCTIONS = (
    "bind_topic",
    "unbind_topic",
    "list_topic_bindings",
    "test_routing",
    "validate_routing_key",
    "validate_topic_pattern",
    "send_topic",
    "send_batch_topic",
)


def signatures(conn: Conn) -> set[tuple[Any, ...]]:
    return set(
        conn.execute(
            "SELECT proname, pg_get_function_arguments(oid), pg_get_function_result(oid)"
            " FROM pg_proc WHERE pronamespace = 'pgmq'::regnamespace AND proname = ANY(%s)",
            [list(TOPIC_FUNCTIONS)],
        ).fetchall()
    )


def test_topic_functions_have_the_reference_signatures(conn: Conn, reference: str) -> None:
    with psycopg.connect(reference, autocommit=True) as ref:
        expected = signatures(ref)
    assert len(expected) == 16  # 3 send_topic, 6 send_batch_topic, 2 list_topic_bindings, ...
    assert signatures(conn) == expected


def test_topic_bindings_table_has_the_contract_shape(conn: Conn) -> None:
    columns = conn.execute(
        """
        SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
        FROM pg_attribute a
        WHERE a.attrelid = 'pgmq.topic_bindings'::regclass AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attnum
        """
    ).fetchall()
    assert columns[:3] == [
        ("pattern", "text", True),
        ("queue_name", "text", True),
        ("bound_at", "timestamp with time zone", True),
    ]
    constraints = {
        (str(r[0]), str(r[1]))
        for r in conn.execute(
            "SELECT contype, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = 'pgmq.topic_bindings'::regclass"
        ).fetchall()
    }
    assert ("u", "UNIQUE (pattern, queue_name)") in constraints
    assert ("f", "FOREIGN KEY (queue_name) REFERENCES pgmq.meta(queue_name) ON DELETE CASCADE") in constraints


# -- routing ----------------------------------------------------------------------------------

PATTERNS = {
    "q_star": "orders.*",
    "q_hash": "orders.#",
    "q_all": "#",
    "q_created": "*.created",
    "q_az": "a.#.z",
    "q_exact": "orders.created",
    "q_prefix": "user-*.login",
}

# pgmq's '#': 'orders.#' needs a word after 'orders', 'a.#.z' one between 'a' and 'z'.
ROUTES = [
    ("orders", {"q_all"}),
    ("orders.created", {"q_star", "q_hash", "q_all", "q_created", "q_exact"}),
    ("orders.eu.created", {"q_hash", "q_all"}),
    ("users.created", {"q_all", "q_created"}),
    ("created", {"q_all"}),
    ("a.z", {"q_all"}),
    ("a.b.z", {"q_all", "q_az"}),
    ("a.b.c.z", {"q_all", "q_az"}),
    ("a.zz", {"q_all"}),
    ("aa.z", {"q_all"}),
    ("a.z.b", {"q_all"}),
    ("ordersx.created", {"q_all", "q_created"}),
    ("user-42.login", {"q_all", "q_prefix"}),
    ("user-.login", {"q_all"}),
]


@pytest.fixture
def routing(conn: Conn) -> Conn:
    create(conn, *PATTERNS)
    for queue, pattern in PATTERNS.items():
        bind(conn, pattern, queue)
    return conn


@pytest.mark.parametrize(("key", "queues"), ROUTES)
def test_keys_reach_the_queues_whose_patterns_match(routing: Conn, key: str, queues: set[str]) -> None:
    assert routed(routing, key) == queues
    reached = scalar(
        routing, "SELECT pgmq.send_topic(routing_key => %s, msg => %s)", [key, Jsonb({"k": key})]
    )
    assert reached == len(queues)
    for queue in PATTERNS:
        got = [row[3] for row in q_rows(routing, queue)]
        assert got == ([{"k": key}] if queue in queues else []), queue


def test_routing_is_the_references_for_every_key(routing: Conn, reference: str) -> None:
    with psycopg.connect(reference, autocommit=True) as ref:
        create(ref, *PATTERNS)
        for queue, pattern in PATTERNS.items():
            bind(ref, pattern, queue)
        for key, _ in ROUTES:
            assert routed(ref, key) == routed(routing, key), key
        regexes = "SELECT pattern, compiled_regex FROM pgmq.list_topic_bindings() ORDER BY 1"
        assert ref.execute(regexes).fetchall() == routing.execute(regexes).fetchall()


# AMQP's '#' (pgbroker.bind_topic_amqp): zero or more words.
AMQP_ROUTES = {"orders": {"q_hash", "q_all"}, "a.z": {"q_all", "q_az"}, "orders.x.y": {"q_hash", "q_all"}}


@pytest.mark.parametrize(("key", "queues"), AMQP_ROUTES.items())
def test_amqp_bindings_match_zero_or_more_words(conn: Conn, key: str, queues: set[str]) -> None:
    create(conn, *PATTERNS)
    for queue, pattern in PATTERNS.items():
        conn.execute("SELECT pgbroker.bind_topic_amqp(%s, %s)", [pattern, queue])
    assert routed(conn, key) == queues
    assert scalar(conn, "SELECT pgmq.send_topic(%s, '{}')", [key]) == len(queues)
    listed = dict(conn.execute("SELECT pattern, compiled_regex FROM pgmq.list_topic_bindings()").fetchall())
    assert listed["orders.#"] == "^orders(?:\\.[^.]+)*$"


def test_binding_a_pattern_the_amqp_way_switches_its_meaning(conn: Conn) -> None:
    create(conn, "jobs")
    bind(conn, "orders.#", "jobs")
    assert routed(conn, "orders") == set()
    conn.execute("SELECT pgbroker.bind_topic_amqp('orders.#', 'JOBS')")
    conn.execute("SELECT pgbroker.bind_topic_amqp('orders.#', 'jobs')")  # idempotent
    assert routed(conn, "orders") == {"jobs"}
    assert bindings(conn) == [("orders.#", "jobs")]
    # Unbinding removes it whichever way it was bound; binding again is pgmq's.
    assert scalar(conn, "SELECT pgmq.unbind_topic('orders.#', 'jobs')") is True
    assert scalar(conn, "SELECT count(*) FROM pgbroker.topic_amqp_bindings") == 0
    bind(conn, "orders.#", "jobs")
    assert routed(conn, "orders") == set()
    # And the queue's drop removes it.
    conn.execute("SELECT pgbroker.bind_topic_amqp('a.#', 'jobs')")
    conn.execute("SELECT pgmq.drop_queue('jobs')")
    assert scalar(conn, "SELECT count(*) FROM pgbroker.topic_amqp_bindings") == 0


def test_amqp_binding_fails_as_bind_topic_does(conn: Conn) -> None:
    assert_pgmq_error(refused(conn, "SELECT pgbroker.bind_topic_amqp('a.*', 'missing')"), "PB002")
    create(conn, "jobs")
    assert_pgmq_error(refused(conn, "SELECT pgbroker.bind_topic_amqp('a..b', 'jobs')"), "PB007")
    assert bindings(conn) == []


def test_a_queue_bound_by_several_matching_patterns_gets_one_copy(conn: Conn) -> None:
    create(conn, "jobs")
    for pattern in ("orders.*", "orders.#", "#", "*.created"):
        bind(conn, pattern, "jobs")
    assert len(conn.execute("SELECT * FROM pgmq.test_routing('orders.created')").fetchall()) == 4
    assert scalar(conn, "SELECT pgmq.send_topic('orders.created', '{\"n\": 1}')") == 1
    assert [row[3] for row in q_rows(conn, "jobs")] == [{"n": 1}]
    rows = conn.execute("SELECT * FROM pgmq.send_batch_topic('orders.created', %s::jsonb[])", [["1", "2"]])
    assert [r[0] for r in rows.fetchall()] == ["jobs", "jobs"]


def test_a_key_no_pattern_matches_reaches_no_queue(conn: Conn) -> None:
    create(conn, "jobs")
    bind(conn, "orders.*", "jobs")
    assert scalar(conn, "SELECT pgmq.send_topic('users.created', '{}')") == 0
    assert conn.execute("SELECT * FROM pgmq.send_batch_topic('users.created', '{\"{}\"}')").fetchall() == []
    assert q_ids(conn, "jobs") == []


# -- sending ----------------------------------------------------------------------------------


def db_now(conn: Conn) -> datetime:
    value = scalar(conn, "SELECT clock_timestamp()")
    assert isinstance(value, datetime)
    return value


@pytest.fixture
def two_queues(conn: Conn) -> Conn:
    create(conn, "alpha", "beta", "other")
    bind(conn, "orders.#", "beta")
    bind(conn, "orders.*", "alpha")
    bind(conn, "users.*", "other")
    return conn


def test_send_topic_forms_send_with_headers_and_delay(two_queues: Conn) -> None:
    conn = two_queues
    before = db_now(conn)
    assert scalar(conn, "SELECT pgmq.send_topic(routing_key => 'orders.new', msg => '1')") == 2
    assert scalar(conn, "SELECT pgmq.send_topic(routing_key => 'orders.new', msg => '2', delay => 3600)") == 2
    assert (
        scalar(
            conn,
            "SELECT pgmq.send_topic(routing_key => 'orders.new', msg => '3', headers => %s, delay => 0)",
            [Jsonb({"h": 1})],
        )
        == 2
    )
    for queue in ("alpha", "beta"):
        rows = q_rows(conn, queue)  # (msg_id, read_ct, vt, message, headers)
        assert [(r[3], r[4]) for r in rows] == [(1, None), (2, None), (3, {"h": 1})]
        assert rows[0][2] < before + timedelta(seconds=5)
        assert rows[1][2] > before + timedelta(seconds=3500)
    # Both copies of the delayed message become visible at the same moment.
    assert q_rows(conn, "alpha")[1][2] == q_rows(conn, "beta")[1][2]
    # Messages sent without delay are ready at once.
    assert [r[0] for r in conn.execute("SELECT * FROM pgmq.read('alpha', 30, 10)").fetchall()] == [1, 3]
    assert q_ids(conn, "other") == []


BATCH_FORMS = [
    # (arguments after routing_key and msgs, with headers?, delayed?)
    ("", False, False),
    (", headers => %(headers)s::jsonb[]", True, False),
    (", delay => 3600", False, True),
    (", delay => clock_timestamp() + interval '1 hour'", False, True),
    (", headers => %(headers)s::jsonb[], delay => 3600", True, True),
    (", headers => %(headers)s::jsonb[], delay => clock_timestamp() + interval '1 hour'", True, True),
]


@pytest.mark.parametrize(("extra", "with_headers", "delayed"), BATCH_FORMS)
def test_every_send_batch_topic_form_returns_queue_and_msg_id_rows(
    two_queues: Conn, extra: str, with_headers: bool, delayed: bool
) -> None:
    conn = two_queues
    headers = [{"i": 0}, None, {"i": 2}]
    query = sql.SQL(
        "SELECT * FROM pgmq.send_batch_topic(routing_key => 'orders.new', msgs => %(msgs)s::jsonb[]{})"
    ).format(sql.SQL(extra))
    cur = conn.execute(query, {"msgs": jsonb_array(["a", "b", "c"]), "headers": jsonb_array(headers)})
    assert describe(conn, cur) == SENT_COLUMNS
    rows = cur.fetchall()
    ids = {queue: q_ids(conn, queue) for queue in ("alpha", "beta")}
    # One row per message per queue: queues in name order, messages in the order given.
    assert rows == [("alpha", i) for i in ids["alpha"]] + [("beta", i) for i in ids["beta"]]
    now = db_now(conn)
    for queue in ("alpha", "beta"):
        stored = q_rows(conn, queue)
        assert [r[3] for r in stored] == ["a", "b", "c"]
        assert [r[4] for r in stored] == (headers if with_headers else [None, None, None])
        assert all((r[2] > now + timedelta(seconds=3000)) == delayed for r in stored)


@pytest.mark.parametrize("key", ["orders.new", "no.match"])
def test_send_batch_topic_checks_the_batch_like_send_batch_even_with_no_queue_reached(
    two_queues: Conn, key: str
) -> None:
    for msgs, headers, message in [
        ([], None, "msgs cannot be NULL or empty"),
        (None, None, "msgs cannot be NULL or empty"),
        (["1", "2"], [], "headers array length (0) must match msgs array length (2)"),
        (["1", "2"], ["{}"], "headers array length (1) must match msgs array length (2)"),
    ]:
        error = refused(
            two_queues,
            "SELECT * FROM pgmq.send_batch_topic(%s, %s::jsonb[], %s::jsonb[])",
            [key, msgs, headers],
        )
        assert_pgmq_error(error, "PB007")
        assert message in str(error)
    assert q_ids(two_queues, "alpha") == q_ids(two_queues, "beta") == []


def test_send_topic_refuses_a_null_message_and_a_bad_delay_even_with_no_queue_bound(conn: Conn) -> None:
    error = refused(conn, "SELECT pgmq.send_topic('orders.new', NULL::jsonb)")
    assert_pgmq_error(error, "PB007")
    assert "msg cannot be NULL" in str(error)
    error = refused(conn, "SELECT pgmq.send_topic('orders.new', '{}', -1)")
    assert_pgmq_error(error, "PB007")
    assert "delay cannot be negative, got: -1" in str(error)


def test_send_topic_is_all_or_nothing(two_queues: Conn) -> None:
    # beta's table is gone under the binding: the whole send fails, alpha gets nothing either.
    two_queues.execute("ALTER TABLE pgmq.q_beta RENAME TO q_beta_moved")
    error = refused(two_queues, "SELECT pgmq.send_topic('orders.new', '{}')")
    assert error.sqlstate == "42P01"
    assert q_ids(two_queues, "alpha") == []


# -- bindings ---------------------------------------------------------------------------------


def bindings(conn: Conn) -> list[tuple[str, str]]:
    return [
        (str(r[0]), str(r[1])) for r in conn.execute("SELECT * FROM pgmq.list_topic_bindings()").fetchall()
    ]


def test_bind_topic_is_idempotent_and_stores_the_queues_own_name(conn: Conn) -> None:
    create(conn, "Orders")
    bind(conn, "orders.*", "Orders")
    bind(conn, "orders.*", "Orders")
    bind(conn, "orders.*", "ORDERS")  # queue names are found in any case
    assert bindings(conn) == [("orders.*", "Orders")]
    assert routed(conn, "orders.x") == {"Orders"}


def test_bind_topic_requires_an_existing_queue_and_a_valid_pattern(conn: Conn) -> None:
    error = refused(conn, "SELECT pgmq.bind_topic('orders.*', 'missing')")
    assert_pgmq_error(error, "PB002")
    assert 'Queue "missing" does not exist' in str(error)
    error = refused(conn, "SELECT pgmq.bind_topic('orders.*', NULL)")
    assert_pgmq_error(error, "PB001")
    create(conn, "jobs")
    error = refused(conn, "SELECT pgmq.bind_topic('orders..x', 'jobs')")
    assert_pgmq_error(error, "PB007")
    assert "consecutive dots" in str(error)
    assert bindings(conn) == []


def test_a_direct_insert_of_a_bad_pattern_is_refused(conn: Conn) -> None:
    create(conn, "jobs")
    error = refused(conn, "INSERT INTO pgmq.topic_bindings (pattern, queue_name) VALUES ('a.**', 'jobs')")
    assert_pgmq_error(error, "PB007")


def test_unbind_topic_returns_whether_a_binding_was_removed(conn: Conn) -> None:
    create(conn, "jobs")
    bind(conn, "orders.*", "jobs")
    bind(conn, "orders.#", "jobs")
    assert scalar(conn, "SELECT pgmq.unbind_topic(pattern => 'orders.*', queue_name => 'JOBS')") is True
    assert scalar(conn, "SELECT pgmq.unbind_topic('orders.*', 'jobs')") is False
    assert scalar(conn, "SELECT pgmq.unbind_topic('orders.*', 'missing')") is False
    assert bindings(conn) == [("orders.#", "jobs")]
    for args in ("NULL, 'jobs'", "'', 'jobs'", "'orders.#', NULL", "'orders.#', ''"):
        error = refused(conn, sql.SQL("SELECT pgmq.unbind_topic({})").format(sql.SQL(args)))
        assert_pgmq_error(error, "PB001" if args.endswith(("NULL", "''")) else "PB007")
        assert "cannot be NULL or empty" in str(error)
    assert bindings(conn) == [("orders.#", "jobs")]


def test_bindings_go_away_with_their_queue(conn: Conn) -> None:
    create(conn, "jobs", "keep")
    bind(conn, "orders.*", "jobs")
    bind(conn, "#", "jobs")
    bind(conn, "orders.*", "keep")
    assert scalar(conn, "SELECT pgmq.drop_queue('jobs')") is True
    assert bindings(conn) == [("orders.*", "keep")]
    assert scalar(conn, "SELECT pgmq.send_topic('orders.x', '{}')") == 1
    # A new queue of the same name starts without bindings.
    create(conn, "jobs")
    assert routed(conn, "orders.x") == {"keep"}


def test_list_topic_bindings_columns_and_order(conn: Conn) -> None:
    create(conn, "jobs", "other")
    bind(conn, "b.*", "jobs")
    bind(conn, "a.*", "other")
    bind(conn, "a.#", "jobs")
    cur = conn.execute("SELECT * FROM pgmq.list_topic_bindings()")
    assert describe(conn, cur) == BINDING_COLUMNS
    rows = cur.fetchall()
    # Newest first.
    assert [(r[0], r[1]) for r in rows] == [("a.#", "jobs"), ("a.*", "other"), ("b.*", "jobs")]
    assert all(isinstance(r[2], datetime) for r in rows)
    assert [r[3] for r in rows] == [r"^a\..*$", r"^a\.[^.]+$", r"^b\.[^.]+$"]  # pgmq's compilation

    cur = conn.execute("SELECT * FROM pgmq.list_topic_bindings(queue_name => 'JOBS')")
    assert describe(conn, cur) == BINDING_COLUMNS
    assert [(r[0], r[1]) for r in cur.fetchall()] == [("a.#", "jobs"), ("b.*", "jobs")]
    assert conn.execute("SELECT * FROM pgmq.list_topic_bindings('missing')").fetchall() == []


def test_test_routing_columns_and_order(conn: Conn) -> None:
    create(conn, "jobs", "other")
    bind(conn, "orders.*", "other")
    bind(conn, "#", "jobs")
    bind(conn, "orders.*", "jobs")
    cur = conn.execute("SELECT * FROM pgmq.test_routing(routing_key => 'orders.x')")
    assert describe(conn, cur) == ROUTING_COLUMNS
    assert cur.fetchall() == [
        ("#", "jobs", "^.*$"),
        ("orders.*", "jobs", r"^orders\.[^.]+$"),
        ("orders.*", "other", r"^orders\.[^.]+$"),
    ]
    # test_routing only looks: nothing was sent.
    assert q_ids(conn, "jobs") == q_ids(conn, "other") == []


# -- validation -------------------------------------------------------------------------------

VALID_KEYS = [
    "logs.error",
    "app.user-service.auth",
    "system_events.db.connection_failed",
    "x",
    "A.b9",
    "k" * 255,
]
INVALID_KEYS = [
    (None, "routing_key cannot be NULL or empty"),
    ("", "routing_key cannot be NULL or empty"),
    ("k" * 256, "routing_key length cannot exceed 255 characters"),
    (".logs.error", "routing_key cannot start with a dot"),
    ("logs.error.", "routing_key cannot end with a dot"),
    ("logs..error", "routing_key cannot contain consecutive dots"),
    ("logs.error!", "routing_key contains invalid characters"),
    ("logs error", "routing_key contains invalid characters"),
    ("logs.*", "routing_key contains invalid characters"),
    ("logs.#", "routing_key contains invalid characters"),
    ("café", "routing_key contains invalid characters"),
    (".", "routing_key cannot start with a dot"),
]
VALID_PATTERNS = [
    "logs.*", "logs.#", "*.error", "#.error", "app.*.#", "#", "*", "*.*", "#.#", "a.#.z",
    "user-*", "a#", "logs.error", "p" * 255,
]  # fmt: skip
INVALID_PATTERNS = [
    (None, "pattern cannot be NULL or empty"),
    ("", "pattern cannot be NULL or empty"),
    ("p" * 256, "pattern length cannot exceed 255 characters"),
    (".logs.*", "pattern cannot start with a dot"),
    ("logs.*.", "pattern cannot end with a dot"),
    ("logs..error", "pattern cannot contain consecutive dots"),
    ("logs.**", "pattern cannot contain consecutive stars"),
    ("logs.##", "pattern cannot contain consecutive hashes"),
    ("logs.*#", "pattern cannot contain adjacent wildcards"),
    ("logs.#*", "pattern cannot contain adjacent wildcards"),
    ("logs.error!", "pattern contains invalid characters"),
    ("logs error", "pattern contains invalid characters"),
    ("logs.$", "pattern contains invalid characters"),
]


@pytest.mark.parametrize("key", VALID_KEYS)
def test_valid_routing_keys_are_accepted(conn: Conn, key: str) -> None:
    assert scalar(conn, "SELECT pgmq.validate_routing_key(%s)", [key]) is True


@pytest.mark.parametrize(("key", "message"), INVALID_KEYS)
def test_invalid_routing_keys_are_refused_everywhere_a_key_is_taken(
    conn: Conn, key: str | None, message: str
) -> None:
    create(conn, "jobs")
    bind(conn, "#", "jobs")
    for query in (
        "SELECT pgmq.validate_routing_key(%s::text)",
        "SELECT * FROM pgmq.test_routing(%s::text)",
        "SELECT pgmq.send_topic(%s::text, '{}')",
        "SELECT * FROM pgmq.send_batch_topic(%s::text, '{\"{}\"}')",
    ):
        error = refused(conn, query, [key])
        assert_pgmq_error(error, "PB007")
        assert message in str(error), query
        assert error.diag.message_hint
    assert q_ids(conn, "jobs") == []


@pytest.mark.parametrize("pattern", VALID_PATTERNS)
def test_valid_topic_patterns_are_accepted(conn: Conn, pattern: str) -> None:
    assert scalar(conn, "SELECT pgmq.validate_topic_pattern(%s)", [pattern]) is True
    create(conn, "jobs")
    bind(conn, pattern, "jobs")
    # Every pattern compiles to a regex Postgres accepts.
    conn.execute("SELECT * FROM pgmq.test_routing('a.b')")


@pytest.mark.parametrize(("pattern", "message"), INVALID_PATTERNS)
def test_invalid_topic_patterns_are_refused(conn: Conn, pattern: str | None, message: str) -> None:
    create(conn, "jobs")
    for query in (
        "SELECT pgmq.validate_topic_pattern(%s::text)",
        "SELECT pgmq.bind_topic(%s::text, 'jobs')",
    ):
        error = refused(conn, query, [pattern])
        assert_pgmq_error(error, "PB007")
        assert message in str(error), query
        assert error.diag.message_hint
    assert bindings(conn) == []


def accepts(conn: Conn, function: str, value: str | None) -> bool:
    query = {
        "key": "SELECT pgmq.validate_routing_key(%s::text)",
        "pattern": "SELECT pgmq.validate_topic_pattern(%s::text)",
    }[function]
    try:
        with conn.transaction():
            conn.execute(query, [value])
    except psycopg.Error:
        return False
    return True


def test_validation_accepts_and_refuses_exactly_what_the_reference_does(conn: Conn, reference: str) -> None:
    samples: list[str | None] = [k for k, _ in INVALID_KEYS] + [p for p, _ in INVALID_PATTERNS]
    samples += VALID_KEYS + VALID_PATTERNS
    samples += [
        "a-b_c.D",
        "-",
        "_",
        "a.-",
        "*a",
        "a*b",
        "#a.b",
        "a.b#",
        "a.*b.c",
        "a b",
        "a\tb",
        "a/b",
        "é.x",
    ]
    samples += ["k" * 254 + ".", "*." * 100 + "*", "#.*.#", "a..", "..", "*#*", "##", "**"]
    with psycopg.connect(reference) as ref:
        for value in samples:
            for function in ("key", "pattern"):
                assert accepts(conn, function, value) == accepts(ref, function, value), (function, value)


# -- upgrades ---------------------------------------------------------------------------------


def test_bindings_made_before_0015_keep_amqps_hash(empty_dsn: str) -> None:
    """Until development migration 0015 '#' was AMQP's; an upgrade must not change where messages
    go, so bindings with a '#' word become AMQP bindings. Others are compiled again the pgmq way.
    (A database from before 0015 is upgraded by the development migrations to 24, then to the
    baseline.)"""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        install_dev(conn, up_to=14)
        create(conn, "logs", "audit", "exact")
        bind(conn, "logs.#", "logs")
        bind(conn, "#.audit", "audit")
        bind(conn, "a.*", "exact")
        bind(conn, "user-#", "exact")  # '#' inside a word: the same in both meanings
        before = {key: routed(conn, key) for key in ("logs", "logs.x", "audit", "x.audit", "a.b", "user-1")}
        install_dev(conn)
        install(conn)
        assert {key: routed(conn, key) for key in before} == before
        amqp = conn.execute(
            "SELECT pattern, queue_name FROM pgbroker.topic_amqp_bindings ORDER BY 1"
        ).fetchall()
        assert amqp == [("#.audit", "audit"), ("logs.#", "logs")]
        regexes: dict[str, str] = dict(
            conn.execute("SELECT pattern, compiled_regex FROM pgmq.topic_bindings").fetchall()
        )
        assert regexes == {
            "logs.#": r"^logs\..*$",
            "#.audit": r"^.*\.audit$",
            "a.*": r"^a\.[^.]+$",
            "user-#": r"^user-.*$",
        }
        # New bindings are pgmq's.
        bind(conn, "new.#", "logs")
        assert routed(conn, "new") == set()
