"""docs/reference/sql.md is what the engine's function headers and a new database's catalog say."""

from __future__ import annotations

from scripts.gen_reference import SQL_MD
from scripts.reference import staleness
from scripts.reference.sql_reference import sql_reference


def test_the_committed_sql_reference_is_what_a_new_database_holds(dsn: str) -> None:
    stale = staleness(SQL_MD, sql_reference(dsn))
    assert not stale, stale
