"""The committed views of the engine (docs/reference/schema.sql and route-example.sql) are what a
new database holds: a change to the engine shows in review as a diff of them."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import psycopg
import pytest
from scripts.dump_schema import REFRESH, ROUTE_EXAMPLE, SCHEMA_DUMP, route_example, schema_dump, server_major


def assert_fresh(path: Path, generated: str, dsn: str) -> None:
    committed = path.read_text(encoding="utf-8")
    major = re.search(r"on PostgreSQL (\d+)", committed)
    assert major, f"{path} does not say which PostgreSQL it came from: run {REFRESH}"
    with psycopg.connect(dsn) as conn:
        if server_major(conn) != int(major[1]):
            pytest.skip(
                f"{path.name} comes from PostgreSQL {major[1]}: pg_dump's output differs between majors"
            )
    diff = difflib.unified_diff(
        committed.splitlines(), generated.splitlines(), "committed", "generated", lineterm=""
    )
    stale = "\n".join(list(diff)[:60])
    assert not stale, f"{path.relative_to(path.parents[2])} is stale: run {REFRESH}\n{stale}"


def test_the_committed_schema_dump_is_what_a_new_database_holds(dsn: str) -> None:
    assert_fresh(SCHEMA_DUMP, schema_dump(dsn), dsn)


def test_the_committed_route_example_is_what_the_route_writer_writes(dsn: str) -> None:
    assert_fresh(ROUTE_EXAMPLE, route_example(dsn), dsn)
