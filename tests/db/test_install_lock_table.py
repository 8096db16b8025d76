"""An upgrade and the server's lock table (docs/operations.md, "Upgrading"): the lock table holds
max_locks_per_transaction x (max_connections + max_prepared_transactions) locks for every session
together, and an upgrade takes its tables at once before it changes anything. A database of many
queues upgrades on a server whose lock table could not hold a lock on each queue's tables; a server
whose lock table is full fails the upgrade saying which setting to raise, and to what."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from pgbroker._db.install_rules import latest_version
from pgbroker._sql import BASELINE, DEV_MINIMUM
from pgbroker.embedded import EmbeddedPostgres
from tests.support.cli import Cli
from tests.support.dev_schema import install_dev

# A small lock table: 10 locks a slot (the least PostgreSQL takes), for max_connections and the
# server's other processes. It held 928 advisory locks of one session, with the spare shared
# memory; an upgrade holds about 600 at once (one for each function it writes again).
SMALL_LOCK_TABLE = {"max_locks_per_transaction": "10", "max_connections": "30"}
# Queues enough for a lock on each of their tables (two a queue) to overflow it: the upgrade took
# them all and failed with "out of shared memory".
QUEUES = 300
CREATED_AT_ONCE = 10  # queues created by one transaction (each locks its new relations)


@pytest.fixture
def small_lock_table(unstarted_cluster: EmbeddedPostgres) -> str:
    """A private server with the smallest lock table, started; its DSN."""
    with psycopg.connect(unstarted_cluster.start(), autocommit=True) as conn:
        for name, value in SMALL_LOCK_TABLE.items():
            conn.execute(f"ALTER SYSTEM SET {name} = {value}")
    dsn = unstarted_cluster.restart()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, value in SMALL_LOCK_TABLE.items():
            assert conn.execute(f"SELECT current_setting('{name}')").fetchone() == (value,)
    return dsn


def create_queues(conn: psycopg.Connection[Any], count: int) -> None:
    for first in range(1, count + 1, CREATED_AT_ONCE):
        last = min(first + CREATED_AT_ONCE - 1, count)
        conn.execute("SELECT pgmq.create('q' || i) FROM generate_series(%s::int, %s::int) i", [first, last])


def test_a_database_of_many_queues_upgrades_on_a_small_lock_table(small_lock_table: str) -> None:
    with psycopg.connect(small_lock_table, autocommit=True) as conn:
        install_dev(conn)
        create_queues(conn, QUEUES)
        conn.execute("SELECT pgmq.send('q1', '{\"n\": 1}')")

    out = Cli(small_lock_table).ok("install")

    assert f"installed version {latest_version()} (was {BASELINE}.dev{DEV_MINIMUM})" in out
    with psycopg.connect(small_lock_table, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pgmq.meta").fetchone() == (QUEUES,)
        assert conn.execute("SELECT message FROM pgbroker.read('q1', 30, 1)").fetchall() == [({"n": 1},)]


def fill_lock_table(conn: psycopg.Connection[Any]) -> int:
    """Take session advisory locks until the server's lock table is full; how many were had."""
    taken = 0
    while True:
        try:
            conn.execute("SELECT pg_advisory_lock(%s)", [taken + 1])
        except psycopg.errors.OutOfMemory:
            return taken
        taken += 1


def test_an_upgrade_that_finds_the_lock_table_full_names_the_setting_and_changes_nothing(
    small_lock_table: str,
) -> None:
    with psycopg.connect(small_lock_table, autocommit=True) as conn:
        Cli(small_lock_table).ok("install")
        conn.execute("UPDATE pgbroker.schema_functions SET checksum = 'of an older package'")
    with psycopg.connect(small_lock_table, autocommit=True) as filler:
        taken = fill_lock_table(filler)
        # Room for the install's first steps, not for its upgrade.
        for key in range(taken, taken - 10, -1):
            filler.execute("SELECT pg_advisory_unlock(%s)", [key])

        res = Cli(small_lock_table)("install")

    assert res.returncode == 5, res.stderr
    assert res.stderr.startswith("pgbroker: error: the server's lock table is full: the upgrade holds about ")
    assert "max_locks_per_transaction = 10 (x 30 connections" in res.stderr
    needed = re.search(r"Set max_locks_per_transaction to at least (\d+) ", res.stderr)
    assert needed is not None, res.stderr
    assert int(needed[1]) > 10
    assert "nothing was changed" in res.stderr
    with psycopg.connect(small_lock_table, autocommit=True) as conn:
        row = conn.execute("SELECT checksum FROM pgbroker.schema_functions").fetchone()
        assert row == ("of an older package",)
