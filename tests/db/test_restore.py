"""Backup, restore and removal with Postgres' own tools (docs/operations.md, "Backup, restore and moving a
database"): a database in use, installed by a non-superuser owner with the roles of
``install --roles``, dumped by pg_dump (custom and plain format) and restored as that owner into a
fresh database, on the same server and on another one. Roles belong to the server, not to the
dump: ``pgbroker install`` gives back what the roles lost where they exist, takes PUBLIC's EXECUTE
off the SECURITY DEFINER entry points, and names the roles that are missing; afterwards sends get
new ids above the old, leases, fences, dead letters, the stream group's cursor, schedules and keys
are as they were. The removal docs/operations.md describes leaves nothing of pgbroker behind.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgbroker import Broker, StaleReceipt
from pgbroker._db.api_keys import create_key
from pgbroker._db.install import grant_queue_access, install, install_roles
from pgbroker.embedded import EmbeddedPostgres, find_bin_dir
from pgbroker.streams._client import Stream
from tests.support.cli import Cli
from tests.support.postgres import scratch_dir

# SECURITY DEFINER functions of pgbroker's schemas that PUBLIC may call: none, ever.
PUBLIC_DEFINERS = """
    SELECT count(*) FROM pg_proc p
    WHERE p.pronamespace IN ('pgmq'::regnamespace, 'pgbroker'::regnamespace) AND p.prosecdef
      AND has_function_privilege('public', p.oid, 'EXECUTE')
"""


def _tool(name: str) -> str:
    path = find_bin_dir() / name
    # Debian's server package depends on its client, which holds pg_dump and pg_restore: missing,
    # the install is broken, which the test says rather than skipping (the suite never skips).
    assert path.exists(), f"{name} is not beside the server's binaries in {path.parent}"
    return str(path)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)


def _admin(dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(dsn, autocommit=True)


@dataclass
class Source:
    """A database in use, as its owner left it: the ids and receipts the checks compare with."""

    dsn: str
    owner: str
    last_id: int
    leased: list[int]
    ready: list[int]
    dead: int
    stream_unacked: list[int]


def _owner_and_database(admin_dsn: str, role: str, database: str) -> str:
    with _admin(admin_dsn) as admin:
        if not admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone():
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER CREATEDB CREATEROLE").format(sql.Identifier(role))
            )
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(database), sql.Identifier(role))
        )
    return make_conninfo(admin_dsn, dbname=database, user=role)


def _drop_everything(admin_dsn: str, role: str, databases: list[str]) -> None:
    with _admin(admin_dsn) as admin:
        for database in databases:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
        for (made,) in admin.execute(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE %s", [f"{role}%"]
        ).fetchall():
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(str(made))))


@pytest.fixture
def source(pg_admin_dsn: str) -> Iterator[Source]:
    """An owner (CREATEDB, CREATEROLE, no superuser), its roles, a login of each kind and a
    scoped reader, and a database with queues, a stream and a schedule in use."""
    role = f"r{uuid.uuid4().hex[:10]}"
    dsn = _owner_and_database(pg_admin_dsn, role, role)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            install(conn)
            install_roles(conn, role)
            for login, member_of in (("app", "producer"), ("worker", "consumer")):
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                        sql.Identifier(f"{role}_{login}"), sql.Identifier(f"{role}_{member_of}")
                    )
                )
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(f"{role}_reader")))
            create_key(conn, "billing", scopes=["read", "send"], queues=["jobs*"])
        with Broker(dsn, max_connections=2) as broker:
            jobs = broker.create_queue("jobs")
            broker.create_queue("jobs_dlq")
            jobs.set_policy(max_deliveries=1, dead_letter_queue="jobs_dlq")
            ids = jobs.send_many([{"n": n} for n in range(8)])
            jobs.send({"later": True}, delay=3600)
            first, dead, *leased = jobs.read_many(4, vt=3600)
            jobs.ack(first)
            assert jobs.fail(dead, error="boom") == "dead_lettered"
            events = Stream(broker, "events")
            events.create(partitions=2)
            events.create_group("billing")
            for n in range(6):
                events.send({"e": n}, key=str(n))
            consumer = events.consumer("billing", name="before")
            consumer.ack(consumer.read(100))
            consumer.release()  # as a StreamWorker does when it stops
            unacked = [events.send({"e": n}, key=str(n)) for n in range(6, 9)]
            broker.add_schedule("minutely", "jobs", "* * * * *", {"tick": True})
        with psycopg.connect(dsn, autocommit=True) as conn:
            grant_queue_access(conn, "consumer", f"{role}_reader", "jobs*")
        yield Source(
            dsn=dsn,
            owner=role,
            last_id=max(ids) + 1,
            leased=[m.msg_id for m in leased],
            ready=ids[4:],
            dead=dead.msg_id,
            stream_unacked=unacked,
        )
    finally:
        _drop_everything(pg_admin_dsn, role, [role, f"{role}_restored"])


@pytest.fixture
def other_server(unstarted_cluster: EmbeddedPostgres) -> str:
    """A second server, private to the test: none of the source's roles exist there."""
    return unstarted_cluster.start()


def _login(dsn: str, user: str) -> str:
    return make_conninfo(dsn, user=user)


def _assert_in_use_as_before(dsn: str, src: Source) -> None:
    """Everything the source was doing goes on in the restored database."""
    with Broker(dsn, max_connections=2) as broker:
        jobs = broker.queue("jobs")
        new_id = jobs.send({"after": "restore"})
        assert new_id > src.last_id
        got = jobs.read_many(20, vt=30)
        # The leases and the delay are kept: only the ready messages and the new one.
        assert [m.msg_id for m in got] == [*src.ready, new_id]
        jobs.ack(got[0])
        with pytest.raises(StaleReceipt):
            jobs.ack(got[0])
        assert [m.msg_id for m in jobs.dead_letters()] == [src.dead]
        consumer = Stream(broker, "events").consumer("billing", name="after")
        assert sorted(m.id for m in consumer.read(100).messages) == src.stream_unacked
        ticks = broker.run_due_schedules(datetime.now(UTC) + timedelta(minutes=2))
        assert [t.schedule_name for t in ticks] == ["minutely"]
        assert all(t.error is None and t.msg_id is not None and t.msg_id > new_id for t in ticks)
        with broker.connection() as conn:
            assert conn.execute("SELECT name FROM pgbroker.api_keys").fetchall() == [("billing",)]


def test_a_custom_dump_restored_on_a_server_without_the_roles_says_which_roles_to_make(
    source: Source, other_server: str
) -> None:
    dump = scratch_dir("pgbroker-dump-") / "db.dump"
    try:
        done = _run(_tool("pg_dump"), "-Fc", "-f", str(dump), "-d", source.dsn)
        assert done.returncode == 0, done.stderr
        target = _owner_and_database(other_server, source.owner, f"{source.owner}_restored")
        done = _run(_tool("pg_restore"), "-d", target, str(dump))
    finally:
        shutil.rmtree(dump.parent, ignore_errors=True)
    # What Postgres cannot restore: the grants to roles that this server does not have (and with
    # them pg_restore's REVOKE from PUBLIC of the same entry, run as one statement).
    errors = [line for line in done.stderr.splitlines() if line.startswith("pg_restore: error:")]
    assert errors, done.stderr
    assert all("does not exist" in line for line in errors), done.stderr

    cli = Cli(target)
    out = cli.ok("install")
    assert "already at version" in out
    missing = [f"{source.owner}_{kind}" for kind in ("producer", "consumer", "monitor")]
    assert all(name in out for name in missing), out
    assert f"pgbroker install --roles --role-prefix {source.owner}" in out
    with psycopg.connect(target) as conn:
        assert conn.execute(PUBLIC_DEFINERS).fetchone() == (0,)

    _assert_in_use_as_before(target, source)
    # As it says: the roles made again, a login of the producer's sends.
    cli.ok("install", "--roles", "--role-prefix", source.owner)
    assert f"{source.owner}_producer" not in cli.ok("install")
    with _admin(other_server) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                sql.Identifier(f"{source.owner}_app"), sql.Identifier(f"{source.owner}_producer")
            )
        )
    with psycopg.connect(_login(target, f"{source.owner}_app"), autocommit=True) as app:
        assert app.execute("SELECT pgmq.send('jobs', '{}')").fetchone() is not None
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            app.execute("SELECT * FROM pgmq.read('jobs', 30, 1)")


def test_a_plain_dump_restored_without_privileges_gets_them_back_from_install(
    source: Source, pg_admin_dsn: str
) -> None:
    """Same server, roles there: a dump made with --no-acl (or restored by a tool that skips
    privileges) leaves the roles with nothing; `pgbroker install` grants them again, the
    scoped reader included."""
    done = _run(_tool("pg_dump"), "--no-acl", "--no-owner", "-d", source.dsn)
    assert done.returncode == 0, done.stderr
    plain = done.stdout
    database = f"{source.owner}_restored"
    with _admin(source.dsn) as owner:
        owner.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    target = make_conninfo(source.dsn, dbname=database)
    done = subprocess.run(
        [_tool("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", target],
        input=plain,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr

    out = Cli(target).ok("install")
    assert "already at version" in out
    with psycopg.connect(target) as conn:
        assert conn.execute(PUBLIC_DEFINERS).fetchone() == (0,)
    _assert_in_use_as_before(target, source)
    with psycopg.connect(_login(target, f"{source.owner}_app"), autocommit=True) as app:
        sent = app.execute("SELECT pgmq.send('jobs', '{}')").fetchone()
    for login in ("worker", "reader"):
        with psycopg.connect(_login(target, f"{source.owner}_{login}"), autocommit=True) as worker:
            assert worker.execute("SELECT msg_id FROM pgmq.read('jobs', 0, 100)").fetchall()[-1:] == [sent]


def _removal_statements() -> list[str]:
    """The SQL of docs/operations.md, "Removing pgbroker", one statement a line."""
    page = (Path(__file__).parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    section = page.split("### Removing pgbroker", 1)[1]
    block = section.split("```sql\n", 1)[1].split("```", 1)[0]
    return [line.split(";", 1)[0] for line in block.splitlines() if line.strip()]


def test_the_documented_removal_leaves_nothing_of_pgbroker(source: Source, pg_admin_dsn: str) -> None:
    """docs/operations.md's procedure, run as the owner (CREATEROLE, no superuser) on a database in
    use: no schema, function, event trigger, default privilege or role of pgbroker's is left, and the
    scoped reader keeps no privilege."""
    database = str(conninfo_to_dict(source.dsn)["dbname"])
    setting = sql.SQL("ALTER DATABASE {} SET pgbroker.max_message_bytes = 4096")
    with _admin(pg_admin_dsn) as admin, psycopg.connect(source.dsn, autocommit=True) as conn:
        # A setting of no built-in parameter: a superuser's to set and to reset (PostgreSQL 15).
        admin.execute(setting.format(sql.Identifier(database)))
        statements = _removal_statements()
        assert conn.execute(statements[0]).fetchall() == [(source.owner,)]
        for statement in statements[1:]:
            done = statement.replace("app_", f"{source.owner}_").replace("mydb", database)
            (admin if done.startswith("ALTER DATABASE") else conn).execute(done)
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin, psycopg.connect(source.dsn) as conn:
        assert (
            conn.execute("SELECT nspname FROM pg_namespace WHERE nspname IN ('pgmq', 'pgbroker')").fetchall()
            == []
        )
        assert conn.execute(
            "SELECT count(*) FROM pg_proc WHERE prosrc ILIKE '%pgbroker%' OR proname LIKE 'pgmq%'"
        ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_event_trigger").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_default_acl").fetchone() == (0,)
        roles = admin.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE %s", [f"{source.owner}%"])
        logins = [source.owner, *(f"{source.owner}_{login}" for login in ("app", "reader", "worker"))]
        assert sorted(r for (r,) in roles.fetchall()) == logins
        # The logins and the scoped reader hold nothing in the database any more.
        left = admin.execute(
            "SELECT count(*) FROM pg_shdepend d JOIN pg_roles r ON r.oid = d.refobjid"
            " WHERE r.rolname LIKE %s AND r.rolname <> %s AND d.deptype = 'a'",
            [f"{source.owner}%", source.owner],
        )
        assert left.fetchone() == (0,)
        settings = admin.execute(
            "SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase"
            " WHERE d.datname = %s",
            [database],
        )
        assert settings.fetchone() == (0,)
