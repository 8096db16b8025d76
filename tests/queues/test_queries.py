"""The query layer: encoding of arguments, choice of query, decoding of rows. No database."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from typing import Any

import pytest

from pgbroker import InvalidArgument, InvalidMessage, Message, Receipt, __version__
from pgbroker import _sql as sql
from pgbroker.queues import _arguments as arg
from pgbroker.queues import _queries as q
from pgbroker.queues._query import Query
from tests.support.dev_schema import dev_migrations

NOW = datetime(2030, 1, 1, tzinfo=UTC)
PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def placeholders(query: Query[Any]) -> set[str]:
    return set(PLACEHOLDER.findall(query.sql))


def test_encode_json_is_compact_and_keeps_unicode_meaning() -> None:
    text = arg.encode_json({"a": [1, 2.5, None, True], "b": "\u00e9"})
    assert text == '{"a":[1,2.5,null,true],"b":"\\u00e9"}'
    assert json.loads(text) == {"a": [1, 2.5, None, True], "b": "\u00e9"}


@pytest.mark.parametrize("value", [{1}, math.nan, math.inf, -math.inf, object(), b"x", {(1,): 2}])
def test_encode_json_refuses_what_json_cannot_carry(value: Any) -> None:
    with pytest.raises(InvalidMessage, match="not JSON-serialisable") as info:
        arg.encode_json(value)
    assert info.value.hint


def test_circular_payload_is_an_invalid_message() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidMessage):
        arg.encode_json(loop)


def test_every_query_builder_supplies_exactly_the_parameters_its_sql_names() -> None:
    receipt = "1:1:1"
    built: list[Query[Any]] = [
        q.queue_create("x"),
        q.queue_create("x", unlogged=True),
        q.queue_drop("x"),
        q.queue_list(),
        q.queue_metrics("x"),
        q.queue_metrics_all(),
        q.queue_purge("x"),
        q.message_send_many("x", [1]),
        q.message_send_many("x", [1], delay=5),
        q.message_send_many("x", [1], delay=NOW),
        q.message_read_many("x", 1),
        q.message_read_many("x", 1, conditional={"k": 1}),
        q.message_pop_many("x", 1),
        q.message_ack("x", receipt),
        q.message_ack_many("x", [receipt]),
        q.message_nack("x", receipt),
        q.message_nack_many("x", [receipt]),
        q.message_extend("x", receipt, vt=5),
        q.message_extend_many("x", [receipt], vt=5),
        q.message_archive_many("x", [1]),
        q.message_delete_many("x", [1]),
        q.message_set_vt_many("x", [1], 5),
        q.message_set_vt_many("x", [1], NOW),
        q.message_peek_many("x", 1),
        q.message_complete_many("x", [receipt]),
        q.message_fail("x", receipt, error="e"),
        q.notify_enable_if_disabled("x"),
        q.policy_get("x"),
        q.policy_list(),
        q.policy_set("x", {"max_deliveries": 3}),
        q.dead_letter_list("x", 1),
        q.dead_letter_replay_many("x"),
        q.dead_letter_purge_many("x", [1]),
        q.archive_trim("x"),
    ]
    for query in built:
        assert placeholders(query) == set(query.params), query.sql
        assert query.sql in sql.queries("queues").values()


def test_send_without_delay_uses_the_plain_batch_query() -> None:
    query = q.message_send_many("jobs", [{"a": 1}, "b"], headers=[{"h": 1}, None])
    assert query.sql == sql.queries("queues")["message_send_many"]
    # One JSON array each (pgbroker._jsonb_array makes the jsonb[] again): a missing header is null.
    assert query.params == {"queue": "jobs", "messages": '[{"a":1},"b"]', "headers": '[{"h":1},null]'}


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [
        (0, 0),
        (5, 5),
        (timedelta(milliseconds=200), 1),
        (timedelta(milliseconds=1500), 2),
        (timedelta(hours=1), 3600),
    ],
)
def test_delay_in_seconds_is_rounded_up_to_whole_seconds(delay: int | timedelta, seconds: int) -> None:
    query = q.message_send_many("jobs", [1], delay=delay)
    assert query.sql == sql.queries("queues")["message_send_many_delay_seconds"]
    assert query.params["delay"] == seconds


def test_delay_as_an_aware_datetime_uses_the_timestamp_query() -> None:
    query = q.message_send_many("jobs", [1], delay=NOW)
    assert query.sql == sql.queries("queues")["message_send_many_delay_until"]
    assert query.params["delay"] == NOW


def test_naive_datetime_delay_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        q.message_send_many("jobs", [1], delay=datetime(2030, 1, 1))


def test_naive_datetime_vt_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        q.message_set_vt_many("jobs", [1], datetime(2030, 1, 1))


@pytest.mark.parametrize("delay", [-1, -0.5, timedelta(seconds=-1), math.nan, math.inf, True, "5"])
def test_bad_delay_is_an_invalid_argument(delay: Any) -> None:
    with pytest.raises(InvalidArgument, match="delay"):
        q.message_send_many("jobs", [1], delay=delay)


def test_empty_batch_is_an_invalid_argument_with_a_hint() -> None:
    with pytest.raises(InvalidArgument, match="must not be empty") as info:
        q.message_send_many("jobs", [])
    assert info.value.hint


@pytest.mark.parametrize("headers", [[], [{}], [{}, {}, {}]])
def test_headers_of_another_length_than_the_messages_is_an_invalid_argument(headers: list[Any]) -> None:
    with pytest.raises(InvalidArgument, match="headers has"):
        q.message_send_many("jobs", [1, 2], headers=headers)


def test_headers_must_be_mappings() -> None:
    with pytest.raises(InvalidMessage, match="mapping"):
        q.message_send_many("jobs", [1], headers=[["a", 1]])  # type: ignore[list-item]


def test_read_rounds_vt_up_and_encodes_the_conditional() -> None:
    plain = q.message_read_many("jobs", 3, vt=timedelta(seconds=2.5))
    assert plain.sql == sql.queries("queues")["message_read_many"]
    assert plain.params == {"queue": "jobs", "vt": 3, "qty": 3, "conditional": "{}"}
    filtered = q.message_read_many("jobs", 1, conditional={"k": "v"})
    assert filtered.params["conditional"] == '{"k":"v"}'


@pytest.mark.parametrize("value", [-1, -0.001, timedelta(seconds=-1), math.nan, math.inf, True, "1", None])
def test_bad_duration_is_an_invalid_argument_naming_it(value: Any) -> None:
    with pytest.raises(InvalidArgument, match="wait"):
        arg.duration(value, "wait")


@pytest.mark.parametrize("qty", [-1, True, 1.0, "1"])
def test_bad_qty_is_an_invalid_argument(qty: Any) -> None:
    with pytest.raises(InvalidArgument, match="qty"):
        q.message_read_many("jobs", qty)
    with pytest.raises(InvalidArgument, match="qty"):
        q.message_pop_many("jobs", qty)


@pytest.mark.parametrize("msg_id", ["1", 1.0, True, None])
def test_msg_ids_must_be_integers(msg_id: Any) -> None:
    with pytest.raises(InvalidArgument, match="msg_id"):
        q.message_delete_many("jobs", [1, msg_id])


def _message(receipt: Receipt | None) -> Message:
    return Message(7, 1, NOW, NOW, NOW, {"a": 1}, None, receipt)


def test_receipt_of_accepts_a_receipt_its_text_or_a_read_message() -> None:
    receipt = Receipt(7, 1, 123)
    assert arg.receipt_of(receipt) is receipt
    assert arg.receipt_of("7:1:123") == receipt
    assert arg.receipt_of(_message(receipt)) is receipt


def test_receipt_of_a_message_without_receipt_is_an_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="carries no receipt") as info:
        arg.receipt_of(_message(None))
    assert info.value.hint


@pytest.mark.parametrize("item", [7, None, b"7:1:123", 7.0])
def test_receipt_of_anything_else_is_an_invalid_argument(item: Any) -> None:
    with pytest.raises(InvalidArgument):
        arg.receipt_of(item)


def test_ack_sends_the_receipt_text() -> None:
    query = q.message_ack("jobs", _message(Receipt(7, 1, 123)), archive=False)
    assert query.params == {"queue": "jobs", "receipt": "7:1:123", "archive": False}


def decoded(query: Query[Any], rows: list[tuple[Any, ...]]) -> Any:
    """What an executor makes of ``rows``: each made by the query's ``row`` (if any), then decoded."""
    return query.decode(rows if query.row is None else [query.row(row) for row in rows])


def test_read_rows_decode_into_messages_with_receipts() -> None:
    row = (7, 2, NOW, NOW, NOW, {"a": 1}, {"h": 1}, "7:2:999")
    [message] = decoded(q.message_read_many("jobs", 1), [row])
    assert message == Message(7, 2, NOW, NOW, NOW, {"a": 1}, {"h": 1}, Receipt(7, 2, 999))


def test_popped_rows_decode_into_messages_without_receipts() -> None:
    row = (7, 0, NOW, None, NOW, "x", None)
    assert decoded(q.message_pop_many("jobs", 1), [row]) == [Message(7, 0, NOW, None, NOW, "x", None, None)]


def test_extend_many_decodes_a_receipt_per_msg_id() -> None:
    decoded = q.message_extend_many("jobs", ["1:1:1", "2:1:1"], vt=5).decode([(1, "1:1:50"), (2, "2:1:60")])
    assert decoded == {1: Receipt(1, 1, 50), 2: Receipt(2, 1, 60)}


def test_the_development_history_is_the_frozen_migrations() -> None:
    found = sql.dev_history()
    assert [(m.version, m.name, m.checksum) for m in found] == [
        (m.version, m.name, m.checksum) for m in dev_migrations()
    ]
    assert [m.version for m in found] == list(range(1, len(found) + 1))
    assert all(re.fullmatch(r"[0-9a-f]{64}", m.checksum) for m in found)
    assert len(found) >= sql.DEV_MINIMUM
    assert found[0].name == "pgmq_core"


def test_a_new_install_runs_a_concerns_structure_before_its_functions() -> None:
    names = [f.name for f in sql.new_install()]
    assert sorted(names) == sorted(f.name for f in (*sql.structure(), *sql.functions()))
    assert names[0] == "structure/10_queues.sql"
    order = [names.index(n) for n in ("functions/10_queues.sql", "structure/20_policies.sql")]
    assert order == sorted(order)
    # pgmq.topic_bindings checks its patterns with functions of 71_topic_patterns.sql.
    assert names.index("functions/71_topic_patterns.sql") < names.index("structure/72_topics.sql")
    assert sql.current_version() == sql.known_versions()[-1]


def test_the_package_is_at_least_the_release_of_the_schema_it_installs() -> None:
    """`pgbroker --version` names a release; the schema it installs is that release's or an
    older one's, never a later one (0.1.0 installed the schema of 0.2.0)."""
    assert sql.version_key(__version__) >= sql.version_key(sql.current_version())
    assert version("pgbroker") == __version__
