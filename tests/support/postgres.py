"""Postgres helpers shared by the fixtures and the tests: scratch directories for throwaway
clusters, databases cloned from a template, waiting out a restart."""

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
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

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


def create_db(admin_dsn: str, name: str, template: str) -> None:
    with _admin(admin_dsn) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        )


def drop_db(admin_dsn: str, name: str) -> None:
    # FORCE (PostgreSQL 13+): a test that leaked a connection must not leak its database.
    with _admin(admin_dsn) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def fresh_database(admin_dsn: str, template: str) -> Iterator[str]:
    """DSN of a new database cloned from ``template``, dropped on leaving."""
    name = f"t_{uuid.uuid4().hex}"
    create_db(admin_dsn, name, template)
    try:
        yield dsn_for_db(admin_dsn, name)
    finally:
        drop_db(admin_dsn, name)


def _restart_and_wait(pg: EmbeddedPostgres) -> None:
    """A fast restart (sessions cut), then wait until the server accepts connections again."""
    wait_until_accepting(pg.restart())


def _rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    """Run a query on a new connection, waiting out a restart of the server."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                return conn.execute(query).fetchall()
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def server_socket(dsn: str) -> Path:
    """The Unix socket of the server ``dsn`` reaches (its host a socket directory)."""
    params = conninfo_to_dict(dsn)
    return Path(str(params["host"])) / f".s.PGSQL.{params['port']}"


@contextmanager
def socket_link(dsn: str) -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """A DSN reaching ``dsn``'s server through a link to its socket, and what cuts the link
    (new connections are refused, as while a server restarts; those made go on) and restores it."""
    target = server_socket(dsn)
    scratch = Path(tempfile.mkdtemp(prefix="pgb-link-"))  # short: a socket path has a size limit
    link = scratch / target.name
    link.symlink_to(target)
    try:
        yield make_conninfo(dsn, host=str(scratch)), link.unlink, lambda: link.symlink_to(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
