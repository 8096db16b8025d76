"""The embedded cluster with real initdb, pg_ctl and postmaster processes: no mocks."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgbroker._db.dsn import resolve_dsn
from pgbroker.embedded import (
    ENV_PG_BIN,
    PORT_RANGE,
    EmbeddedError,
    EmbeddedPostgres,
    default_data_dir,
)
from tests.support.postgres import scratch_dir


def _cleanup(data_dir: Path) -> None:
    try:
        EmbeddedPostgres(data_dir).stop()
    finally:
        shutil.rmtree(data_dir.parent, ignore_errors=True)


@pytest.fixture
def new_dir() -> Iterator[Path]:
    """A data directory path that does not exist yet; its server is stopped afterwards."""
    d = scratch_dir("pgbroker-emb-") / "pg"
    yield d
    _cleanup(d)


@pytest.fixture(scope="module")
def shared() -> Iterator[EmbeddedPostgres]:
    """One running cluster for the tests that only look at it."""
    # Named "embedded" so that PGBROKER_HOME=<parent> makes it the default cluster.
    d = scratch_dir("pgbroker-emb-") / "embedded"
    pg = EmbeddedPostgres(d)
    pg.start()
    yield pg
    _cleanup(d)


def _query(dsn: str, q: str) -> object:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(q).fetchone()
        assert row is not None
        return row[0]


def test_start_creates_then_reuses(new_dir: Path) -> None:
    pg = EmbeddedPostgres(new_dir)
    dsn = pg.start()
    assert (new_dir / "PG_VERSION").is_file()
    pid = pg.status().pid
    assert pid is not None

    # Another instance (as another process would) finds the same server.
    again = EmbeddedPostgres(new_dir)
    assert again.start() == dsn
    assert again.status().pid == pid
    assert pg.start() == dsn
    assert pg.dsn() == dsn

    assert "PostgreSQL" in str(_query(dsn, "select version()"))
    assert _query(dsn, "select current_database()") == "postgres"
    assert _query(dsn, "select current_user") == "postgres"


def test_status_fields(shared: EmbeddedPostgres) -> None:
    st = shared.status()
    assert st.running
    assert st.data_dir == shared.data_dir
    assert st.dsn == shared.dsn()
    assert st.pid is not None
    assert st.pid == int((shared.data_dir / "postmaster.pid").read_text().split()[0])
    assert st.bin_dir is not None
    assert (st.bin_dir / "postgres").is_file()
    assert st.server_version is not None
    assert st.dsn is not None
    assert str(_query(st.dsn, "show server_version")).startswith(st.server_version)
    assert shared.log_file.is_file()


def test_listens_on_private_socket_only(shared: EmbeddedPostgres) -> None:
    dsn = shared.dsn()
    assert shared.port != 5432
    assert PORT_RANGE[0] <= shared.port <= PORT_RANGE[1]
    assert _query(dsn, "show port") == str(shared.port)
    assert _query(dsn, "show listen_addresses") == ""
    assert _query(dsn, "show unix_socket_directories") == str(shared.socket_dir)
    assert _query(dsn, "show max_connections") == "200"
    assert f"host={shared.socket_dir}" in dsn
    assert (shared.socket_dir / f".s.PGSQL.{shared.port}").is_socket()
    assert not (shared.socket_dir / ".s.PGSQL.5432").exists()


def test_resolve_dsn(shared: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "dbname=from_env")
    assert resolve_dsn("dbname=explicit") == "dbname=explicit"
    assert resolve_dsn() == "dbname=from_env"
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.setenv("PGBROKER_HOME", str(shared.data_dir.parent))
    assert default_data_dir() == shared.data_dir
    assert resolve_dsn() == shared.dsn()


def test_stop_start_restart(new_dir: Path) -> None:
    pg = EmbeddedPostgres(new_dir)
    pg.start()
    first = pg.status().pid

    assert pg.stop() is True
    st = pg.status()
    assert not st.running
    assert st.pid is None
    assert st.dsn is None
    assert not (new_dir / "postmaster.pid").exists()
    with pytest.raises(EmbeddedError, match="not running"):
        pg.dsn()
    assert pg.stop() is False

    dsn = pg.start()
    second = pg.status().pid
    assert second not in (None, first)
    assert _query(dsn, "select 1") == 1

    assert pg.restart() == dsn
    third = pg.status().pid
    assert third not in (None, second)
    assert _query(dsn, "select 1") == 1


def test_start_after_postmaster_killed(new_dir: Path) -> None:
    pg = EmbeddedPostgres(new_dir)
    pg.start()
    pid = pg.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pg.status().running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pg.status().running
    assert (new_dir / "postmaster.pid").exists()  # stale: left by the killed postmaster

    dsn = pg.start()
    assert pg.status().pid not in (None, pid)
    assert _query(dsn, "select 1") == 1


def test_concurrent_start_in_processes(new_dir: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from pgbroker.embedded import EmbeddedPostgres; "
        "pg = EmbeddedPostgres(Path(sys.argv[1])); print(pg.start()); print(pg.status().pid)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(new_dir)], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert len(set(outputs)) == 1, outputs
    assert outputs[0].split("\n")[1] == str(EmbeddedPostgres(new_dir).status().pid)
    assert not list(new_dir.parent.glob(".pg.initdb-*"))


def test_concurrent_start_in_threads(new_dir: Path) -> None:
    results: list[tuple[str, int | None]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def run() -> None:
        try:
            pg = EmbeddedPostgres(new_dir)
            barrier.wait()
            dsn = pg.start()
            results.append((dsn, pg.status().pid))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert len(results) == 4
    assert len(set(results)) == 1


def test_long_data_dir_gets_short_socket_dir(new_dir: Path) -> None:
    deep = new_dir / ("x" * 60) / ("y" * 60)
    pg = EmbeddedPostgres(deep)
    assert pg.socket_dir != pg.data_dir
    assert len(str(pg.socket_dir / f".s.PGSQL.{pg.port}")) <= 107
    new_dir.mkdir()
    new_dir.chmod(0o755)
    try:
        dsn = pg.start()
        assert _query(dsn, "select 1") == 1
        assert (pg.socket_dir.stat().st_mode & 0o777) == 0o700
        assert pg.stop()
        assert not pg.socket_dir.exists()
    finally:
        pg.stop()
        shutil.rmtree(pg.socket_dir, ignore_errors=True)


def test_missing_binaries(new_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv(ENV_PG_BIN, str(empty))
    pg = EmbeddedPostgres(new_dir)
    with pytest.raises(EmbeddedError, match=ENV_PG_BIN) as info:
        pg.start()
    assert "pip install" in str(info.value)
    assert "DATABASE_URL" in str(info.value)
    st = pg.status()
    assert not st.running
    assert st.bin_dir is None
    assert not new_dir.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the server to another user")
def test_root_refuses_data_dir_the_server_user_cannot_reach(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(EmbeddedError, match="cannot enter") as info:
        EmbeddedPostgres(private / "pg").start()
    assert "chmod o+x" in str(info.value)
    assert not (private / "pg").exists()
