"""Installs and upgrades the pgbroker schema in a database.

All pending migrations run in one transaction under an advisory lock, so
concurrent installs serialise and a failed upgrade leaves the database as it
was. The applied versions are recorded in pgbroker.schema_migrations; a
database newer than this package is refused rather than downgraded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from pgbroker import sql
from pgbroker.errors import InstallError, from_postgres

# Any constant will do; it only has to be the same for every installer.
_INSTALL_LOCK = 0x70676272_6F6B6572 & 0x7FFFFFFFFFFFFFFF

_BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS pgbroker;
CREATE TABLE IF NOT EXISTS pgbroker.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""


@dataclass(frozen=True)
class InstallResult:
    previous_version: int
    version: int

    @property
    def changed(self) -> bool:
        return self.version != self.previous_version


def latest_version() -> int:
    return sql.migrations()[-1].version


def installed_version(conn: psycopg.Connection[Any]) -> int:
    """The schema version in this database; 0 when pgbroker is not installed."""
    row = conn.execute("SELECT to_regclass('pgbroker.schema_migrations') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM pgbroker.schema_migrations").fetchone()
    return int(row[0]) if row else 0


def install(conn: psycopg.Connection[Any], *, target: int | None = None) -> InstallResult:
    """Apply every migration up to ``target`` (default: the latest) that is not applied yet."""
    known = sql.migrations()
    target = latest_version() if target is None else target
    if not 0 < target <= latest_version():
        raise InstallError(f"no migration {target}: this pgbroker knows versions 1 to {latest_version()}")
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_INSTALL_LOCK,))
            _refuse_foreign_pgmq(conn)
            current = installed_version(conn)
            if current > latest_version():
                raise InstallError(
                    f"the database has pgbroker schema version {current}, newer than this "
                    f"package's {latest_version()}; refusing to downgrade",
                    hint="Upgrade the pgbroker package instead.",
                )
            conn.execute(_BOOTSTRAP)
            for migration in known:
                if current < migration.version <= target:
                    conn.execute(migration.sql)
                    conn.execute(
                        "INSERT INTO pgbroker.schema_migrations (version, name, checksum)"
                        " VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
            return InstallResult(current, max(current, target))
    except psycopg.Error as exc:
        raise from_postgres(exc) from exc


def _refuse_foreign_pgmq(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute(
        """
        SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pgmq'),
               to_regnamespace('pgmq') IS NOT NULL,
               to_regclass('pgbroker.schema_migrations') IS NOT NULL
        """
    ).fetchone()
    assert row is not None
    has_extension, has_schema, has_pgbroker = row
    if has_extension:
        raise InstallError(
            "the pgmq extension is installed in this database; pgbroker provides the same "
            "SQL API and cannot be installed beside it",
            hint="Use a database without the extension, or DROP EXTENSION pgmq (this drops its queues).",
        )
    if has_schema and not has_pgbroker:
        raise InstallError(
            'schema "pgmq" already exists but was not created by pgbroker (perhaps pgmq\'s own SQL)',
            hint="Use another database, or drop schema pgmq after moving its queues.",
        )
