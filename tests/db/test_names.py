"""One rule for queue and stream names: the Python check (pgbroker._db.names), which the clients,
the CLI and the HTTP API run before any query, and the engine's (pgbroker._check_name and
_check_name_characters) give the same verdict on every name."""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgbroker._db.names import UNPRINTABLE, check_queue_name, check_stream_name
from pgbroker.errors import InvalidArgument, InvalidQueueName, from_postgres
from pgbroker.queues._queries import queue_create
from pgbroker.streams._queries import stream_drop

Conn = psycopg.Connection[Any]

FUNCTIONS = Path(__file__).resolve().parents[2] / "src" / "pgbroker" / "_sql" / "functions" / "10_queues.sql"

REFUSED = [
    "",
    " ",
    "a b",
    " leading",
    "trailing ",
    "tab\there",
    "new\nline",
    "nul\x00",
    "soh\x01",
    "del\x7f",
    "c1\x85",
    "nbsp\u00a0",
    "line\u2028sep",
    "ideographic\u3000space",
    "ogham\u1680",
    "zero\u200bwidth",
    "bom\ufeff",
    "x" * 48,
    "é" * 24,  # 24 characters, 48 bytes
    "a$b",
    "a;b",
    "a--b",
    "a'b",
]
ACCEPTED = ["a", "orders", "EU-orders_2", "-x-", "é" * 23, "x" * 47, "joiner\u200dinside"]


def test_the_character_class_is_whitespace_and_controls() -> None:
    """UNPRINTABLE, written so that Postgres reads it the same, is exactly what Python calls
    whitespace or a control character, and the two invisible spaces (zero-width space, BOM)."""
    pattern = re.compile(UNPRINTABLE)
    invisible = {"\u200b", "\ufeff"}
    meant = {
        c
        for c in map(chr, range(sys.maxunicode + 1))
        if c.isspace() or unicodedata.category(c) == "Cc" or c in invisible
    }
    matched = {c for c in map(chr, range(sys.maxunicode + 1)) if pattern.fullmatch(c)}
    assert matched == meant


def test_the_character_class_is_written_once_in_each_language() -> None:
    """The engine's class is the Python constant's text, so neither can drift alone."""
    match = re.search(r"IF name ~ '(\[[^']*\])' THEN", FUNCTIONS.read_text())
    assert match is not None, "pgbroker._check_name_characters no longer tests a class literal"
    assert match[1] == UNPRINTABLE


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
    # A NUL cannot reach the engine at all: a text value cannot hold one.
    corpus = [name for name in REFUSED + ACCEPTED if "\x00" not in name]
    verdicts = {name: (python_verdict(name), engine_verdict(conn, name)) for name in corpus}
    assert {name: both for name, both in verdicts.items() if both[0] != both[1]} == {}
    assert {name for name, both in verdicts.items() if both[0] == "created"} == set(ACCEPTED)


@pytest.mark.parametrize("name", REFUSED)
def test_bad_queue_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidQueueName):
        check_queue_name(name)
    with pytest.raises(InvalidQueueName):
        queue_create(name)  # every query judges its names before it is sent


@pytest.mark.parametrize("name", ACCEPTED)
def test_good_queue_names_pass(name: str) -> None:
    assert check_queue_name(name) == name


@pytest.mark.parametrize("name", ["", "a b", "tab\t", "x\x01", "nbsp\u00a0"])
def test_stream_names_follow_the_character_rule(name: str) -> None:
    with pytest.raises(InvalidQueueName):
        check_stream_name(name)
    with pytest.raises(InvalidQueueName):
        stream_drop(name)


@pytest.mark.parametrize("name", [123, None, b"orders", ["orders"]])
def test_a_name_that_is_not_a_string_names_the_argument(name: object) -> None:
    with pytest.raises(InvalidArgument, match="queue name must be a string"):
        check_queue_name(name)
    with pytest.raises(InvalidArgument, match="stream name must be a string"):
        check_stream_name(name)
