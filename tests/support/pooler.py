"""A private pgbouncer in transaction pooling mode in front of the test server, as production
stacks put one in front of Postgres (Debian's pgbouncer, which `make pgbouncer` installs).

Transaction pooling hands each transaction whatever server connection is free: a session's
prepared statements, settings and LISTENs do not follow it, which is what the pooler tests try.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.http.live import free_port
from tests.support.postgres import scratch_dir, wait_until_accepting
from tests.support.processes import stop_gracefully

PGBOUNCER = shutil.which("pgbouncer", path=os.environ.get("PATH", "") + ":/usr/sbin")
INSTALL_HINT = "pgbouncer is not installed: run `make pgbouncer` (as root: apt-get install pgbouncer)"


@contextmanager
def transaction_pooler(server_dsn: str, pool_size: int = 4) -> Iterator[str]:
    """Start pgbouncer (pool_mode = transaction, ``pool_size`` server connections per database)
    on a free loopback port in front of ``server_dsn``'s server; yield a DSN template whose
    dbname the caller replaces (make_conninfo(dsn, dbname=...)); stop it afterwards."""
    assert PGBOUNCER, INSTALL_HINT
    server = conninfo_to_dict(server_dsn)
    directory = scratch_dir("pgbroker-pgbouncer-")
    port = free_port()
    user = str(server.get("user") or pwd.getpwuid(os.getuid()).pw_name)
    (directory / "users.txt").write_text(f'"{user}" ""\n')
    (directory / "pgbouncer.ini").write_text(
        "\n".join(
            [
                "[databases]",
                f"* = host={server.get('host', '127.0.0.1')} port={server.get('port', 5432)}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {directory / 'users.txt'}",
                "pool_mode = transaction",
                f"default_pool_size = {pool_size}",
                "max_client_conn = 500",
                f"logfile = {directory / 'pgbouncer.log'}",
                f"pidfile = {directory / 'pgbouncer.pid'}",
                "",
            ]
        )
    )
    for path in directory.iterdir():
        path.chmod(0o644)
    argv = [PGBOUNCER, str(directory / "pgbouncer.ini")]
    if os.getuid() == 0:  # pgbouncer refuses to run as root: drop to the server's own user
        argv[1:1] = ["-u", _unprivileged_user()]
        os.chmod(directory, 0o777)
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dsn = make_conninfo(host="127.0.0.1", port=str(port), user=user, dbname=str(server.get("dbname", "")))
    try:
        try:
            wait_until_accepting(dsn, timeout=15, alive=lambda: process.poll() is None)
        except psycopg.OperationalError:
            said = process.stderr.read() if process.stderr and process.poll() is not None else b""
            raise RuntimeError(
                f"pgbouncer does not answer (exit code {process.returncode}): {said.decode(errors='replace')}"
            ) from None
        yield dsn
    finally:
        stop_gracefully(process, 10)
        shutil.rmtree(directory, ignore_errors=True)


def _unprivileged_user() -> str:
    for name in ("postgres", "pgbroker", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("no unprivileged user to run pgbouncer as")
