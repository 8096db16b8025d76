"""Fixtures the whole suite shares: a Postgres server, a migrated template, a database per test.

The server is ``$PGBROKER_TEST_DSN`` when set (a superuser DSN), else a private embedded cluster
started for this session. Database names are random, so pytest-xdist workers never collide.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgbroker.embedded import EmbeddedPostgres


def scratch_dir(prefix: str = "pgbroker-test-") -> Path:
    """A new temporary directory for a throwaway cluster, on tmpfs when there is room.

    A cluster or a database is thousands of small files; creating them on this kind of VM's
    disk takes two to four times as long as on tmpfs.
    """
    shm = Path("/dev/shm")
    on_shm = shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 2 * 1024**3
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=shm if on_shm else None))
    # As root the server runs as an unprivileged user, which must be able to enter it.
    d.chmod(0o711)
    return d


def wait_until_accepting(dsn: str, timeout: float = 30, alive: Callable[[], bool] = lambda: True) -> None:
    """Wait until a server accepts connections at ``dsn`` (a restart, a new pooler); ``alive``
    says whether whatever should answer is still running, to fail at once when it is not."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg.connect(dsn, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if not alive() or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def dsn_for_db(admin_dsn: str, dbname: str) -> str:
    """The admin DSN pointed at another database of the same server."""
    return make_conninfo(admin_dsn, dbname=dbname)


def _admin(admin_dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(admin_dsn, autocommit=True)


def _create_db(admin_dsn: str, name: str, template: str) -> None:
    with _admin(admin_dsn) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        )


def _drop_db(admin_dsn: str, name: str) -> None:
    # FORCE (PostgreSQL 13+): a test that leaked a connection must not leak its database.
    with _admin(admin_dsn) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    """A superuser DSN of the server the tests use."""
    env = os.environ.get("PGBROKER_TEST_DSN")
    if env:
        yield env
        return
    tmp = scratch_dir()
    pg = EmbeddedPostgres(tmp / "pg")
    try:
        yield pg.start()
    finally:
        pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg_admin_dsn: str) -> Iterator[str]:
    """Name of a database with pgbroker installed, cloned by the ``dsn`` fixture."""
    from pgbroker.install import install

    name = f"pgbroker_tpl_{uuid.uuid4().hex[:12]}"
    _create_db(pg_admin_dsn, name, "template0")
    try:
        with psycopg.connect(dsn_for_db(pg_admin_dsn, name), autocommit=True) as conn:
            install(conn)
        yield name
    finally:
        _drop_db(pg_admin_dsn, name)


@contextmanager
def fresh_database(admin_dsn: str, template: str) -> Iterator[str]:
    """DSN of a new database cloned from ``template``, dropped on leaving."""
    name = f"t_{uuid.uuid4().hex}"
    _create_db(admin_dsn, name, template)
    try:
        yield dsn_for_db(admin_dsn, name)
    finally:
        _drop_db(admin_dsn, name)


@pytest.fixture
def dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    """DSN of a fresh database with pgbroker installed, dropped after the test."""
    with fresh_database(pg_admin_dsn, template_db) as fresh:
        yield fresh


@pytest.fixture
def empty_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """DSN of a fresh database with nothing installed (for install and migration tests)."""
    with fresh_database(pg_admin_dsn, "template0") as fresh:
        yield fresh


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
