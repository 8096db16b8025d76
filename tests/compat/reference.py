"""The reference pgmq 1.13 SQL, installed from the official client's wheel into its own database.

The ``pgmq`` wheel on PyPI carries the reference implementation as ``pgmq/sql/pgmq.sql``. The
differential tests install it into a *separate* database of the test server and run the same
calls there and against pgbroker: it is a baseline to compare behaviour with, never a source for
pgbroker (nothing here is copied into ``src/``).
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from pgmq.install import get_embedded_install_sql, get_embedded_sql_version
from psycopg import sql

from tests.support.postgres import dsn_for_db

#: The pgmq version the differential tests compare against. The contract is pgmq 1.13.1, but the
#: newest ``pgmq`` wheel (1.1.4) bundles 1.13.0's SQL, and no other registry reachable here ships
#: pgmq's SQL. 1.13.1 changes only the insert-notify trigger (mixed-case queues notify, on the
#: channel of the name as given): deliberate difference D10 records it against 1.13.0.
EXPECTED_VERSION = "1.13.0"

#: Databases made here start with this prefix, so a leaked one is easy to recognise.
DB_PREFIX = "pgmq_ref_"


def reference_version() -> str:
    """The pgmq version of the SQL bundled with the installed ``pgmq`` wheel."""
    return str(get_embedded_sql_version())


def reference_sql() -> str:
    """The reference install script (``pgmq/sql/pgmq.sql`` of the wheel)."""
    text: str = get_embedded_install_sql()
    return text


def install_reference(conn: psycopg.Connection[Any]) -> None:
    """Run the reference install script in one transaction on ``conn``'s database."""
    script = reference_sql()
    with conn.transaction():
        # A script of many statements and no parameters: sent with the simple query protocol.
        conn.execute(script.encode())


def create_reference_database(admin_dsn: str, template: str = "template0") -> str:
    """Create a database from ``template`` and return its name; with template0, install the SQL.

    Cloning a database that already has the reference installed (pass its name as ``template``)
    is how the tests get a fresh reference database in milliseconds.
    """
    name = clone_database(admin_dsn, template, DB_PREFIX)
    if template == "template0":
        try:
            with psycopg.connect(dsn_for_db(admin_dsn, name), autocommit=True) as conn:
                install_reference(conn)
        except BaseException:
            drop_database(admin_dsn, name)
            raise
    return name


def clone_database(admin_dsn: str, template: str, prefix: str) -> str:
    """A new database copied from ``template``, named ``prefix`` + a random suffix."""
    name = f"{prefix}{uuid.uuid4().hex[:16]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        )
    return name


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop a database made here, even with sessions left open."""
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
