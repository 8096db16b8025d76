"""What an install decides without I/O (pgbroker._db.install_async runs it): the result it
returns, the bootstrap statement, the statements it names, and the checks that refuse a database
it must not touch (newer than this package, installed by another build, beside pgmq's extension).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

from psycopg import sql as pgsql

from pgbroker import _sql as sql
from pgbroker.errors import InstallError

# Any constant will do; it only has to be the same for every installer.
INSTALL_LOCK = 0x70676272_6F6B6572 & 0x7FFFFFFFFFFFFFFF

BOOTSTRAP = """
CREATE SCHEMA IF NOT EXISTS pgbroker;
CREATE TABLE IF NOT EXISTS pgbroker.schema_version (
    version text PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS pgbroker.schema_functions (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""

# The bootstrap is the one statement not in _sql/queries/install.sql: it creates the tables the
# named statements read, before anything else.


def lock_pause(attempt: int) -> float:
    """Seconds between two attempts to lock the engine's tables for an upgrade (the install's
    _lock_tables): longer each time, half a second at most."""
    return min(0.05 * attempt, 0.5)


def lock_statement(tables: list[tuple[Any, ...]]) -> pgsql.Composed:
    """LOCK TABLE of install_lock_set's rows (schema, table), all in one statement."""
    names = pgsql.SQL(", ").join(pgsql.Identifier(str(schema), str(table)) for schema, table in tables)
    return pgsql.SQL(named("install_lock_tables")).format(tables=names)


def lock_refused(attempts: int, holders: list[tuple[Any, ...]]) -> InstallError:
    """The upgrade could not lock its tables in ``attempts`` tries: the sessions that hold them
    (install_lock_holders' rows: pid, state, application, seconds in their transaction), named so
    that the operator can end them."""
    held_by = "; ".join(
        f"pid {pid} ({state or 'state unknown'} for {age if age is not None else '?'} s"
        f"{f', application {application!r}' if application else ''})"
        for pid, state, application, age in holders
    )
    return InstallError(
        f"could not lock pgbroker's tables for the upgrade in {attempts} attempts (about a minute): "
        + (f"held by {held_by}" if holders else "a transaction kept using them"),
        hint="End those sessions (SELECT pg_terminate_backend(pid)) or let them finish: a client left "
        "idle in transaction after a read or set_vt holds them until it commits (pgbroker sessions "
        "lists them); then run pgbroker install again. Nothing was changed.",
    )


def lock_table_full(per_transaction: int, slots: int, locks: int) -> InstallError:
    """The server's lock table had no room for the upgrade's locks (out of shared memory): about
    how many it holds at once (``locks``, install_lock_capacity's estimate), and the
    max_locks_per_transaction that makes room for them beside what the server's sessions hold now
    (the table is shared: per_transaction x slots locks in all, and what shared memory is spare)."""
    needed = per_transaction + -(-locks // slots)
    return InstallError(
        f"the server's lock table is full: the upgrade holds about {locks} locks at once (its "
        f"functions and the engine's tables), and max_locks_per_transaction = {per_transaction} "
        f"(x {slots} connections and prepared transactions, shared by every session) left no room",
        hint=f"Set max_locks_per_transaction to at least {needed} (ALTER SYSTEM, then restart the "
        "server), or run pgbroker install again when fewer locks are held; nothing was changed.",
    )


def named(name: str) -> LiteralString:
    """The statement of that name in _sql/queries/install.sql."""
    return sql.queries("install")[name]


@dataclass(frozen=True)
class RoleCheck:
    """What an install into an existing database found of the roles of ``install --roles`` and set
    right, and what it could not: mostly after a restore from a dump (docs/operations.md, "Backup,
    restore and moving a database")."""

    regranted: tuple[str, ...] = ()  # role prefixes whose roles were granted their functions again
    missing: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (prefix, its roles that do not exist)
    public_revoked: int = 0  # SECURITY DEFINER functions that PUBLIC could call, and no longer can

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the operator must do: make the missing roles again."""
        return tuple(
            f"role set {prefix!r} is recorded in this database but its roles {', '.join(names)} do "
            "not exist on this server (roles belong to the server: a database dump does not hold "
            f"them); run `pgbroker install --roles --role-prefix {prefix}` as a role with CREATEROLE "
            "to make them again, then grant them to the login roles (and give queue grants again: "
            f"`pgbroker grant`); if they were dropped on purpose, delete the row {prefix!r} of "
            "pgbroker.role_sets"
            for prefix, names in self.missing
        )

    @property
    def repairs(self) -> tuple[str, ...]:
        """What the install set right."""
        done = [f"role set {prefix!r}: its roles lacked grants, granted again" for prefix in self.regranted]
        if self.public_revoked:
            done.append(
                f"took EXECUTE from PUBLIC on {self.public_revoked} SECURITY DEFINER functions "
                "(as after a restore without privileges)"
            )
        return tuple(done)


def role_check(rows: list[tuple[Any, ...]], public_revoked: int, *, routine: bool) -> RoleCheck:
    """The RoleCheck of pgbroker._check_role_sets' rows (prefix, missing_roles, regranted);
    ``routine``: the functions were re-applied, so granting the roles again is no repair."""
    return RoleCheck(
        regranted=() if routine else tuple(str(prefix) for prefix, _, regranted in rows if regranted),
        missing=tuple((str(prefix), tuple(missing)) for prefix, missing, _ in rows if missing),
        public_revoked=public_revoked,
    )


@dataclass(frozen=True)
class InstallResult:
    previous_version: str | None  # None: pgbroker was not installed; "0.1.0.devN": a development one
    version: str
    roles: RoleCheck = RoleCheck()

    @property
    def changed(self) -> bool:
        return self.version != self.previous_version


def latest_version() -> str:
    return sql.current_version()


@dataclass(frozen=True)
class Installed:
    """What the database records: release versions, or a development history, or neither."""

    releases: tuple[tuple[str, str, str], ...] = ()  # (version, name, checksum)
    dev: tuple[tuple[int, str, str], ...] = ()  # (version, name, checksum) of schema_migrations

    @property
    def version(self) -> str | None:
        if self.releases:
            return max((v for v, _, _ in self.releases), key=sql.version_key)
        if self.dev:
            return f"{sql.BASELINE}.dev{max(v for v, _, _ in self.dev)}"
        return None


def version_rows(versions: tuple[str, ...]) -> tuple[list[str], list[str], list[str]]:
    """The schema_version rows of these versions: what this package says each one is."""
    expected = _expected_versions()
    return (list(versions), [expected[v][0] for v in versions], [expected[v][1] for v in versions])


def _expected_versions() -> dict[str, tuple[str, str]]:
    """Each known version's (name, checksum): the baseline's structure, or the upgrade's file."""
    known = {sql.BASELINE: ("baseline", sql.baseline_checksum())}
    known.update({u.to_version: (u.name, u.file.checksum) for u in sql.upgrades()})
    return known


def _refuse_newer(version: str) -> None:
    raise InstallError(
        f"the database has pgbroker schema version {version}, newer than this "
        f"package's {sql.current_version()}; refusing to downgrade",
        hint="Upgrade the pgbroker package instead.",
    )


_ANOTHER_BUILD_HINT = (
    "Install into a new database, or drop schemas pgmq and pgbroker (losing their "
    "queues) and install again; for the embedded cluster: pgbroker db stop, then remove "
    "its data directory."
)


def refuse_release_history(recorded: tuple[tuple[str, str, str], ...]) -> None:
    """Refuse a database newer than this package, or whose recorded versions are not this
    package's: upgrading it would run the next upgrades on a schema they were not written for (a
    build from another branch, or an unreleased one)."""
    expected = _expected_versions()
    newest = max((v for v, _, _ in recorded), key=sql.version_key)
    if sql.version_key(newest) > sql.version_key(sql.current_version()):
        _refuse_newer(newest)
    for version, name, checksum in sorted(recorded, key=lambda r: sql.version_key(r[0])):
        mine = expected.get(version)
        if mine != (name, checksum):
            mine_text = f"{mine[0]!r} (checksum {mine[1][:12]})" if mine else "unknown"
            raise InstallError(
                f"the database's schema version {version} is {name!r} (checksum {checksum[:12]}), "
                f"but this pgbroker's version {version} is {mine_text}: the schema was installed "
                "by another build of pgbroker",
                hint=_ANOTHER_BUILD_HINT,
            )


def refuse_dev_history(applied: tuple[tuple[int, str, str], ...]) -> None:
    """Refuse a development database that does not map onto the baseline: newer than any this
    package knows, older than the last migration the baseline squashes, or from another build."""
    known = {m.version: (m.name, m.checksum) for m in sql.dev_history()}
    latest = max(v for v, _, _ in applied)
    if latest > max(known):
        _refuse_newer(f"{sql.BASELINE}.dev{latest}")
    for version, name, checksum in applied:
        mine = known.get(version)
        if mine is not None and mine != (name, checksum):
            raise InstallError(
                f"the database's schema migration {version} is {name!r} (checksum {checksum[:12]}), "
                f"but this pgbroker's migration {version} is {mine[0]!r} (checksum "
                f"{mine[1][:12]}): the schema was installed by another build of pgbroker",
                hint=_ANOTHER_BUILD_HINT,
            )
    if latest < sql.DEV_MINIMUM:
        raise InstallError(
            f"the database has development schema version {latest}, older than the "
            f"{sql.DEV_MINIMUM} that the {sql.BASELINE} baseline starts from",
            hint=f"Upgrade it to {sql.DEV_MINIMUM} with pgbroker from commit 0f64afe first, or "
            "install into a new database.",
        )


@dataclass(frozen=True)
class QueueGrant:
    """A role's grant of one kind (producer, consumer, monitor) on the queues matching a glob."""

    role_name: str
    role_kind: str
    pattern: str
    granted_at: datetime


def refuse_other_owner(owner_rows: list[tuple[Any, ...]]) -> None:
    """Refuse an install by a role without the privileges of the one that owns pgbroker's schema
    (install_schema_owner's rows): it could neither read the versions nor change a table or
    function, and failed on the first ('permission denied for table schema_version')."""
    for owner, has_privileges, user in owner_rows:
        if not has_privileges:
            raise InstallError(
                f"pgbroker in this database belongs to role {owner!r}: role {user!r} cannot install "
                "or upgrade it (an upgrade changes the tables and functions that role owns); "
                "nothing was changed",
                hint=f"Run pgbroker install as {owner!r} (or a role granted it, or the server's "
                "admin role); give applications the roles of `pgbroker install --roles` instead.",
            )


def refuse_without_create(may_create: bool, user: str, database: str) -> None:
    """Refuse a first install by a role that may not create schemas in the database: it failed on
    its first CREATE SCHEMA, 'permission denied for database', with the hint of a role that lacks
    a queue's grants."""
    if not may_create:
        raise InstallError(
            f"role {user!r} may not create schemas in database {database!r}, and a first install "
            "makes two (pgmq and pgbroker); nothing was changed",
            hint=f"Run pgbroker install as the database's owner (or the server's admin role), or "
            f"have one give this role the right: GRANT CREATE ON DATABASE {database} TO {user}.",
        )


def refuse_foreign_pgmq(has_extension: bool, has_schema: bool, has_pgbroker: bool) -> None:
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
