"""Fixtures of the compatibility suite: a reference pgmq database beside pgbroker's, and pgmq clients.

``reference_dsn`` is a fresh database of the same server with the reference pgmq 1.13 SQL
installed (cloned from a session template, see ``tests/compat/reference.py``); ``dsn`` (from
``tests/plugins/postgres.py``) is the pgbroker one. ``client`` is each of the two official clients
in turn (a ``flavour``, ``tests/compat/clients.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import closing

import psycopg
import pytest
from pgmq import PGMQueue

from tests.compat.clients import AsyncFlavour, Flavour, flavour_of, make_sync_client
from tests.compat.reference import (
    EXPECTED_VERSION,
    clone_database,
    create_reference_database,
    drop_database,
    reference_version,
)
from tests.support.postgres import dsn_for_db

# The pgmq client reads PG_* and DATABASE_URL from the environment; the tests pass every
# connection field explicitly, so none of those can redirect them to another server.
_CLIENT_ENV = ("DATABASE_URL", "PG_HOST", "PG_PORT", "PG_DATABASE", "PG_USERNAME", "PG_PASSWORD")


def has_pg_partman(admin_dsn: str) -> bool:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'pg_partman')")
        found = row.fetchone()
    return bool(found and found[0])


@pytest.fixture(autouse=True)
def _no_client_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLIENT_ENV:
        if name in os.environ:
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def pg_partman(pg_admin_dsn: str) -> bool:
    """Whether the server can create the pg_partman extension (needed by partitioned queues)."""
    return has_pg_partman(pg_admin_dsn)


@pytest.fixture
def require_pg_partman(pg_partman: bool, dsn: str) -> None:
    """Skip unless pg_partman is available; when it is, create it in the pgbroker database."""
    if not pg_partman:
        pytest.skip("pg_partman is not available on the test server (pg_available_extensions)")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_partman")


@pytest.fixture(scope="session")
def reference_template(pg_admin_dsn: str) -> Iterator[str]:
    """A database with the reference pgmq SQL installed, cloned by ``reference_dsn``."""
    assert reference_version() == EXPECTED_VERSION, (
        f"the pgmq wheel carries SQL {reference_version()}; this suite compares against {EXPECTED_VERSION}"
    )
    name = create_reference_database(pg_admin_dsn)
    try:
        yield name
    finally:
        drop_database(pg_admin_dsn, name)


@pytest.fixture
def reference_dsn(pg_admin_dsn: str, reference_template: str) -> Iterator[str]:
    """DSN of a fresh database with the reference pgmq SQL installed, dropped after the test."""
    name = create_reference_database(pg_admin_dsn, template=reference_template)
    try:
        yield dsn_for_db(pg_admin_dsn, name)
    finally:
        drop_database(pg_admin_dsn, name)


@pytest.fixture(scope="module")
def module_dsns(pg_admin_dsn: str, template_db: str, reference_template: str) -> Iterator[tuple[str, str]]:
    """(pgbroker DSN, reference DSN) of two fresh databases shared by one module's tests.

    For tests that change nothing (catalog checks, calls that must fail): they save the two
    database clones a test otherwise costs.
    """
    ours = clone_database(pg_admin_dsn, template_db, "t_mod_")
    try:
        theirs = clone_database(pg_admin_dsn, reference_template, "pgmq_ref_mod_")
        try:
            yield dsn_for_db(pg_admin_dsn, ours), dsn_for_db(pg_admin_dsn, theirs)
        finally:
            drop_database(pg_admin_dsn, theirs)
    finally:
        drop_database(pg_admin_dsn, ours)


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    """Each official client in turn: the sync one (psycopg), then the asyncio one (asyncpg)."""
    with flavour_of(request.param) as chosen:
        yield chosen


@pytest.fixture
def async_flavour() -> Iterator[AsyncFlavour]:
    """The asyncio client's flavour alone, for what only it has."""
    with flavour_of("async") as chosen:
        assert isinstance(chosen, AsyncFlavour)
        yield chosen


@pytest.fixture
def client(flavour: Flavour, dsn: str) -> Iterator[PGMQueue]:
    """An official pgmq client, of each flavour in turn, on a fresh pgbroker database."""
    with closing(flavour.connect(dsn)) as queue:
        yield queue


@pytest.fixture
def sync_client(dsn: str) -> Iterator[PGMQueue]:
    """The official sync pgmq client alone, for what only it has."""
    with closing(make_sync_client(dsn)) as queue:
        yield queue
