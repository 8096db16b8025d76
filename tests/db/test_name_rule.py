"""One rule for queue names: the Python check (pgbroker._db.names), which the clients, the CLI and
the HTTP API run before any query, and the engine's (pgbroker._check_name and
_check_name_characters) give the same verdict on every name."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgbroker._db.names import UNPRINTABLE, check_queue_name
from pgbroker.errors import InvalidQueueName, from_postgres

Conn = psycopg.Connection[Any]

FUNCTIONS = Path(__file__).resolve().parents[2] / "src" / "pgbroker" / "_sql" / "functions" / "10_queues.sql"

CORPUS = [
    "orders",
    "EU-orders_2",
    "x" * 47,
    "x" * 48,
    "é" * 23,
    "é" * 24,
    "",
    "a b",
    " leading",
    "trailing ",
    "tab\there",
    "new\nline",
    "soh\x01",
    "del\x7f",
    "c1\x85",
    "nbsp\u00a0",
    "line\u2028sep",
    "ideographic\u3000space",
    "zero\u200bwidth",
    "bom\ufeff",
    "ogham\u1680",
    "a$b",
    "a--b",
    "a;b",
    "a'b",
]


def python_verdict(name: str) -> str:
    try:
        check_queue_name(name)
    except InvalidQueueName:
        return "PB001"
    return "created"


def engine_verdict(conn: Conn, name: str) -> str:
    try:
        with conn.transaction(force_rollback=True):
            conn.execute("SELECT pgmq.create(%s)", (name,))
    except psycopg.Error as exc:
        error = from_postgres(exc)
        return "PB001" if isinstance(error, InvalidQueueName) else f"{type(error).__name__}: {error}"
    return "created"


def test_the_client_and_the_engine_refuse_the_same_names(conn: Conn) -> None:
    verdicts = {name: (python_verdict(name), engine_verdict(conn, name)) for name in CORPUS}
    assert {name: both for name, both in verdicts.items() if both[0] != both[1]} == {}
    # The corpus is not vacuous: both sides refuse and accept some.
    assert {both[0] for both in verdicts.values()} == {"PB001", "created"}


def test_the_character_class_is_written_once_in_each_language() -> None:
    """The engine's class is the Python constant's text, so neither can drift alone."""
    match = re.search(r"IF name ~ '(\[[^']*\])' THEN", FUNCTIONS.read_text())
    assert match is not None, "pgbroker._check_name_characters no longer tests a class literal"
    assert match[1] == UNPRINTABLE


@pytest.mark.parametrize("name", ["zero\u200bwidth", "bom\ufeff", "c1\x85", "nbsp\u00a0"])
def test_invisible_characters_are_refused_by_the_client_before_any_query(name: str) -> None:
    with pytest.raises(InvalidQueueName):
        check_queue_name(name)
