"""Bad input gets a typed error that says what was wrong, and changes nothing.

Each test snapshots pgmq.meta, every pgmq relation and every queue's rows before the bad call
and compares after it. Functions of schema pgmq fail with pgmq's SQLSTATE (P0001, 42P01, 2201W,
...) and carry pgbroker's code in DETAIL; the client maps that code to the typed error
(tests/compat/test_failures.py compares every such failure with pgmq's own).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgbroker import (
    Broker,
    InvalidArgument,
    InvalidMessage,
    InvalidQueueName,
    MessageTooLarge,
    PgbrokerError,
    Queue,
    QueueNameConflict,
    QueueNotFound,
)
from pgbroker.errors import from_postgres
from tests.support.tables import Conn, database_state, meta, pgmq_relations, q_ids, q_rows

Q = "jobs"


@pytest.fixture(scope="module")
def populated(module_broker: Broker) -> Queue:
    """The 'jobs' queue of the module's shared database, holding leased, visible and archived messages.

    Every test using it proves that its bad call changed nothing, so they can share it.
    """
    queue = module_broker.create_queue(Q)
    queue.send_many([{"n": 0}, {"n": 1}, {"n": 2}])
    queue.read(vt=3600)
    queue.archive(queue.send({"n": 3}))
    return queue


@pytest.fixture
def shared(module_conn: Conn, populated: Queue) -> Conn:
    """The connection to the database holding ``populated``."""
    return module_conn


def assert_refused(
    conn: Conn, error: type[PgbrokerError], call: Callable[[], object], match: str | None = None
) -> PgbrokerError:
    """call raises exactly ``error`` (or a subclass) and leaves the database as it was."""
    before = database_state(conn)
    with pytest.raises(error, match=match) as info:
        call()
    assert database_state(conn) == before
    return info.value


def assert_sql_refused(
    conn: Conn, sqlstate: str, query: str, params: Any = None, *, code: str | None = None
) -> psycopg.Error:
    """The call fails with ``sqlstate`` (and pgbroker's ``code``, when given) and changes nothing."""
    before = database_state(conn)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    assert info.value.sqlstate == sqlstate, info.value
    if code is not None:
        assert from_postgres(info.value).code == code, info.value.diag.message_detail
    assert database_state(conn) == before
    return info.value


# -- queue names ------------------------------------------------------------------------------

BAD_NAMES = [
    pytest.param("x" * 48, "too long", id="48-chars"),
    pytest.param("", "empty", id="empty"),
    pytest.param("a$b", "invalid characters", id="dollar"),
    pytest.param("a;b", "invalid characters", id="semicolon"),
    pytest.param("a--b", "invalid characters", id="double-dash"),
    pytest.param("a'b", "invalid characters", id="quote"),
    pytest.param("x'; DROP TABLE pgmq.meta; --", "invalid characters", id="injection"),
    pytest.param('x"; DROP TABLE pgmq.meta; --', "invalid characters", id="injection-double-quote"),
    pytest.param("a\tb", "control character", id="tab"),
    pytest.param("a\nb", "control character", id="newline"),
]


@pytest.mark.parametrize(("name", "reason"), BAD_NAMES)
def test_invalid_queue_name_is_refused_by_create_with_a_hint(
    module_broker: Broker, populated: Queue, shared: Conn, name: str, reason: str
) -> None:
    error = assert_refused(shared, InvalidQueueName, lambda: module_broker.create_queue(name), reason)
    assert error.hint
    assert error.code == "PB001"
    assert_refused(shared, InvalidQueueName, lambda: module_broker.create_queue(name, unlogged=True), reason)
    assert_refused(shared, InvalidQueueName, lambda: module_broker.queue(name).send(1))
    if reason == "invalid characters":
        assert_refused(shared, InvalidQueueName, lambda: module_broker.drop_queue(name), reason)
    else:
        # pgmq's drop_queue checks only the characters: any other name it cannot find is false.
        before = database_state(shared)
        assert module_broker.drop_queue(name) is False
        assert database_state(shared) == before


@pytest.mark.parametrize(("name", "reason"), BAD_NAMES)
def test_invalid_queue_name_is_refused_by_sql_create(
    populated: Queue, shared: Conn, name: str, reason: str
) -> None:
    """pgmq's checks (characters, then length) fail with P0001; the names pgmq would create but
    pgbroker refuses (empty, control characters) with PB001. pgbroker's code is PB001 either way."""
    pgmq_refuses = reason in ("invalid characters", "too long")
    for function in ("create", "create_non_partitioned", "create_unlogged"):
        error = assert_sql_refused(
            shared,
            "P0001" if pgmq_refuses else "PB001",
            f"SELECT pgmq.{function}(queue_name => %s)",
            [name],
            code="PB001",
        )
        assert reason in str(error)
    # pgmq's drop_queue checks the characters, validate_queue_name the length: nothing else.
    for function, refuses in (("drop_queue", "invalid characters"), ("validate_queue_name", "too long")):
        query = f"SELECT pgmq.{function}(queue_name => %s)"
        if reason == refuses:
            assert_sql_refused(shared, "P0001", query, [name], code="PB001")
        else:
            shared.execute(query, [name])
    assert [row[0] for row in meta(shared)] == [Q]


def test_queue_name_with_nul_is_an_invalid_queue_name(
    module_broker: Broker, populated: Queue, shared: Conn
) -> None:
    assert_refused(shared, InvalidQueueName, lambda: module_broker.create_queue("a\x00b"))


def test_queue_name_with_a_double_quote_is_quoted_safely(broker: Broker, queue: Queue, conn: Conn) -> None:
    name = 'a"b'
    odd = broker.create_queue(name)
    msg_id = odd.send({"odd": True})
    msg = odd.read()
    assert msg is not None
    assert msg.msg_id == msg_id
    odd.ack(msg)
    assert 'q_a"b' in pgmq_relations(conn)
    assert broker.metrics(name).total_messages == 1
    assert broker.drop_queue(name) is True
    assert [row[0] for row in meta(conn)] == [Q]
    assert 'q_a"b' not in pgmq_relations(conn)


@pytest.mark.parametrize("name", ["\u00e9" * 30, "\u00fc" * 27], ids=["60-bytes", "54-bytes"])
def test_queue_name_whose_table_names_exceed_63_bytes_is_refused(
    broker: Broker, queue: Queue, conn: Conn, name: str
) -> None:
    """Identifiers are cut at 63 bytes: q_<name>_msg_id_seq and the index names must fit."""
    assert_refused(conn, InvalidQueueName, lambda: broker.create_queue(name))


def test_multibyte_queue_name_whose_identifiers_fit_is_fully_usable(broker: Broker, conn: Conn) -> None:
    name = "\u00e9" * 23  # 46 bytes
    odd = broker.create_queue(name)
    odd.send("x")
    msg = odd.read()
    assert msg is not None
    odd.ack(msg)
    assert broker.metrics(name).total_messages == 1
    assert broker.drop_queue(name) is True


def test_name_differing_only_in_case_is_a_conflict(broker: Broker, conn: Conn) -> None:
    broker.create_queue("Orders")
    broker.queue("Orders").send("x")
    error = assert_refused(conn, QueueNameConflict, lambda: broker.create_queue("orders"), "conflicts")
    assert error.hint is not None
    assert "Orders" in error.hint
    assert_refused(conn, QueueNameConflict, lambda: broker.create_queue("ORDERS", unlogged=True))
    assert_sql_refused(conn, "PB004", "SELECT pgmq.create(queue_name => %s)", ["oRdErS"])
    broker.create_queue("Orders")  # the same name stays idempotent
    assert [row[0] for row in meta(conn)] == ["Orders"]


# -- missing queues ---------------------------------------------------------------------------

RECEIPT = "1:1:1"
MISSING_QUEUE_CALLS: list[Any] = [
    pytest.param(lambda q: q.send(1), id="send"),
    pytest.param(lambda q: q.send(1, headers={"h": 1}, delay=5), id="send-headers-delay"),
    pytest.param(lambda q: q.send_many([1, 2]), id="send_many"),
    pytest.param(lambda q: q.read(), id="read"),
    pytest.param(lambda q: q.read_many(5, wait=1), id="read_many-wait"),
    pytest.param(lambda q: q.pop(), id="pop"),
    pytest.param(lambda q: q.pop_many(3), id="pop_many"),
    pytest.param(lambda q: q.ack(RECEIPT), id="ack"),
    pytest.param(lambda q: q.ack_many([RECEIPT]), id="ack_many"),
    pytest.param(lambda q: q.nack(RECEIPT), id="nack"),
    pytest.param(lambda q: q.nack_many([RECEIPT]), id="nack_many"),
    pytest.param(lambda q: q.extend(RECEIPT, vt=5), id="extend"),
    pytest.param(lambda q: q.extend_many([RECEIPT], vt=5), id="extend_many"),
    pytest.param(lambda q: q.archive(1), id="archive"),
    pytest.param(lambda q: q.archive_many([1]), id="archive_many"),
    pytest.param(lambda q: q.delete(1), id="delete"),
    pytest.param(lambda q: q.delete_many([1]), id="delete_many"),
    pytest.param(lambda q: q.set_vt(1, 5), id="set_vt"),
    pytest.param(lambda q: q.purge(), id="purge"),
    pytest.param(lambda q: q.metrics(), id="metrics"),
]


@pytest.mark.parametrize("call", MISSING_QUEUE_CALLS)
def test_every_operation_on_a_missing_queue_is_queue_not_found(
    module_broker: Broker, populated: Queue, shared: Conn, call: Callable[[Queue], object]
) -> None:
    error = assert_refused(
        shared, QueueNotFound, lambda: call(module_broker.queue("nope")), '"nope" does not exist'
    )
    assert error.hint is not None
    assert "pgmq.create('nope')" in error.hint


def test_dropping_a_missing_queue_is_false_not_an_error(
    module_broker: Broker, populated: Queue, shared: Conn
) -> None:
    before = database_state(shared)
    assert module_broker.drop_queue("nope") is False
    assert database_state(shared) == before


MISSING_QUEUE_SQL = [
    "SELECT pgmq.send(queue_name => 'nope', msg => '1')",
    "SELECT pgmq.send(queue_name => 'nope', msg => '1', headers => '{}', delay => now())",
    "SELECT pgmq.send_batch(queue_name => 'nope', msgs => '{1}'::jsonb[])",
    "SELECT * FROM pgmq.read(queue_name => 'nope', vt => 1, qty => 1)",
    "SELECT * FROM pgmq.read_with_poll(queue_name => 'nope', vt => 1, qty => 1, max_poll_seconds => 1)",
    "SELECT * FROM pgmq.pop(queue_name => 'nope')",
    "SELECT pgmq.delete(queue_name => 'nope', msg_id => 1)",
    "SELECT pgmq.delete(queue_name => 'nope', msg_ids => '{1}'::bigint[])",
    "SELECT pgmq.archive(queue_name => 'nope', msg_id => 1)",
    "SELECT pgmq.archive(queue_name => 'nope', msg_ids => '{1}'::bigint[])",
    "SELECT * FROM pgmq.set_vt(queue_name => 'nope', msg_id => 1, vt => 1)",
    "SELECT * FROM pgmq.set_vt(queue_name => 'nope', msg_ids => '{1}'::bigint[], vt => now())",
    "SELECT pgmq.purge_queue(queue_name => 'nope')",
    "SELECT * FROM pgmq.metrics(queue_name => 'nope')",
    "SELECT * FROM pgbroker.read(queue_name => 'nope', vt => 1, qty => 1)",
    "SELECT pgbroker.ack(queue_name => 'nope', receipt => '1:1:1')",
    "SELECT pgbroker.ack(queue_name => 'nope', receipts => '{1:1:1}'::text[])",
    "SELECT pgbroker.nack(queue_name => 'nope', receipt => '1:1:1')",
    "SELECT pgbroker.extend(queue_name => 'nope', receipt => '1:1:1', vt => 1)",
]


@pytest.mark.parametrize("query", MISSING_QUEUE_SQL)
def test_every_sql_function_on_a_missing_queue_raises_queue_not_found(
    populated: Queue, shared: Conn, query: str
) -> None:
    """pgmq's functions fail as pgmq does (42P01, the missing table), pgbroker's with PB002; both
    are QueueNotFound with a hint."""
    pgmq = "pgmq." in query
    error = assert_sql_refused(shared, "42P01" if pgmq else "PB002", query, code="PB002")
    if pgmq:
        assert error.diag.message_primary == 'relation "pgmq.q_nope" does not exist'
    assert isinstance(from_postgres(error), QueueNotFound)
    assert error.diag.message_hint is not None
    assert "pgmq.create" in error.diag.message_hint


# -- payloads ---------------------------------------------------------------------------------


class Opaque:
    pass


NOT_JSON: list[Any] = [
    pytest.param({1, 2}, id="set"),
    pytest.param(math.nan, id="nan"),
    pytest.param({"x": math.inf}, id="infinity"),
    pytest.param(Opaque(), id="object"),
    pytest.param(b"bytes", id="bytes"),
    pytest.param({(1, 2): "tuple key"}, id="tuple-key"),
    pytest.param("\ud800", id="lone-surrogate"),
    pytest.param("a\x00b", id="nul-character"),
]


@pytest.mark.parametrize("payload", NOT_JSON)
def test_non_json_payload_is_an_invalid_message(populated: Queue, shared: Conn, payload: Any) -> None:
    assert_refused(shared, InvalidMessage, lambda: populated.send(payload))
    assert_refused(shared, InvalidMessage, lambda: populated.send_many([{"fine": 1}, payload]))


@pytest.mark.parametrize("payload", NOT_JSON)
def test_non_json_headers_are_an_invalid_message(populated: Queue, shared: Conn, payload: Any) -> None:
    assert_refused(shared, InvalidMessage, lambda: populated.send(1, headers={"h": payload}))


def test_headers_that_are_not_a_mapping_are_an_invalid_message(populated: Queue, shared: Conn) -> None:
    assert_refused(shared, InvalidMessage, lambda: populated.send(1, headers=[("a", 1)]))  # type: ignore[arg-type]
    assert_refused(
        shared,
        InvalidMessage,
        lambda: populated.send_many([1], headers=["not a mapping"]),  # type: ignore[list-item]
    )


def test_non_json_conditional_is_an_invalid_message(populated: Queue, shared: Conn) -> None:
    assert_refused(shared, InvalidMessage, lambda: populated.read(conditional={"x": {1}}))


def test_non_json_text_through_sql_is_refused_before_anything_is_written(
    populated: Queue, shared: Conn
) -> None:
    error = assert_sql_refused(
        shared, "22P02", "SELECT pgmq.send(queue_name => %s, msg => '{bad'::jsonb)", [Q]
    )
    assert isinstance(from_postgres(error), InvalidMessage)
    assert_sql_refused(shared, "22P02", "SELECT pgmq.send_batch(%s, ARRAY['1', '{bad']::jsonb[])", [Q])


# -- numbers ----------------------------------------------------------------------------------

BAD_SQL_ARGUMENTS = [
    # pgmq's own failures, with pgmq's SQLSTATE
    pytest.param("SELECT * FROM pgmq.read(%s, vt => 1, qty => -1)", "2201W", id="read-negative-qty"),
    pytest.param("SELECT * FROM pgmq.pop(%s, qty => -1)", "2201W", id="pop-negative-qty"),
    pytest.param(
        "SELECT pgmq.send_batch(%s, '{1,2}'::jsonb[], '{}'::jsonb[])", "P0001", id="batch-headers-too-short"
    ),
    pytest.param(
        "SELECT pgmq.send_batch(%s, '{1}'::jsonb[], ARRAY['{}', '{}']::jsonb[], 0)",
        "P0001",
        id="batch-headers-too-long",
    ),
    pytest.param("SELECT pgmq.send_batch(%s, '{}'::jsonb[])", "P0001", id="batch-empty"),
    pytest.param("SELECT pgmq.send_batch(%s, NULL::jsonb[])", "P0001", id="batch-null"),
    # pgbroker's own functions refuse what pgmq's functions take as pgmq does (migration 0018;
    # tests/compat/test_differential.py compares those with pgmq)
    pytest.param("SELECT * FROM pgbroker.read(%s, vt => -1, qty => 1)", "PB007", id="read-negative-vt"),
    pytest.param("SELECT * FROM pgbroker.read(%s, vt => NULL, qty => 1)", "PB007", id="read-null-vt"),
    pytest.param("SELECT * FROM pgbroker.read(%s, vt => 1, qty => NULL)", "PB007", id="read-null-qty"),
    pytest.param("SELECT * FROM pgbroker.read(%s, vt => 1, qty => -1)", "PB007", id="read-negative-qty-pb"),
    pytest.param(
        "SELECT * FROM pgbroker.read_with_poll(%s, 1, 1, max_poll_seconds => -1)",
        "PB007",
        id="poll-negative-wait",
    ),
    pytest.param(
        "SELECT * FROM pgbroker.read_with_poll(%s, 1, 1, max_poll_seconds => NULL)",
        "PB007",
        id="poll-null-wait",
    ),
    pytest.param(
        "SELECT * FROM pgbroker.read_with_poll(%s, 1, 1, poll_interval_ms => 0)",
        "PB007",
        id="poll-zero-interval",
    ),
    pytest.param("SELECT * FROM pgbroker.consume(%s, vt => -1, qty => 1)", "PB007", id="consume-negative-vt"),
    pytest.param("SELECT * FROM pgbroker.consume(%s, vt => 1, qty => NULL)", "PB007", id="consume-null-qty"),
    pytest.param("SELECT * FROM pgbroker.peek(%s, qty => NULL)", "PB007", id="peek-null-qty"),
    pytest.param("SELECT pgbroker.nack(%s, '1:1:1', delay => NULL)", "PB007", id="nack-null-delay"),
    pytest.param("SELECT pgbroker.extend(%s, '1:1:1', vt => NULL)", "PB007", id="extend-null-vt"),
    pytest.param("SELECT pgbroker.nack(%s, '1:1:1', delay => -1)", "PB007", id="nack-negative-delay"),
    pytest.param("SELECT pgbroker.extend(%s, '1:1:1', vt => -1)", "PB007", id="extend-negative-vt"),
    pytest.param("SELECT pgbroker.ack(%s, '1:1:1', archive => NULL)", "PB007", id="ack-null-archive"),
]


@pytest.mark.parametrize(("query", "sqlstate"), BAD_SQL_ARGUMENTS)
def test_out_of_range_sql_argument_is_an_invalid_argument(
    populated: Queue, shared: Conn, query: str, sqlstate: str
) -> None:
    """pgmq's own failures (a negative LIMIT, a bad batch) keep pgmq's SQLSTATE; pgbroker's own
    functions refuse a negative or NULL vt, delay or qty and a bad poll with PB007."""
    error = assert_sql_refused(shared, sqlstate, query, [Q], code="PB007")
    assert isinstance(from_postgres(error), InvalidArgument)


def test_sql_argument_errors_carry_a_hint(populated: Queue, shared: Conn) -> None:
    error = assert_sql_refused(shared, "PB007", "SELECT * FROM pgbroker.read(%s, -1, 1)", [Q])
    assert error.diag.message_hint
    error = assert_sql_refused(
        shared, "P0001", "SELECT pgmq.send_batch(%s, '{1,2}'::jsonb[], '{}'::jsonb[])", [Q], code="PB007"
    )
    assert error.diag.message_hint


BAD_CLIENT_ARGUMENTS: list[Any] = [
    pytest.param(lambda q: q.read(vt=-1), id="read-negative-vt"),
    pytest.param(lambda q: q.read(vt=None), id="read-null-vt"),
    pytest.param(lambda q: q.read_many(None), id="read-null-qty"),
    pytest.param(lambda q: q.nack("1:1:1", delay=None), id="nack-null-delay"),
    pytest.param(lambda q: q.read(vt=math.nan), id="read-nan-vt"),
    pytest.param(lambda q: q.read(vt=True), id="read-bool-vt"),
    pytest.param(lambda q: q.read(vt=timedelta(seconds=-1)), id="read-negative-timedelta"),
    pytest.param(lambda q: q.read(wait=-1), id="read-negative-wait"),
    pytest.param(lambda q: q.read_many(-1), id="read-negative-qty"),
    pytest.param(lambda q: q.read_many(1.5), id="read-float-qty"),
    pytest.param(lambda q: q.pop_many(-1), id="pop-negative-qty"),
    pytest.param(lambda q: q.send(1, delay=-1), id="send-negative-delay"),
    pytest.param(lambda q: q.send(1, delay=math.inf), id="send-infinite-delay"),
    pytest.param(lambda q: q.send(1, delay=datetime(2030, 1, 1)), id="send-naive-datetime"),
    pytest.param(lambda q: q.set_vt(1, datetime(2030, 1, 1)), id="set_vt-naive-datetime"),
    pytest.param(lambda q: q.set_vt(1, -1), id="set_vt-negative"),
    pytest.param(lambda q: q.nack("1:1:1", delay=-1), id="nack-negative-delay"),
    pytest.param(lambda q: q.extend("1:1:1", vt=-1), id="extend-negative-vt"),
    pytest.param(lambda q: q.send_many([]), id="send_many-empty"),
    pytest.param(lambda q: q.send_many([1, 2], headers=[{}]), id="headers-too-short"),
    pytest.param(lambda q: q.send_many([1], headers=[{}, {}]), id="headers-too-long"),
    pytest.param(lambda q: q.delete("1"), id="delete-str-id"),
    pytest.param(lambda q: q.archive_many([1, True]), id="archive-bool-id"),
    pytest.param(lambda q: q.ack(42), id="ack-int"),
]


@pytest.mark.parametrize("call", BAD_CLIENT_ARGUMENTS)
def test_bad_client_argument_is_an_invalid_argument(
    populated: Queue, shared: Conn, call: Callable[[Queue], object]
) -> None:
    assert_refused(shared, InvalidArgument, lambda: call(populated))


BEYOND_SQL_INTEGERS: list[Any] = [
    pytest.param(lambda q: q.read(vt=2**31), id="vt"),
    pytest.param(lambda q: q.read_many(2**31), id="qty"),
    pytest.param(lambda q: q.send(1, delay=2**31), id="delay"),
    pytest.param(lambda q: q.delete(2**63), id="msg_id"),
]


@pytest.mark.parametrize("call", BEYOND_SQL_INTEGERS)
def test_client_number_beyond_the_sql_integer_range_is_an_invalid_argument(
    populated: Queue, shared: Conn, call: Callable[[Queue], object]
) -> None:
    assert_refused(shared, InvalidArgument, lambda: call(populated))


# -- sizes ------------------------------------------------------------------------------------


@pytest.fixture
def small_limit_broker(dsn: str) -> Iterator[tuple[Broker, Conn]]:
    """A broker on one connection where pgbroker.max_message_bytes is 200."""
    with psycopg.connect(dsn, autocommit=True) as limited:
        limited.execute("SET pgbroker.max_message_bytes = 200")
        yield Broker(connection=limited), limited


def test_message_over_the_configured_limit_is_too_large(
    small_limit_broker: tuple[Broker, Conn], queue: Queue, conn: Conn
) -> None:
    broker, limited = small_limit_broker
    small = broker.queue(Q)
    error = assert_refused(conn, MessageTooLarge, lambda: small.send("x" * 300), "too large")
    assert error.hint is not None
    assert "max_message_bytes" in error.hint
    assert_refused(conn, MessageTooLarge, lambda: small.send_many(["ok", "x" * 300]))
    assert_sql_refused(limited, "PB005", "SELECT pgmq.send(%s, %s)", [Q, Jsonb("y" * 300)])
    msg_id = small.send("x" * 100)
    assert msg_id in q_ids(conn, Q)


def test_default_limit_is_one_mebibyte(queue: Queue, conn: Conn) -> None:
    assert_refused(conn, MessageTooLarge, lambda: queue.send("x" * (1024 * 1024 + 100)))
    msg_id = queue.send("x" * (1024 * 1024 - 100))
    assert msg_id in q_ids(conn, Q)


def test_failed_batch_writes_no_message(populated: Queue, shared: Conn) -> None:
    before = q_rows(shared, Q)
    with pytest.raises(MessageTooLarge):
        populated.send_many(["a", "b", "x" * (1024 * 1024 + 100)])
    assert q_rows(shared, Q) == before
