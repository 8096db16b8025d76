"""Fixtures for the integration tests: a Broker on the test's fresh database, a queue in it, and a
database shared by one module's tests when none of them may change it (the bad-input tests)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgbroker import Broker, Queue


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
    name = f"m_{uuid.uuid4().hex}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template_db)
            )
        )
    try:
        yield make_conninfo(pg_admin_dsn, dbname=name)
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


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
