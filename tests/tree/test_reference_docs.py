"""The generated references (scripts/gen_reference.py): every public SQL function carries its
structured header (CONTRIBUTING.md), and the committed python.md and cli.md are what the code
declares. tests/engine/test_sql_reference.py keeps sql.md fresh."""

from __future__ import annotations

from pathlib import Path

import pytest
from scripts.gen_reference import CLI_MD, PYTHON_MD
from scripts.reference import staleness
from scripts.reference.cli_reference import cli_reference
from scripts.reference.python_reference import python_reference
from scripts.reference.sql_headers import functions_in, public_functions


def test_every_public_sql_function_has_a_structured_header() -> None:
    functions = public_functions()
    assert {"pgmq.send", "pgmq.create", "pgbroker.ack", "pgbroker.stream_send"} <= {
        f.qualified for f in functions
    }
    lacking = [f"{f.qualified} ({f.file})" for f in functions if not (f.header and f.header.structured)]
    assert lacking == [], (
        "public SQL functions without a header (a summary, then Arguments:/Returns:/Errors: where"
        f" they apply, and Since:; CONTRIBUTING.md): {lacking}"
    )


def test_a_header_is_the_comment_just_above_and_overloads_share_it() -> None:
    sql = (
        "-- A section note, apart.\n\n"
        "-- Ack a delivery.\n-- Returns: whether it held;\n--   false once stale.\n-- Since: 0.1.0\n"
        "CREATE OR REPLACE FUNCTION pgbroker.ack(receipt text)\nRETURNS boolean AS $$ $$;\n"
        "CREATE OR REPLACE FUNCTION pgbroker.ack(receipts text[])\nRETURNS boolean AS $$ $$;\n"
        '-- Not structured: no Since.\nCREATE FUNCTION pgmq."create"(queue_name text)\n'
        "-- Not structured: Since is not a release.\n-- Since: soon\n"
        "CREATE FUNCTION pgmq.drop_queue(queue_name text)\n"
    )
    ack, create, drop = functions_in("functions/60_acks.sql", sql)
    assert ack.qualified == "pgbroker.ack"
    assert ack.header is not None
    assert ack.header.structured
    assert ack.header.description == "Ack a delivery."
    assert ack.header.text("Returns") == "whether it held; false once stale."
    assert create.qualified == "pgmq.create"
    assert create.header is not None
    assert not create.header.structured
    assert drop.header is not None
    assert not drop.header.structured


@pytest.mark.parametrize(("path", "generate"), [(PYTHON_MD, python_reference), (CLI_MD, cli_reference)])
def test_the_committed_reference_is_what_the_code_declares(path: Path, generate: object) -> None:
    assert callable(generate)
    stale = staleness(path, generate())
    assert not stale, stale
