"""A private pgbouncer in transaction pooling mode in front of the test server (tests/support/pooler.py),
and the test's database reached through it. A test that asks for ``pooler`` (``pooled_dsn`` does)
is marked ``pgbouncer`` (tests/plugins/services.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgbroker._db.dsn import POOLER_ENV
from tests.support.pooler import transaction_pooler


@pytest.fixture(scope="module")
def pooler(pg_admin_dsn: str) -> Iterator[str]:
    with transaction_pooler(pg_admin_dsn) as dsn:
        yield dsn


@pytest.fixture
def pooled_dsn(pooler: str, dsn: str) -> str:
    """The test's fresh database, reached through the pooler."""
    return make_conninfo(pooler, dbname=conninfo_to_dict(dsn)["dbname"])


@pytest.fixture
def pooler_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOLER_ENV, "transaction")
