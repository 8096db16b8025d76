"""A primary and a streaming standby on this machine, made from the binaries of the embedded
cluster (pgbroker.embedded), and what happens to them in a failover: a crash of the primary, a
promotion, a switchover that keeps the old primary as a standby of the new one, a stalled WAL
receiver (replication lag).

Each server is an EmbeddedPostgres in a directory of its own: it listens on a Unix socket in its
own data directory only (no TCP port to collide with), and runs as the server user when we are
root. The standby is a ``pg_basebackup -R`` of the primary (``standby.signal`` and
``primary_conninfo`` written by it); a demoted primary gets the same two by hand. Everything is
done the way an operator (or Patroni) would, with PostgreSQL's own tools and functions.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgbroker._db.install import install
from pgbroker.embedded import EmbeddedPostgres, find_bin_dir
from pgbroker.embedded.processes import orphans
from pgbroker.embedded.server_user import child_env, run_as_for, usable_bin_dir
from tests.support.postgres import scratch_dir

_SERVER_WAIT = 120.0  # seconds: a bound for a hung server on a loaded machine, not a guess


def _sql(pg: EmbeddedPostgres, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def _as_server_user(pg: EmbeddedPostgres, tool: str, *args: str) -> None:
    """Run one of the server's tools (of ``pg``'s major version) as the user ``pg`` runs as."""
    run_as = run_as_for(pg.data_dir, True)
    major = int((pg.data_dir / "PG_VERSION").read_text())
    exe = usable_bin_dir(find_bin_dir(major, data_dir=pg.data_dir), run_as) / tool
    done = subprocess.run(
        [str(exe), *args],
        env=child_env(os.environ, run_as),
        cwd=pg.data_dir,
        user=run_as.uid if run_as else None,
        group=run_as.gid if run_as else None,
        extra_groups=[] if run_as else None,
        capture_output=True,
        text=True,
        timeout=_SERVER_WAIT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{tool} failed (exit {done.returncode}): {done.stderr}{done.stdout}")


def _owned_like(path: Path, model: Path) -> None:
    """Give ``path`` the owner of ``model`` (the server user's files, when we are root)."""
    st = model.stat()
    if os.geteuid() == 0:
        os.chown(path, st.st_uid, st.st_gid)


def replication_conninfo(upstream: EmbeddedPostgres, name: str) -> str:
    """What a standby of ``upstream`` connects with: its socket, and the standby's name as
    application_name (what synchronous_standby_names lists)."""
    return make_conninfo(upstream.dsn(), dbname=None, application_name=name)


def make_standby(primary: EmbeddedPostgres, data_dir: Path) -> EmbeddedPostgres:
    """A streaming standby of ``primary`` in ``data_dir`` (new), started and replicating."""
    data_dir.mkdir(mode=0o700)
    _owned_like(data_dir, primary.data_dir)
    standby = EmbeddedPostgres(data_dir)
    _as_server_user(
        primary,
        "pg_basebackup",
        "--pgdata", str(data_dir),
        "--dbname", replication_conninfo(primary, data_dir.name),
        "--write-recovery-conf",
        "--wal-method", "stream",
        "--checkpoint", "fast",
        "--no-sync",
    )  # fmt: skip
    standby.start()
    wait_streaming(primary, data_dir.name)
    return standby


@contextmanager
def replicated_pair() -> Iterator[tuple[EmbeddedPostgres, EmbeddedPostgres]]:
    """A new primary with pgbroker installed and an asynchronous streaming standby of it, in a
    scratch directory; both stopped and the directory removed on leaving."""
    directory = scratch_dir("pgbroker-replicated-")
    primary = EmbeddedPostgres(directory / "a")
    standby = EmbeddedPostgres(directory / "b")
    try:
        with psycopg.connect(primary.start(), autocommit=True) as conn:
            install(conn)
        make_standby(primary, standby.data_dir)
        yield primary, standby
    finally:
        for server in (primary, standby):
            server.stop()
        shutil.rmtree(directory, ignore_errors=True)


def wait_streaming(primary: EmbeddedPostgres, name: str) -> None:
    """Wait until the standby ``name`` streams from ``primary``."""
    query = "SELECT 1 FROM pg_stat_replication WHERE application_name = %s AND state = 'streaming'"
    deadline = time.monotonic() + _SERVER_WAIT
    while not _sql(primary, query, (name,)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"standby {name} is not streaming from {primary.data_dir}")
        time.sleep(0.05)


def set_synchronous(primary: EmbeddedPostgres, standby_names: str) -> None:
    """Commits wait for these standbys to have applied them (``''``: replication is asynchronous).

    remote_apply, not only remote flush: what a commit acknowledged is visible on the standby at
    once, so a read of the standby (reporting) or a promotion sees it."""
    commit = "remote_apply" if standby_names else "on"
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        # ALTER SYSTEM takes no parameters: the values are composed as literals.
        for setting, value in (("synchronous_standby_names", standby_names), ("synchronous_commit", commit)):
            conn.execute(
                sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(setting), sql.Literal(value))
            )
        conn.execute("SELECT pg_reload_conf()")


def in_recovery(pg: EmbeddedPostgres) -> bool:
    return bool(_sql(pg, "SELECT pg_is_in_recovery()")[0][0])


def crash(pg: EmbeddedPostgres) -> None:
    """SIGKILL the postmaster, as a machine or a process dying would; wait for its children to go."""
    pid = pg.status().pid
    assert pid is not None, f"no server runs in {pg.data_dir}"
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + _SERVER_WAIT
    while orphans(pg.data_dir):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the processes of the killed server in {pg.data_dir} are still there")
        time.sleep(0.02)


def promote(standby: EmbeddedPostgres) -> float:
    """Promote the standby, waiting until it takes writes; returns the wall time (time.time()) then.

    A promoted standby keeps the primary's synchronous_standby_names only if it had them; ours never
    does (set_synchronous runs on the primary after the base backup), so it takes writes alone."""
    (done,) = _sql(standby, "SELECT pg_promote(wait => true, wait_seconds => %s)", (int(_SERVER_WAIT),))[0]
    assert done, f"{standby.data_dir} was not promoted within {_SERVER_WAIT:.0f} s"
    return time.time()


def demote(old_primary: EmbeddedPostgres, new_primary: EmbeddedPostgres) -> None:
    """Start the stopped ``old_primary`` as a streaming standby of ``new_primary``.

    After a clean stop the old primary's WAL ends with its shutdown checkpoint, which the standby
    had received before it was promoted: the old primary follows the new timeline as it is, with
    no pg_rewind. (After a crash it may hold WAL the new primary never got: pg_rewind first.)"""
    assert not old_primary.status().running, "stop the old primary first"
    name = old_primary.data_dir.name
    signal_file = old_primary.data_dir / "standby.signal"
    signal_file.touch()
    _owned_like(signal_file, old_primary.data_dir)
    # postgresql.auto.conf is read last: this primary_conninfo wins over any earlier one.
    with (old_primary.data_dir / "postgresql.auto.conf").open("a") as conf:
        conninfo = replication_conninfo(new_primary, name).replace("'", "''")
        conf.write(f"primary_conninfo = '{conninfo}'\n")
    old_primary.start()
    wait_streaming(new_primary, name)


def pause_replay(standby: EmbeddedPostgres) -> None:
    """The standby goes on receiving WAL but applies none: its reads see the past."""
    _sql(standby, "SELECT pg_wal_replay_pause()")


def resume_replay(standby: EmbeddedPostgres) -> None:
    _sql(standby, "SELECT pg_wal_replay_resume()")


def wait_caught_up(primary: EmbeddedPostgres, standby: EmbeddedPostgres) -> None:
    """Wait until the standby has applied everything the primary wrote so far."""
    (target,) = _sql(primary, "SELECT pg_current_wal_lsn()")[0]
    query = "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn"
    deadline = time.monotonic() + _SERVER_WAIT
    while not _sql(standby, query, (str(target),))[0][0]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{standby.data_dir} has not replayed up to {target}")
        time.sleep(0.05)


def stall_wal_receiver(standby: EmbeddedPostgres) -> int:
    """Stop the standby's WAL receiver (SIGSTOP: a network stall) and return its pid. Commits on
    an asynchronous primary go on without it, and the standby falls behind by all of them."""
    rows = _sql(standby, "SELECT pid FROM pg_stat_wal_receiver WHERE pid IS NOT NULL")
    assert rows, f"{standby.data_dir} has no WAL receiver"
    pid = int(rows[0][0])
    os.kill(pid, signal.SIGSTOP)
    return pid


def resume_wal_receiver(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


def multi_host_dsn(*servers: EmbeddedPostgres, dbname: str = "postgres", attrs: str = "read-write") -> str:
    """A DSN naming every server, connecting to the one libpq's ``target_session_attrs`` picks
    (``read-write``: only the one that takes writes)."""
    return make_conninfo(
        "",
        host=",".join(str(s.socket_dir) for s in servers),
        port=",".join(str(s.port) for s in servers),
        user="postgres",
        dbname=dbname,
        target_session_attrs=attrs,
    )
