"""The SQL that defines pgbroker: the engine's schema, its migrations, and the client's named queries.

schema/*.sql is the engine as it is now, by concern; a new database is installed from it.
migrations/*.sql are the deltas that bring a database installed by an earlier version up to
date. tests/integration/test_migrations.py proves that both give the same catalog.

Queue semantics live only in these files. Python loads them as LiteralString,
so the types say that no query text is ever built from values
(mypy reads LiteralString as str; pyright checks it).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import LiteralString

_MIGRATION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# The two-digit prefix is the load order: a file may use what earlier ones define.
_SCHEMA_FILE = re.compile(r"^\d{2}_[a-z0-9_]+\.sql$")
_QUERY_HEADER = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: LiteralString

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@cache
def migrations() -> tuple[Migration, ...]:
    """Every migration shipped with this package, in version order."""
    found = []
    for entry in resources.files(__package__).joinpath("migrations").iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match:
            sql: LiteralString = entry.read_text(encoding="utf-8")
            found.append(Migration(int(match[1]), match[2], sql))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration versions must run 1..n without gaps, found {versions}")
    return tuple(found)


@dataclass(frozen=True)
class SchemaFile:
    name: str
    sql: LiteralString


@cache
def schema() -> tuple[SchemaFile, ...]:
    """The engine's current definition, the files of schema/ in load order."""
    found = []
    for entry in resources.files(__package__).joinpath("schema").iterdir():
        if _SCHEMA_FILE.match(entry.name):
            sql: LiteralString = entry.read_text(encoding="utf-8")
            found.append(SchemaFile(entry.name, sql))
    if not found:
        raise RuntimeError("no schema files found: the package was installed without sql/schema/*.sql")
    return tuple(sorted(found, key=lambda f: f.name))


@cache
def queries(file: str = "queries.sql") -> dict[str, LiteralString]:
    """The named queries of queries.sql (or of another file of them, such as streams.sql):
    ``-- name: x`` blocks, keyed by name."""
    text = resources.files(__package__).joinpath(file).read_text(encoding="utf-8")
    parts = _QUERY_HEADER.split(text)
    named: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.strip().splitlines() if not line.lstrip().startswith("--")]
        named[name] = "\n".join(lines).strip()
    return named
