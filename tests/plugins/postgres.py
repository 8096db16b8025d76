"""Postgres fixtures for the whole suite: a server, a migrated template, a database per test or
per module, a Broker on it, and private clusters a test may restart.

The server is ``$PGBROKER_TEST_DSN`` when set (a superuser DSN), else a private embedded cluster
started for this session. Database names are random, so pytest-xdist workers never collide.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from pgbroker import Broker, Queue
from pgbroker.embedded import EmbeddedPostgres
from tests.support.postgres import create_db, drop_db, dsn_for_db, fresh_database, scratch_dir, socket_link


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
    from pgbroker._db.install import install

    name = f"pgbroker_tpl_{uuid.uuid4().hex[:12]}"
    create_db(pg_admin_dsn, name, "template0")
    try:
        with psycopg.connect(dsn_for_db(pg_admin_dsn, name), autocommit=True) as conn:
            install(conn)
        yield name
    finally:
        drop_db(pg_admin_dsn, name)


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


@pytest.fixture
def broker(dsn: str) -> Iterator[Broker]:
    """A Broker on the test's database (pgbroker installed), closed after the test."""
    with Broker(dsn, max_connections=4) as b:
        yield b


@pytest.fixture
def queue(broker: Broker) -> Queue:
    """A freshly created, empty queue named 'jobs'."""
    return broker.create_queue("jobs")


@pytest.fixture(scope="module")
def module_dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    """A database with pgbroker installed, shared by every test of one module.

    Only for tests that prove a call changes nothing: each compares the database before and
    after, so sharing it cannot hide a change, and it saves creating a database per case.
    """
    with fresh_database(pg_admin_dsn, template_db) as shared:
        yield shared


@pytest.fixture(scope="module")
def module_conn(module_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the module's shared database."""
    with psycopg.connect(module_dsn, autocommit=True) as c:
        yield c


@pytest.fixture(scope="module")
def module_broker(module_dsn: str) -> Iterator[Broker]:
    """A Broker on the module's shared database."""
    with Broker(module_dsn, max_connections=4) as b:
        yield b


@pytest.fixture
def cluster() -> Iterator[EmbeddedPostgres]:
    """A private embedded cluster, started, with pgbroker installed: restarting it disturbs no
    other test."""
    from pgbroker._db.install import install

    directory = scratch_dir("pgbroker-restart-")
    pg = EmbeddedPostgres(directory / "pg")
    try:
        with psycopg.connect(pg.start(), autocommit=True) as conn:
            install(conn)
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def unstarted_cluster() -> Iterator[EmbeddedPostgres]:
    """A private embedded cluster the test starts itself (and may restart); stopped afterwards."""
    directory = scratch_dir("pgbroker-chaos-")
    pg = EmbeddedPostgres(directory / "pg")
    try:
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def replicated() -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    """A private primary with pgbroker installed and an asynchronous streaming standby of it
    (tests.support.replication); both stopped and removed afterwards."""
    from tests.support.replication import replicated_pair

    with replicated_pair() as pair:
        yield pair


@pytest.fixture(name="socket_link")
def socket_link_fixture(dsn: str) -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """The test's database through a link to the server's socket, with what cuts and restores the
    link (tests.support.postgres.socket_link)."""
    with socket_link(dsn) as linked:
        yield linked
