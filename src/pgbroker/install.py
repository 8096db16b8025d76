"""Installs and upgrades the pgbroker schema in a database.

A database without pgbroker gets the engine's current definition (sql/schema/) and every
shipped migration recorded as applied; a database installed by an earlier version gets the
migrations it lacks (sql/migrations/), which bring it to the same catalog. Either runs in one
transaction under an advisory lock, so concurrent installs serialise and a failed upgrade
leaves the database as it was. The applied versions are recorded in
pgbroker.schema_migrations; a database newer than this package is refused rather than
downgraded.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString, TypeAlias, TypeVar

import psycopg

from pgbroker import sql
from pgbroker.errors import InstallError, from_postgres

R = TypeVar("R")

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


# One install written once as a generator of statements: it yields
# (sql, params) and is sent the rows back, so the sync and asyncio drivers
# below only execute, and the install logic exists in one place.
Statement: TypeAlias = tuple[LiteralString, tuple[Any, ...]]
Steps: TypeAlias = Generator[Statement, list[tuple[Any, ...]], R]


def _installed_version_steps() -> Steps[int]:
    rows = yield "SELECT to_regclass('pgbroker.schema_migrations') IS NOT NULL", ()
    if not rows[0][0]:
        return 0
    rows = yield "SELECT coalesce(max(version), 0) FROM pgbroker.schema_migrations", ()
    return int(rows[0][0])


def _install_steps(target: int | None) -> Steps[InstallResult]:
    target = latest_version() if target is None else target
    if not 0 < target <= latest_version():
        raise InstallError(f"no migration {target}: this pgbroker knows versions 1 to {latest_version()}")
    yield "SELECT pg_advisory_xact_lock(%s)", (_INSTALL_LOCK,)
    rows = yield _FOREIGN_PGMQ, ()
    _refuse_foreign_pgmq(*rows[0])
    current = yield from _installed_version_steps()
    if current > latest_version():
        raise InstallError(
            f"the database has pgbroker schema version {current}, newer than this "
            f"package's {latest_version()}; refusing to downgrade",
            hint="Upgrade the pgbroker package instead.",
        )
    if current:
        rows = yield "SELECT version, name, checksum FROM pgbroker.schema_migrations ORDER BY version", ()
        _refuse_foreign_history([(int(v), str(n), str(c)) for v, n, c in rows])
    yield _BOOTSTRAP, ()
    if current == 0 and target == latest_version():
        yield from _schema_steps()
    else:
        # Also below the latest version from scratch: only migrations can stop at an older one.
        yield from _migration_steps(current, target)
    # A migration may have redefined a role's entry point (back to SECURITY INVOKER, its grants
    # gone): roles made by install_roles are granted again.
    rows = yield "SELECT to_regclass('pgbroker.role_sets') IS NOT NULL", ()
    if rows[0][0]:
        yield "SELECT pgbroker.grant_roles(prefix) FROM pgbroker.role_sets ORDER BY prefix", ()
    # And so are the roles of queue grants (grant_queue_access).
    rows = yield "SELECT to_regclass('pgbroker.queue_grant') IS NOT NULL", ()
    if rows[0][0]:
        yield "SELECT pgbroker._sync_queue_grants()", ()
    return InstallResult(current, max(current, target))


def _schema_steps() -> Steps[None]:
    """Install the current schema, and record every migration as applied: it gives the catalog
    they give together, so a later upgrade starts from the last of them."""
    for schema_file in sql.schema():
        yield schema_file.sql, ()
    shipped = sql.migrations()
    yield (
        "INSERT INTO pgbroker.schema_migrations (version, name, checksum)"
        " SELECT * FROM unnest(%s::integer[], %s::text[], %s::text[])",
        ([m.version for m in shipped], [m.name for m in shipped], [m.checksum for m in shipped]),
    )


def _migration_steps(current: int, target: int) -> Steps[None]:
    for migration in sql.migrations():
        if current < migration.version <= target:
            yield migration.sql, ()
            yield (
                "INSERT INTO pgbroker.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )


def _refuse_foreign_history(applied: list[tuple[int, str, str]]) -> None:
    """Refuse a database whose applied migrations are not this package's: upgrading it would run
    the next migrations on a schema they were not written for (a build from another branch, or
    an unreleased one)."""
    shipped = {m.version: m for m in sql.migrations()}
    for version, name, checksum in applied:
        mine = shipped.get(version)
        if mine is not None and (mine.name, mine.checksum) != (name, checksum):
            raise InstallError(
                f"the database's schema migration {version} is {name!r} (checksum {checksum[:12]}), "
                f"but this pgbroker's migration {version} is {mine.name!r} (checksum "
                f"{mine.checksum[:12]}): the schema was installed by another build of pgbroker",
                hint="Install into a new database, or drop schemas pgmq and pgbroker (losing their "
                "queues) and install again; for the embedded cluster: pgbroker db stop, then remove "
                "its data directory.",
            )


def _drive(conn: psycopg.Connection[Any], steps: Steps[R]) -> R:
    try:
        statement = next(steps)
        while True:
            query, params = statement
            cursor = conn.execute(query, params or None)  # no params: '%' is literal
            statement = steps.send(cursor.fetchall() if cursor.description else [])
    except StopIteration as done:
        result: R = done.value
        return result
    except psycopg.Error as exc:
        raise from_postgres(exc) from exc


async def _drive_async(conn: psycopg.AsyncConnection[Any], steps: Steps[R]) -> R:
    try:
        statement = next(steps)
        while True:
            query, params = statement
            cursor = await conn.execute(query, params or None)
            statement = steps.send(await cursor.fetchall() if cursor.description else [])
    except StopIteration as done:
        result: R = done.value
        return result
    except psycopg.Error as exc:
        raise from_postgres(exc) from exc


def installed_version(conn: psycopg.Connection[Any]) -> int:
    """The schema version in this database; 0 when pgbroker is not installed."""
    return _drive(conn, _installed_version_steps())


def install(conn: psycopg.Connection[Any], *, target: int | None = None) -> InstallResult:
    """Install the schema at version ``target`` (default: the latest): a new database from the
    current schema (or, for an older ``target``, its migrations), an older one by applying the
    migrations it has not applied yet."""
    with conn.transaction():
        return _drive(conn, _install_steps(target))


def install_roles(conn: psycopg.Connection[Any], prefix: str = "pgbroker") -> dict[str, int]:
    """Create (or bring up to date) the NOLOGIN roles <prefix>_producer, _consumer and _monitor
    with exactly their grants; returns the number of functions granted to each role. Needs an
    installed schema and the right to create roles."""
    try:
        with conn.transaction():
            rows = conn.execute(
                "SELECT role_name, functions FROM pgbroker.grant_roles(%s)", (prefix,)
            ).fetchall()
    except psycopg.errors.InsufficientPrivilege as exc:
        # A managed service's application role may lack CREATEROLE: say which right is missing.
        raise InstallError(
            f"cannot create the roles {prefix}_producer, _consumer and _monitor: "
            f"{(exc.diag.message_primary or str(exc)).strip()}",
            hint="Run `pgbroker install --roles` as a role with CREATEROLE (on a managed service, "
            "its admin role), or create the three roles beforehand and run it again.",
        ) from exc
    except psycopg.Error as exc:
        raise from_postgres(exc) from exc
    return {name: count for name, count in rows}


@dataclass(frozen=True)
class QueueGrant:
    """A role's grant of one kind (producer, consumer, monitor) on the queues matching a glob."""

    role_name: str
    role_kind: str
    pattern: str
    granted_at: datetime


def grant_queue_access(conn: psycopg.Connection[Any], kind: str, role: str, pattern: str) -> bool:
    """Let ``role`` (an existing role) act as ``kind`` on the queues whose names match ``pattern``,
    a glob (``*`` any characters, ``?`` one) compared case-insensitively, now and for queues made
    later; True if the grant is new. Needs the roles of install_roles; see sql/schema/15_scopes.sql."""
    return bool(_one(conn, "SELECT pgbroker.grant_queue_access(%s, %s, %s)", (kind, role, pattern)))


def revoke_queue_access(
    conn: psycopg.Connection[Any], kind: str, role: str, pattern: str | None = None
) -> int:
    """Take back ``role``'s grant of ``kind`` on ``pattern`` (all its grants of ``kind`` when None);
    returns how many grants went."""
    return int(_one(conn, "SELECT pgbroker.revoke_queue_access(%s, %s, %s)", (kind, role, pattern)))


def list_queue_grants(conn: psycopg.Connection[Any]) -> list[QueueGrant]:
    """Every queue grant, by role, kind and pattern."""
    try:
        rows = conn.execute(
            "SELECT role_name, role_kind, pattern, granted_at FROM pgbroker.list_queue_grants()"
        ).fetchall()
    except psycopg.Error as exc:
        raise from_postgres(exc) from exc
    return [QueueGrant(*row) for row in rows]


def _one(conn: psycopg.Connection[Any], query: LiteralString, params: tuple[Any, ...]) -> Any:
    try:
        with conn.transaction():
            row = conn.execute(query, params).fetchone()
    except psycopg.Error as exc:
        raise from_postgres(exc) from exc
    assert row is not None
    return row[0]


async def install_async(conn: psycopg.AsyncConnection[Any], *, target: int | None = None) -> InstallResult:
    """install() for an asyncio connection."""
    async with conn.transaction():
        return await _drive_async(conn, _install_steps(target))


_FOREIGN_PGMQ = """
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pgmq'),
       to_regnamespace('pgmq') IS NOT NULL,
       to_regclass('pgbroker.schema_migrations') IS NOT NULL
"""


def _refuse_foreign_pgmq(has_extension: bool, has_schema: bool, has_pgbroker: bool) -> None:
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
