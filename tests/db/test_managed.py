"""Managed Postgres (RDS, Cloud SQL, Azure, Supabase, Neon): the application's role is no
superuser. With CREATEDB and CREATEROLE, as those services give their admin role, it installs,
upgrades, makes the database roles and runs every kind of queue; with neither (an owner of its
database only) it installs, and `install --roles` says what it lacks.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgbroker import Broker
from pgbroker._db.install import install, install_roles
from pgbroker._db.install_rules import InstallResult, latest_version
from pgbroker._sql import BASELINE, DEV_MINIMUM
from pgbroker.errors import InstallError, MissingExtension, from_postgres
from tests.support.dev_schema import install_dev


def _owned_database(admin_dsn: str, *privileges: str) -> Iterator[str]:
    """A LOGIN role with only ``privileges`` (never SUPERUSER) and a database it owns."""
    role = f"app_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER " + " ".join(privileges)).format(sql.Identifier(role))
        )
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(role), sql.Identifier(role))
        )
    try:
        yield make_conninfo(admin_dsn, dbname=role, user=role)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(role)))
            for made in admin.execute(
                "SELECT rolname FROM pg_roles WHERE rolname LIKE %s", [f"{role}%"]
            ).fetchall():
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(made[0])))


@pytest.fixture
def app_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A role like a managed service's admin role: CREATEDB and CREATEROLE, no superuser."""
    yield from _owned_database(pg_admin_dsn, "CREATEDB", "CREATEROLE")


@pytest.fixture
def owner_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A role that only owns its database."""
    yield from _owned_database(pg_admin_dsn)


def _role(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
    assert row is not None
    assert not row[1], "the test's role must not be a superuser"
    return str(row[0])


def test_install_upgrade_and_roles_without_superuser(app_dsn: str) -> None:
    role = _role(app_dsn)
    with psycopg.connect(app_dsn, autocommit=True) as conn:
        install_dev(conn)
        assert install(conn) == InstallResult(f"{BASELINE}.dev{DEV_MINIMUM}", latest_version())
        granted = install_roles(conn, role)
    assert set(granted) == {f"{role}_producer", f"{role}_consumer", f"{role}_monitor"}
    assert all(count > 0 for count in granted.values())
    # The CLI too, as a user runs it.
    done = subprocess.run(
        [sys.executable, "-m", "pgbroker.cli", "--dsn", app_dsn, "install", "--roles", "--role-prefix", role],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_every_kind_of_queue_works_without_superuser(app_dsn: str) -> None:
    _role(app_dsn)
    with Broker(app_dsn) as broker:
        broker.install()
        jobs = broker.create_queue("jobs", notify=True)
        broker.create_queue("scratch", unlogged=True).send({"n": 0})
        broker.create_queue("jobs_dlq")
        jobs.set_policy(max_deliveries=1, dead_letter_queue="jobs_dlq")
        with broker.connection() as conn:
            conn.execute("SELECT pgmq.create_fifo_index('jobs')")
            conn.execute("SELECT pgmq.bind_topic('orders.*', 'jobs')")
            assert conn.execute("SELECT pgmq.send_topic('orders.eu', '{\"n\": 1}')").fetchone() == (1,)
        jobs.send({"n": 2})
        first, second = jobs.read_many(2, vt=30, wait=1)
        jobs.ack(first)
        assert jobs.fail(second, error="boom") == "dead_lettered"
        assert [m.message for m in jobs.dead_letters()] == [{"n": 2}]
        assert broker.drop_queue("scratch")


def test_partitioned_queues_without_pg_partman_say_what_to_install(app_dsn: str) -> None:
    with Broker(app_dsn) as broker:
        broker.install()
        with broker.connection() as conn, pytest.raises(psycopg.Error) as caught:
            conn.execute("SELECT pgmq.create_partitioned('events')")
    error = from_postgres(caught.value)
    assert isinstance(error, MissingExtension)
    assert "pg_partman" in str(error)
    assert "CREATE EXTENSION pg_partman" in (error.hint or "")


def test_an_owner_without_createrole_installs_and_is_told_what_roles_need(
    owner_dsn: str, pg_admin_dsn: str
) -> None:
    role = _role(owner_dsn)
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        assert install(conn).version == latest_version()
        with pytest.raises(InstallError) as caught:
            install_roles(conn, role)
        assert "CREATEROLE" in (caught.value.hint or "")
        # As the hint says: roles made beforehand by an admin are then granted by the owner.
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            for suffix in ("producer", "consumer", "monitor"):
                admin.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(f"{role}_{suffix}")))
        granted = install_roles(conn, role)
    assert set(granted) == {f"{role}_producer", f"{role}_consumer", f"{role}_monitor"}


def _login_role(admin_dsn: str, database_dsn: str, *grants: str) -> Iterator[str]:
    """A LOGIN role, no superuser, given ``grants`` on the database of ``database_dsn`` (which it
    does not own: as in PostgreSQL 15, it may not create in schema public); its DSN."""
    role = f"app_{uuid.uuid4().hex[:10]}"
    database = sql.Identifier(str(conninfo_to_dict(database_dsn)["dbname"]))
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER").format(sql.Identifier(role)))
        for grant in grants:
            admin.execute(
                sql.SQL("GRANT " + grant + " ON DATABASE {} TO {}").format(database, sql.Identifier(role))
            )
    try:
        yield make_conninfo(database_dsn, user=role)
    finally:
        with psycopg.connect(database_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _install_by_cli(dsn: str) -> subprocess.CompletedProcess[str]:
    """`pgbroker install`, as a deploy runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pgbroker.cli", "--dsn", dsn, "install"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def schema_owner_dsn(pg_admin_dsn: str, empty_dsn: str) -> Iterator[str]:
    """A role that may create schemas in the test's empty database, and nothing more."""
    yield from _login_role(pg_admin_dsn, empty_dsn, "CONNECT, CREATE")


@pytest.fixture
def application_dsn(pg_admin_dsn: str, empty_dsn: str) -> Iterator[str]:
    """Another role of the same database: an application's, which may connect."""
    yield from _login_role(pg_admin_dsn, empty_dsn, "CONNECT")


@pytest.mark.parametrize("grant", ["nothing", "the schemas' usage, as a queue grant gives"])
def test_an_install_by_a_role_that_does_not_own_pgbroker_names_the_owner_and_changes_nothing(
    schema_owner_dsn: str, application_dsn: str, grant: str
) -> None:
    owner, application = _role(schema_owner_dsn), _role(application_dsn)
    with psycopg.connect(schema_owner_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT has_schema_privilege('public', 'CREATE')").fetchone() == (False,)
        install_dev(conn)
        assert install(conn) == InstallResult(f"{BASELINE}.dev{DEV_MINIMUM}", latest_version())
        conn.execute("SELECT pgmq.create('jobs')")
        conn.execute("UPDATE pgbroker.schema_functions SET checksum = 'of an older package'")
        if grant != "nothing":
            usage = sql.SQL("GRANT USAGE ON SCHEMA pgmq, pgbroker TO {}")
            conn.execute(usage.format(sql.Identifier(application)))
    # A deploy that runs `pgbroker install` as the application's role.

    done = _install_by_cli(application_dsn)

    assert done.returncode == 5, done.stderr
    assert done.stderr.startswith(
        f"pgbroker: error: pgbroker in this database belongs to role '{owner}': role '{application}' "
        "cannot install or upgrade it"
    ), done.stderr
    assert f"hint: Run pgbroker install as '{owner}'" in done.stderr
    with psycopg.connect(schema_owner_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT checksum FROM pgbroker.schema_functions").fetchone()
        assert row == ("of an older package",)
        assert install(conn) == InstallResult(latest_version(), latest_version())


def test_a_first_install_by_a_role_that_may_not_create_schemas_says_which_right_and_changes_nothing(
    application_dsn: str,
) -> None:
    # It failed on its first CREATE SCHEMA, 'permission denied for database ...', with the CLI's
    # hint for a role without a queue's grants ('GRANT pgbroker_consumer TO <role>').
    role, database = _role(application_dsn), str(conninfo_to_dict(application_dsn)["dbname"])

    done = _install_by_cli(application_dsn)

    assert done.returncode == 5, done.stderr
    assert done.stderr.startswith(
        f"pgbroker: error: role '{role}' may not create schemas in database '{database}'"
    ), done.stderr
    assert f"GRANT CREATE ON DATABASE {database} TO {role}" in done.stderr
    assert "pgbroker_consumer" not in done.stderr
    with psycopg.connect(application_dsn) as conn:
        schemas = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname IN ('pgmq', 'pgbroker')")
        assert schemas.fetchall() == []
