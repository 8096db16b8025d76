"""Development databases: what pgbroker's installer made before the engine was written once.

Up to commit 0f64afe a database was installed and upgraded by numbered migrations, recorded in
pgbroker.schema_migrations; such a database at version 24 maps onto the 0.1.0 baseline. The
migrations are kept as test data (tests/data/dev_migrations/) so that the tests can still make one,
the way that installer did: each migration in one transaction with its row, then grant_roles for
every role prefix.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import cast

from pgbroker._sql import DEV_MINIMUM
from tests.support.tables import Conn

DEV_MIGRATIONS = Path(__file__).parents[1] / "data" / "dev_migrations"

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
class DevMigration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


@cache
def dev_migrations() -> tuple[DevMigration, ...]:
    found = []
    for path in DEV_MIGRATIONS.glob("*.sql"):
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", path.name)
        assert match, path
        found.append(DevMigration(int(match[1]), match[2], path.read_text(encoding="utf-8")))
    return tuple(sorted(found, key=lambda m: m.version))


def dev_version(conn: Conn) -> int:
    if conn.execute("SELECT to_regclass('pgbroker.schema_migrations')").fetchone() == (None,):
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM pgbroker.schema_migrations").fetchone()
    return int(cast(tuple[int], row)[0])


def install_dev(conn: Conn, up_to: int = DEV_MINIMUM) -> None:
    """Install or upgrade a development database to migration ``up_to``, as pgbroker did then."""
    current = dev_version(conn)
    with conn.transaction():
        conn.execute(_BOOTSTRAP)
        for migration in dev_migrations():
            if current < migration.version <= up_to:
                conn.execute(migration.text)  # no params: '%' is literal
                conn.execute(
                    "INSERT INTO pgbroker.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (migration.version, migration.name, migration.checksum),
                )
        if conn.execute("SELECT to_regclass('pgbroker.role_sets') IS NOT NULL").fetchone() == (True,):
            conn.execute("SELECT pgbroker.grant_roles(prefix) FROM pgbroker.role_sets ORDER BY prefix")
