"""Fixtures of the partitioned-queue tests: pg_partman on the test server, created in the test's
database (the suite's Postgres fixtures are in tests/plugins/postgres.py)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

from tests.support.tables import PARTMAN_SCHEMA, Conn


@pytest.fixture(scope="session")
def partman_on_server(pg_admin_dsn: str) -> None:
    """Skip unless the test server can CREATE EXTENSION pg_partman."""
    with psycopg.connect(pg_admin_dsn, autocommit=True) as c:
        row = c.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_partman'), "
            "current_setting('server_version_num')::int / 10000"
        ).fetchone()
    assert row is not None
    available, major = row
    if not available:
        pytest.skip(
            "pg_partman is not installed on the test server: install it (Debian/Ubuntu, as root: "
            f"`apt-get install postgresql-{major}-partman`, or `make pg-partman`), or point "
            "PGBROKER_TEST_DSN at a server that has it"
        )


@pytest.fixture
def pconn(conn: Conn, partman_on_server: None) -> Conn:
    """The test database's connection, with pg_partman created in schema partman."""
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(PARTMAN_SCHEMA)))
    conn.execute(sql.SQL("CREATE EXTENSION pg_partman SCHEMA {}").format(sql.Identifier(PARTMAN_SCHEMA)))
    return conn
