"""LOGIN users in the least-privilege roles of ``pgbroker install --roles``, made the way an
operator makes them, for tests that run pgbroker under one role (tests/engine/test_roles.py,
tests/bridge/test_bridge_roles.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgbroker.cli.main import main as cli_main

KINDS = ("producer", "consumer", "monitor")


@contextmanager
def role_logins(dsn: str, conn: psycopg.Connection[Any], pg_admin_dsn: str) -> Iterator[dict[str, str]]:
    """A DSN per role kind, for a LOGIN user that is a member of that role (and nothing else).

    Roles belong to the whole server: the prefix is unique, and the roles are dropped at the end.
    """
    prefix = f"t{uuid.uuid4().hex[:10]}"
    assert cli_main(["--dsn", dsn, "install", "--roles", "--role-prefix", prefix]) == 0
    dsns = {}
    for kind in KINDS:
        user = f"{prefix}_{kind}_user"
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                sql.Identifier(user), sql.Identifier(f"{prefix}_{kind}")
            )
        )
        dsns[kind] = make_conninfo(dsn, user=user)
    try:
        yield dsns
    finally:
        roles = [sql.Identifier(f"{prefix}_{kind}{suffix}") for kind in KINDS for suffix in ("_user", "")]
        # Their grants live in this database: taken back here before the roles can go.
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.SQL(", ").join(roles)))
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.SQL(", ").join(roles)))
