"""The SQL that defines pgbroker: the engine, its upgrades, and every statement Python runs, named.

The engine is written once, PgQ's way (structure/10_queues.sql's header has the layout):

- ``structure/NN_<concern>.sql``: schemas, tables, types, indexes and seed rows, run once, when
  pgbroker is installed into a new database;
- ``functions/NN_<concern>.sql``: every function, view and trigger, ``CREATE OR REPLACE``, run at
  that install and again by any install or upgrade that finds them changed;
- ``upgrades/<from>-to-<to>.sql``: what a release changes in tables and types, plus a DROP for
  each function it removes or re-signatures (CREATE OR REPLACE cannot change a function's
  arguments or result type); named by the releases it goes between, from the 0.1.0 baseline on;
- ``upgrades/dev-to-0.1.0.sql``: how a development database, installed before this layout by
  numbered migrations, maps onto the baseline (its header lists the history it accepts).
- ``queries/<caller>.sql``: every other statement Python runs, as ``-- name: x`` blocks, each
  with a one-line ``-- description`` under its name (queues.sql, streams.sql for the clients;
  spark*.sql, http.sql, keys.sql, install.sql, listen.sql, demo.sql). Placeholders in braces are
  composed in Python with psycopg's ``sql.SQL(text).format(...)``; only tests, bench and the
  installer's bootstrap write SQL inline.

Recipes:

- Change what a function does: edit its functions/ file. Nothing else.
- Add, re-signature or remove a function: edit its functions/ file; for a removal or a new
  signature, also DROP the old one in the next release's upgrade.
- Change a table or type: edit its structure/ file (what a new database gets) and make the same
  change in ``upgrades/<released>-to-<next>.sql`` (what an existing one gets), creating that file
  for the first change after a release. tests/engine/test_migrations.py proves that the two
  give the same catalog.
- Fold in a numbered development migration (0027, ... written before this layout): its
  table and type changes go into structure/ and into dev-to-0.1.0.sql (there, written to run
  also on a database that already has them, since development databases stand at 24 or later);
  its function changes are just the functions/ files, each function's new definition replacing
  the old, and a function it drops or re-signatures gets a DROP FUNCTION IF EXISTS in
  dev-to-0.1.0.sql; its line goes into the history in dev-to-0.1.0.sql's header and its file into
  tests/data/dev_migrations/.
- After any change: ``make schema-dump`` refreshes docs/reference/schema.sql and
  route-example.sql, which a test keeps fresh.

Queue semantics live only in these files. Python loads them as LiteralString, so the types say
that no query text is ever built from values (mypy reads LiteralString as str; pyright checks it).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import LiteralString

# The release the layout starts from: a new database, or a development one, is installed at it.
BASELINE = "0.1.0"

# The two-digit prefix is the load order: a file may use what earlier ones define.
_ENGINE_FILE = re.compile(r"^(\d{2})_[a-z0-9_]+\.sql$")
_UPGRADE_FILE = re.compile(r"^(\d+\.\d+\.\d+)-to-(\d+\.\d+\.\d+)\.sql$")
_DEV_UPGRADE = "dev-to-0.1.0.sql"
_QUERY_HEADER = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)


def _checksum(*texts: str) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class SqlFile:
    name: str  # relative to sql/, such as "functions/10_queues.sql"
    sql: LiteralString

    @property
    def checksum(self) -> str:
        return _checksum(self.sql)


def _engine_files(folder: str) -> tuple[SqlFile, ...]:
    found = []
    for entry in resources.files(__package__).joinpath(folder).iterdir():
        if _ENGINE_FILE.match(entry.name):
            sql: LiteralString = entry.read_text(encoding="utf-8")
            found.append(SqlFile(f"{folder}/{entry.name}", sql))
    if not found:
        raise RuntimeError(f"no SQL files found: the package was installed without sql/{folder}/*.sql")
    return tuple(sorted(found, key=lambda f: f.name))


@cache
def structure() -> tuple[SqlFile, ...]:
    """The engine's tables, types and other DDL, the files of structure/ in load order."""
    return _engine_files("structure")


@cache
def functions() -> tuple[SqlFile, ...]:
    """The engine's functions, views and triggers, the files of functions/ in load order."""
    return _engine_files("functions")


def new_install() -> tuple[SqlFile, ...]:
    """What a new database runs: both kinds of file by prefix, a concern's structure first."""

    def load_order(f: SqlFile) -> tuple[str, bool]:
        folder, name = f.name.split("/")
        return name, folder == "functions"

    return tuple(sorted((*structure(), *functions()), key=load_order))


def functions_checksum() -> str:
    """Identifies the function files as a whole: a database that recorded another value runs them
    again."""
    return _checksum(*(f.name + "\n" + f.sql for f in functions()))


def structure_checksum() -> str:
    """Identifies the structure files as a whole: what the current version's tables are."""
    return _checksum(*(f.name + "\n" + f.sql for f in structure()))


# The structure checksum every database at BASELINE records. None while no upgrade exists, since
# structure/ is then the baseline itself; whoever writes the first upgrade sets it to the value
# structure_checksum() had before (it is in every 0.1.0 database), as structure/ then moves on.
_BASELINE_CHECKSUM: str | None = "c973d609950d0485bb4b8b0666cce3ee618c31f88d3364de48bf258db8f445b1"


def baseline_checksum() -> str:
    return _BASELINE_CHECKSUM or structure_checksum()


def version_key(version: str) -> tuple[int, ...]:
    """A release's sort key: "0.10.0" comes after "0.9.0"."""
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class Upgrade:
    from_version: str
    to_version: str
    file: SqlFile

    @property
    def name(self) -> str:
        return f"{self.from_version}-to-{self.to_version}"


def _upgrade_file(name: str) -> SqlFile:
    sql: LiteralString = resources.files(__package__).joinpath("upgrades", name).read_text(encoding="utf-8")
    return SqlFile(f"upgrades/{name}", sql)


@cache
def upgrades() -> tuple[Upgrade, ...]:
    """The release upgrades, a chain from BASELINE to the current version."""
    by_start: dict[str, Upgrade] = {}
    for entry in resources.files(__package__).joinpath("upgrades").iterdir():
        match = _UPGRADE_FILE.match(entry.name)
        if match:
            by_start[match[1]] = Upgrade(match[1], match[2], _upgrade_file(entry.name))
    chain, version = [], BASELINE
    while version in by_start:
        step = by_start.pop(version)
        if version_key(step.to_version) <= version_key(version):
            raise RuntimeError(f"upgrade {step.name} does not go forward")
        chain.append(step)
        version = step.to_version
    if by_start:
        raise RuntimeError(f"upgrades not on the chain from {BASELINE}: {sorted(by_start)}")
    if chain and _BASELINE_CHECKSUM is None:
        raise RuntimeError("an upgrade exists: pin the baseline's structure checksum in _BASELINE_CHECKSUM")
    return tuple(chain)


def current_version() -> str:
    """The schema version this package installs."""
    chain = upgrades()
    return chain[-1].to_version if chain else BASELINE


def known_versions() -> tuple[str, ...]:
    return (BASELINE, *(u.to_version for u in upgrades()))


@dataclass(frozen=True)
class DevMigration:
    version: int
    name: str
    checksum: str


_DEV_HISTORY_LINE = re.compile(r"^-- history: (\d{4}) ([a-z0-9_]+) ([0-9a-f]{64})$", re.MULTILINE)


@cache
def dev_history() -> tuple[DevMigration, ...]:
    """The numbered migrations a development database may have applied, as the header of
    dev-to-0.1.0.sql lists them."""
    rows = _DEV_HISTORY_LINE.findall(dev_upgrade().sql)
    return tuple(DevMigration(int(version), name, checksum) for version, name, checksum in rows)


# The last of the numbered migrations before the baseline that every development database has.
DEV_MINIMUM = 24


def dev_upgrade() -> SqlFile:
    """The upgrade of a development database to BASELINE."""
    return _upgrade_file(_DEV_UPGRADE)


@dataclass(frozen=True)
class NamedQuery:
    name: str
    description: str  # the comment line under its name
    sql: LiteralString


def parse_queries(text: LiteralString, file: str) -> tuple[NamedQuery, ...]:
    """The ``-- name: x`` blocks of a file of named queries, each opening with a one-line
    ``-- description``; comment lines are not part of a query's text."""
    parts = _QUERY_HEADER.split(text)
    found = []
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = body.strip().splitlines()
        if not lines or not lines[0].startswith("-- "):
            raise RuntimeError(f"{file}: query {name} lacks its one-line description")
        statement = [line for line in lines if not line.lstrip().startswith("--")]
        found.append(NamedQuery(name, lines[0][3:].strip(), "\n".join(statement).strip()))
    return tuple(found)


def query_files() -> tuple[str, ...]:
    """The callers that have a file of named queries: queries/<caller>.sql."""
    folder = resources.files(__package__).joinpath("queries")
    return tuple(
        sorted(entry.name.removesuffix(".sql") for entry in folder.iterdir() if entry.name.endswith(".sql"))
    )


@cache
def queries(caller: str) -> dict[str, LiteralString]:
    """The named queries of queries/<caller>.sql, keyed by name: every statement Python runs
    outside the installer's bootstrap."""
    file = f"queries/{caller}.sql"
    entry = resources.files(__package__).joinpath("queries", f"{caller}.sql")
    text: LiteralString = entry.read_text(encoding="utf-8")
    named: dict[str, LiteralString] = {}
    for query in parse_queries(text, file):
        if query.name in named:
            raise RuntimeError(f"{file}: query {query.name} is defined twice")
        named[query.name] = query.sql
    return named
