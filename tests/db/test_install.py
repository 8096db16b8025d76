"""Installing and upgrading the schema: idempotent, serialised, never over someone else's pgmq."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgbroker import Broker, NotInstalled
from pgbroker._db.install import install, installed_version
from pgbroker._db.install_rules import InstallResult, latest_version
from pgbroker._sql import BASELINE, DEV_MINIMUM, baseline_checksum, upgrades
from pgbroker.errors import InstallError
from tests.support.dev_schema import install_dev
from tests.support.tables import Conn


def applied(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT version, name, checksum FROM pgbroker.schema_version ORDER BY version"
    ).fetchall()


def shipped() -> list[tuple[Any, ...]]:
    return [(BASELINE, "baseline", baseline_checksum())] + [
        (u.to_version, u.name, u.file.checksum) for u in upgrades()
    ]


def dev_applied(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT version, name, checksum FROM pgbroker.schema_migrations ORDER BY version"
    ).fetchall()


def schemas(conn: Conn) -> list[str]:
    return [
        row[0]
        for row in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname IN ('pgmq', 'pgbroker') ORDER BY 1"
        ).fetchall()
    ]


def test_install_on_an_empty_database_records_every_version(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert installed_version(conn) is None
        result = install(conn)
        assert result == InstallResult(None, latest_version())
        assert result.changed
        assert applied(conn) == shipped()
        assert installed_version(conn) == latest_version()


def test_install_is_idempotent(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        install(conn)
        conn.execute("SELECT pgmq.create('jobs')")
        conn.execute("SELECT pgmq.send('jobs', '{\"a\": 1}')")
        again = install(conn)
        assert again == InstallResult(latest_version(), latest_version())
        assert not again.changed
        assert applied(conn) == shipped()
        assert conn.execute("SELECT message FROM pgmq.q_jobs").fetchall() == [({"a": 1},)]


def test_broker_install_reports_the_versions(empty_dsn: str) -> None:
    with Broker(empty_dsn) as broker:
        assert broker.install() == InstallResult(None, latest_version())
        assert broker.install() == InstallResult(latest_version(), latest_version())
        broker.create_queue("jobs").send("x")


def test_client_on_a_database_without_pgbroker_says_not_installed(empty_dsn: str) -> None:
    with Broker(empty_dsn) as broker:
        with pytest.raises(NotInstalled) as info:
            broker.create_queue("jobs")
        assert info.value.hint
        assert "install" in info.value.hint
        with pytest.raises(NotInstalled):
            broker.queue("jobs").send("x")


def test_install_refuses_a_pgmq_schema_it_did_not_create(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA pgmq")
        conn.execute(
            "CREATE TABLE pgmq.meta (queue_name varchar UNIQUE NOT NULL, is_partitioned boolean NOT NULL,"
            " is_unlogged boolean NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute("INSERT INTO pgmq.meta VALUES ('theirs', false, false)")
        with pytest.raises(InstallError, match='schema "pgmq" already exists') as info:
            install(conn)
        assert info.value.hint
        assert schemas(conn) == ["pgmq"]
        assert conn.execute("SELECT queue_name FROM pgmq.meta").fetchall() == [("theirs",)]
        assert installed_version(conn) is None


def test_install_refuses_to_downgrade_a_newer_schema(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgbroker.schema_version (version, name, checksum) VALUES ('9.9.9', 'future', 'x')"
        )
        before = applied(conn)
        with pytest.raises(InstallError, match="refusing to downgrade") as info:
            install(conn)
        assert info.value.hint
        assert applied(conn) == before


@pytest.mark.parametrize("column", ["name", "checksum"])
def test_install_refuses_a_schema_installed_by_another_build(dsn: str, column: str) -> None:
    # What a database installed from another branch looks like: the same version recorded for
    # a different schema.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("UPDATE pgbroker.schema_version SET {} = 'elsewhere' WHERE version = %s").format(
                sql.Identifier(column)
            ),
            (latest_version(),),
        )
        before = applied(conn)
        with pytest.raises(InstallError, match=f"schema version {latest_version()} is") as info:
            install(conn)
        assert "another build of pgbroker" in str(info.value)
        assert info.value.hint
        assert applied(conn) == before


def test_concurrent_installs_all_succeed_and_install_once(empty_dsn: str) -> None:
    installers = 5
    barrier = threading.Barrier(installers)
    results: list[InstallResult] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with psycopg.connect(empty_dsn, autocommit=True) as conn:
                barrier.wait()
                results.append(install(conn))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(installers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    previous = [r.previous_version for r in results]
    assert sorted(previous, key=str) == [latest_version()] * (installers - 1) + [None]
    assert {r.version for r in results} == {latest_version()}
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert applied(conn) == shipped()


def test_upgrade_from_a_development_database_keeps_queues_and_messages_working(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        install_dev(conn, up_to=1)
        conn.execute("SELECT pgmq.create('jobs')")
        conn.execute("SELECT pgmq.create_unlogged('fast')")
        ids = [
            row[0]
            for row in conn.execute("SELECT * FROM pgmq.send_batch('jobs', '{1,2,3}'::jsonb[])").fetchall()
        ]
        conn.execute("SELECT pgmq.send('fast', '\"f\"', '{\"h\": 1}'::jsonb)")
        [(leased_id, leased_ct)] = conn.execute(
            "SELECT msg_id, read_ct FROM pgmq.read('jobs', 3600, 1)"
        ).fetchall()
        conn.execute("SELECT pgmq.archive('jobs', %s::bigint)", [ids[2]])
        before = conn.execute(
            "SELECT msg_id, read_ct, vt, message FROM pgmq.q_jobs ORDER BY msg_id"
        ).fetchall()

        install_dev(conn)
        assert install(conn) == InstallResult(f"{BASELINE}.dev{DEV_MINIMUM}", latest_version())
        assert applied(conn) == shipped()
        assert conn.execute("SELECT to_regclass('pgbroker.schema_migrations')").fetchone() == (None,)

        assert (
            conn.execute("SELECT msg_id, read_ct, vt, message FROM pgmq.q_jobs ORDER BY msg_id").fetchall()
            == before
        )
        assert conn.execute("SELECT msg_id FROM pgmq.a_jobs").fetchall() == [(ids[2],)]
        assert (leased_id, leased_ct) == (ids[0], 1)
        # The message sent at development version 1 is read with a receipt and acked through the fenced API.
        [(msg_id, read_ct, receipt)] = conn.execute(
            "SELECT msg_id, read_ct, receipt FROM pgbroker.read('jobs', 60, 5)"
        ).fetchall()
        assert (msg_id, read_ct) == (ids[1], 1)
        assert conn.execute("SELECT pgbroker.ack('jobs', %s)", [receipt]).fetchone() == (ids[1],)
        assert conn.execute("SELECT msg_id FROM pgmq.a_jobs ORDER BY 1").fetchall() == [(ids[1],), (ids[2],)]
        # New messages keep the same sequence, and the unlogged queue stays unlogged.
        [(new_id,)] = conn.execute("SELECT * FROM pgmq.send('jobs', '4')").fetchall()
        assert new_id == ids[2] + 1
        assert conn.execute("SELECT message, headers FROM pgmq.pop('fast')").fetchall() == [("f", {"h": 1})]
        assert conn.execute(
            "SELECT relpersistence FROM pg_class WHERE oid = 'pgmq.q_fast'::regclass"
        ).fetchone() == ("u",)
        assert [row[0] for row in conn.execute("SELECT queue_name FROM pgmq.list_queues()").fetchall()] == [
            "fast",
            "jobs",
        ]


def test_install_refuses_a_development_database_older_than_the_baseline_starts_from(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        install_dev(conn, up_to=DEV_MINIMUM - 1)
        before = dev_applied(conn)
        with pytest.raises(InstallError, match=f"development schema version {DEV_MINIMUM - 1}") as info:
            install(conn)
        assert info.value.hint
        assert dev_applied(conn) == before
        assert conn.execute("SELECT to_regclass('pgbroker.schema_version')").fetchone() == (None,)


@pytest.mark.parametrize("column", ["name", "checksum"])
def test_install_refuses_a_development_database_of_another_build(empty_dsn: str, column: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        install_dev(conn)
        conn.execute(
            sql.SQL("UPDATE pgbroker.schema_migrations SET {} = 'elsewhere' WHERE version = %s").format(
                sql.Identifier(column)
            ),
            (DEV_MINIMUM,),
        )
        before = dev_applied(conn)
        with pytest.raises(InstallError, match=f"migration {DEV_MINIMUM} is") as info:
            install(conn)
        assert "another build of pgbroker" in str(info.value)
        assert info.value.hint
        assert dev_applied(conn) == before


def test_install_refuses_a_newer_development_database(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        install_dev(conn)
        conn.execute(
            "INSERT INTO pgbroker.schema_migrations (version, name, checksum) VALUES (999, 'future', 'x')"
        )
        before = dev_applied(conn)
        with pytest.raises(InstallError, match="refusing to downgrade") as info:
            install(conn)
        assert info.value.hint
        assert dev_applied(conn) == before


def test_an_upgrade_held_up_by_a_client_idle_in_transaction_names_it_and_changes_nothing(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that called pgmq.set_vt in a transaction and left it open holds the queue's
    engine tables: the upgrade cannot lock them, gives up, and says which session to end."""
    import pgbroker._db.install as installer

    monkeypatch.setattr(installer, "LOCK_ATTEMPTS", 3)  # a few tries, not a minute
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgmq.create('jobs')")
        conn.execute("SELECT pgmq.send('jobs', '{}')")
        conn.execute("UPDATE pgbroker.schema_functions SET checksum = 'of an older package'")
        with psycopg.connect(dsn, application_name="billing-worker") as idle:
            idle.execute("SELECT * FROM pgmq.set_vt('jobs', 1, 30)")
            with pytest.raises(InstallError) as caught:
                install(conn)
            pid = idle.info.backend_pid
        assert conn.execute("SELECT checksum FROM pgbroker.schema_functions").fetchone() == (
            "of an older package",
        )
    message = str(caught.value)
    assert f"held by pid {pid} (idle in transaction for " in message
    assert "application 'billing-worker'" in message
    assert "pg_terminate_backend" in (caught.value.hint or "")
