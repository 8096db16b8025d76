"""A private PostgreSQL cluster that pgbroker initialises, starts and reuses when no DSN is given:
its lifecycle (initdb, start, stop, status) under a lock file, its configuration and its log.

The cluster lives in a data directory pgbroker owns and listens on a Unix socket only, never on
TCP, so it cannot collide with (or be mistaken for) a system server on port 5432. The binaries
come from pgbroker.embedded.binaries; as root, the server runs as the user
pgbroker.embedded.server_user picks.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pgbroker.embedded.binaries import find_bin_dir, server_version
from pgbroker.embedded.errors import EmbeddedError, command_output
from pgbroker.embedded.processes import PidFile, is_our_postmaster, orphans, parse_pid_file
from pgbroker.embedded.server_user import (
    ROOT_DATA_DIR,
    RunAs,
    check_reachable,
    child_env,
    make_private_dir,
    run_as_for,
    usable_bin_dir,
)

__all__ = ["ENV_HOME", "PORT_RANGE", "EmbeddedPostgres", "EmbeddedStatus", "default_data_dir"]

log = logging.getLogger("pgbroker.embedded")

ENV_HOME = "PGBROKER_HOME"
SUPERUSER = "postgres"
DATABASE = "postgres"
MAX_CONNECTIONS = 200
PORT_RANGE = (20000, 29999)

_CONF_FILE = "pgbroker.conf"
_INCLUDE_LINE = f"include_if_exists = '{_CONF_FILE}'"
_LOG_FILE = "postgres.log"
_LOG_KEEP_BYTES = 10 * 1024 * 1024
# sun_path holds 108 bytes including the terminating NUL.
_SOCKET_PATH_MAX = 107
# Paths made of these need no quoting in postgresql.conf, in a directory list, or in a conninfo.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9_./+@:=-]+")
_START_TIMEOUT = 60.0
_STOP_TIMEOUT = 60.0
_LOCK_TIMEOUT = 120.0
# After a postmaster is killed its children notice within milliseconds; allow for a loaded host.
_ORPHAN_TIMEOUT = 15.0
_POLL = 0.02


@dataclass(frozen=True)
class EmbeddedStatus:
    """A snapshot of an embedded cluster, as :meth:`EmbeddedPostgres.status` saw it."""

    running: bool
    data_dir: Path
    dsn: str | None
    pid: int | None
    server_version: str | None
    bin_dir: Path | None


def default_data_dir() -> Path:
    """The data directory used when none is given: ``$PGBROKER_HOME/embedded``, else per user."""
    home = os.environ.get(ENV_HOME)
    if home:
        return Path(home).expanduser().resolve() / "embedded"
    if os.geteuid() == 0:
        return ROOT_DATA_DIR
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "pgbroker" / "embedded"


class EmbeddedPostgres:
    """A private cluster in ``data_dir``: created on first start, then started or reused.

    Every method is safe to call from several threads and processes at once: start, stop and
    restart serialise on a lock file beside the data directory.
    """

    def __init__(self, data_dir: Path | None = None) -> None:
        self.data_dir: Path = (data_dir or default_data_dir()).expanduser().resolve()
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()
        # A port per data directory keeps socket file names apart from a system server's
        # (.s.PGSQL.5432) even in a shared socket directory.
        lo, hi = PORT_RANGE
        self.port: int = lo + int(digest[:8], 16) % (hi - lo + 1)
        in_data_dir = str(self.data_dir / f".s.PGSQL.{self.port}")
        if len(in_data_dir) <= _SOCKET_PATH_MAX and _PLAIN_PATH.fullmatch(str(self.data_dir)):
            self.socket_dir: Path = self.data_dir
        else:
            self.socket_dir = Path("/tmp") / f"pgbroker-{digest[:16]}"
        self.log_file: Path = self.data_dir / _LOG_FILE
        self._lock_path = self.data_dir.parent / f".{self.data_dir.name}.lock"

    def __repr__(self) -> str:
        return f"EmbeddedPostgres(data_dir={str(self.data_dir)!r})"

    # -- public API --------------------------------------------------------------------------

    def start(self) -> str:
        """Initialise the cluster if the directory is new, start it if stopped; return its DSN."""
        with self._locked():
            return self._start_locked()

    def stop(self) -> bool:
        """Fast shutdown (open sessions are cut). False when it was not running."""
        with self._locked():
            return self._stop_locked()

    def restart(self) -> str:
        """Stop (if running) and start again; return the DSN."""
        with self._locked():
            self._stop_locked()
            return self._start_locked()

    def dsn(self) -> str:
        """The conninfo of the running cluster (database ``postgres``, host = socket directory)."""
        pf = self._live_pid_file()
        if pf is None:
            raise EmbeddedError(
                f"the embedded PostgreSQL in {self.data_dir} is not running: start it with "
                "EmbeddedPostgres(...).start() (pgbroker._db.dsn.resolve_dsn() does so when no DSN "
                "is given), or set DATABASE_URL to use another server"
            )
        return self._dsn_from(pf)

    def status(self) -> EmbeddedStatus:
        """Whether the cluster runs, and where; never starts anything."""
        pf = self._live_pid_file()
        try:
            bin_dir: Path | None = find_bin_dir(self._data_dir_major(), data_dir=self.data_dir)
            version: str | None = server_version(bin_dir)
        except EmbeddedError:
            bin_dir, version = None, None
        return EmbeddedStatus(
            running=pf is not None,
            data_dir=self.data_dir,
            dsn=self._dsn_from(pf) if pf else None,
            pid=pf.pid if pf else None,
            server_version=version,
            bin_dir=bin_dir,
        )

    # -- start / stop ------------------------------------------------------------------------

    def _start_locked(self) -> str:
        try:
            pf = self._live_pid_file()
            if pf is not None and self._wait_ready():
                pf = self._live_pid_file() or pf
                log.debug("reusing embedded PostgreSQL pid %s in %s", pf.pid, self.data_dir)
                return self._dsn_from(pf)
            if pf is not None:
                # Still alive but never became ready (for example, shutting down): wait it out.
                self._wait_exit(pf.pid, _STOP_TIMEOUT)
            run_as = run_as_for(self.data_dir, self._initialised())
            bin_dir = usable_bin_dir(find_bin_dir(self._data_dir_major(), data_dir=self.data_dir), run_as)
            if not self._initialised():
                self._initdb(bin_dir, run_as)
            self._clear_stale()
            self._write_conf(run_as)
            self._rotate_log()
            t0 = time.monotonic()
            args = ["start", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-s"]
            res = self._run(bin_dir / "pg_ctl", [*args, "-t", str(int(_START_TIMEOUT))], run_as)
            if res.returncode != 0:
                raise EmbeddedError(
                    f"embedded PostgreSQL in {self.data_dir} did not start "
                    f"(pg_ctl exit {res.returncode}): {command_output(res)}\n{self._log_tail()}"
                )
            pf = self._live_pid_file()
            if pf is None:
                raise EmbeddedError(
                    f"embedded PostgreSQL in {self.data_dir} exited right after starting\n{self._log_tail()}"
                )
            log.info(
                "started embedded PostgreSQL pid %s in %s (%.2f s)",
                pf.pid,
                self.data_dir,
                time.monotonic() - t0,
            )
            return self._dsn_from(pf)
        except OSError as exc:
            raise EmbeddedError(f"cannot start embedded PostgreSQL in {self.data_dir}: {exc}") from exc

    def _stop_locked(self) -> bool:
        pf = self._live_pid_file()
        if pf is None:
            return False
        # SIGINT is what `pg_ctl stop -m fast` sends; signalling directly needs no binaries.
        try:
            os.kill(pf.pid, signal.SIGINT)
        except ProcessLookupError:
            return False
        except PermissionError as exc:
            raise EmbeddedError(
                f"cannot stop embedded PostgreSQL pid {pf.pid} in {self.data_dir}: it belongs "
                "to another user; stop it as that user"
            ) from exc
        if not self._wait_exit(pf.pid, _STOP_TIMEOUT):
            raise EmbeddedError(
                f"embedded PostgreSQL pid {pf.pid} in {self.data_dir} did not stop within "
                f"{_STOP_TIMEOUT:.0f} s\n{self._log_tail()}"
            )
        if self.socket_dir != self.data_dir:
            # Only an empty directory goes: one left in /tmp per cluster ever started adds up.
            with contextlib.suppress(OSError):
                self.socket_dir.rmdir()
        log.info("stopped embedded PostgreSQL pid %s in %s", pf.pid, self.data_dir)
        return True

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            pf = self._live_pid_file()
            if pf is None:
                return False
            if pf.state in ("ready", "standby"):
                return True
            if pf.state == "stopping":
                return False
            time.sleep(_POLL)
        return False

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not is_our_postmaster(pid, self.data_dir):
                return True
            time.sleep(_POLL)
        return False

    # -- data directory ----------------------------------------------------------------------

    def _initialised(self) -> bool:
        return (self.data_dir / "PG_VERSION").is_file()

    def _data_dir_major(self) -> int | None:
        try:
            return int((self.data_dir / "PG_VERSION").read_text().strip())
        except (OSError, ValueError):
            return None

    def _initdb(self, bin_dir: Path, run_as: RunAs | None) -> None:
        parent = self.data_dir.parent
        parent.mkdir(parents=True, exist_ok=True)
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise EmbeddedError(
                f"{self.data_dir} exists, is not empty and is not a PostgreSQL data directory: "
                "empty it or choose another data directory"
            )
        if run_as is not None:
            check_reachable(parent, run_as)
        # initdb into a sibling and rename, so a crash mid-way never leaves a half-made cluster
        # where the next start would find it.
        for leftover in parent.glob(f".{self.data_dir.name}.initdb-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = parent / f".{self.data_dir.name}.initdb-{os.getpid()}"
        tmp.mkdir(mode=0o700)
        try:
            if run_as is not None:
                os.chown(tmp, run_as.uid, run_as.gid)
            t0 = time.monotonic()
            # --no-sync: fsyncing every new file doubles initdb's time on disk (2.1 s -> 4.3 s
            # here), and a machine crash in the next seconds can only lose an empty cluster.
            res = self._run(
                bin_dir / "initdb",
                [
                    "-D",
                    str(tmp),
                    "--no-sync",
                    "-A",
                    "trust",
                    "-U",
                    SUPERUSER,
                    "-E",
                    "UTF8",
                    "--locale=C",
                ],
                run_as,
                cwd=tmp,
            )
            if res.returncode != 0:
                raise EmbeddedError(
                    f"initdb for {self.data_dir} failed (exit {res.returncode}): {command_output(res)}"
                )
            with (tmp / "postgresql.conf").open("a") as f:
                f.write("\n# pgbroker: socket, port and limits of the embedded cluster\n")
                f.write(f"{_INCLUDE_LINE}\n")
            if self.data_dir.exists():
                self.data_dir.rmdir()
            os.rename(tmp, self.data_dir)
            log.info(
                "initialised embedded PostgreSQL in %s (%.2f s)",
                self.data_dir,
                time.monotonic() - t0,
            )
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _write_conf(self, run_as: RunAs | None) -> None:
        # Rewritten at every start so that a moved data directory gets a matching socket.
        if self.socket_dir != self.data_dir:
            make_private_dir(self.socket_dir, run_as)
        text = (
            "# Written by pgbroker at every start of this embedded cluster; edits are lost.\n"
            "# Use ALTER SYSTEM (postgresql.auto.conf, read after this file) to override.\n"
            "listen_addresses = ''\n"
            f"port = {self.port}\n"
            f"unix_socket_directories = '{self.socket_dir}'\n"
            "unix_socket_permissions = 0700\n"
            f"max_connections = {MAX_CONNECTIONS}\n"
        )
        conf = self.data_dir / "postgresql.conf"
        if _INCLUDE_LINE not in conf.read_text():
            with conf.open("a") as f:
                f.write(f"\n{_INCLUDE_LINE}\n")
        target = self.data_dir / _CONF_FILE
        tmp = target.with_name(f".{_CONF_FILE}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if run_as is not None:
            os.chown(tmp, run_as.uid, run_as.gid)
        os.replace(tmp, target)

    def _rotate_log(self) -> None:
        try:
            if self.log_file.stat().st_size > _LOG_KEEP_BYTES:
                os.replace(self.log_file, self.log_file.with_name(_LOG_FILE + ".1"))
        except FileNotFoundError:
            pass

    def _log_tail(self, lines: int = 25) -> str:
        try:
            with self.log_file.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 16384))
                tail = f.read().decode(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"(no server log at {self.log_file})"
        return f"last lines of {self.log_file}:\n" + "\n".join(tail)

    # -- processes ---------------------------------------------------------------------------

    def _read_pid_file(self) -> PidFile | None:
        try:
            text = (self.data_dir / "postmaster.pid").read_text()
        except FileNotFoundError:
            return None
        except PermissionError as exc:
            raise EmbeddedError(
                f"cannot read {self.data_dir}: it belongs to another user; run as that user "
                "or choose another data directory (PGBROKER_HOME)"
            ) from exc
        return parse_pid_file(text)

    def _live_pid_file(self) -> PidFile | None:
        pf = self._read_pid_file()
        if pf is None or not is_our_postmaster(pf.pid, self.data_dir):
            return None
        return pf

    def _clear_stale(self) -> None:
        """Remove what a killed postmaster left behind, once none of its children remain.

        PostgreSQL clears a stale postmaster.pid itself, but not one whose PID is a zombie
        (an init that does not reap) or was reused by another process; it would refuse to start.
        """
        left = orphans(self.data_dir)
        deadline = time.monotonic() + _ORPHAN_TIMEOUT
        while left and time.monotonic() < deadline:
            time.sleep(_POLL)
            left = orphans(self.data_dir)
        if left:
            raise EmbeddedError(
                f"processes {sorted(left)} of a previous embedded PostgreSQL still use "
                f"{self.data_dir}: stop them, then start again"
            )
        pid_path = self.data_dir / "postmaster.pid"
        pf = self._read_pid_file()
        if pf is not None:
            log.warning("removing stale %s (pid %s is gone)", pid_path, pf.pid)
            pid_path.unlink(missing_ok=True)
        sock_lock = self.socket_dir / f".s.PGSQL.{self.port}.lock"
        try:
            lock_pf = parse_pid_file(sock_lock.read_text())
        except OSError:
            lock_pf = None
        if lock_pf is not None and not is_our_postmaster(lock_pf.pid, self.data_dir):
            sock_lock.unlink(missing_ok=True)

    def _dsn_from(self, pf: PidFile) -> str:
        host = pf.socket_dir or str(self.socket_dir)
        port = pf.port or self.port
        return _conninfo(host=host, port=str(port), dbname=DATABASE, user=SUPERUSER)

    # -- users and permissions ---------------------------------------------------------------

    def _run(
        self,
        exe: Path,
        args: Sequence[str],
        run_as: RunAs | None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        log.debug("running %s %s", exe, " ".join(args))
        try:
            return subprocess.run(
                [str(exe), *args],
                capture_output=True,
                text=True,
                env=child_env(os.environ, run_as),
                # The server user may not be able to enter our working directory.
                cwd=cwd or self.data_dir,
                # The postmaster outlives us and must not get our terminal's Ctrl-C.
                start_new_session=True,
                user=run_as.uid if run_as else None,
                group=run_as.gid if run_as else None,
                extra_groups=[] if run_as else None,
                check=False,
            )
        except OSError as exc:
            raise EmbeddedError(f"cannot run {exe}: {exc}") from exc

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self._lock_path.parent.mkdir(parents=True, exist_ok=True)
            f: IO[bytes] = open(self._lock_path, "ab")  # noqa: SIM115 - held across the block
        except OSError as exc:
            raise EmbeddedError(
                f"cannot create the lock file {self._lock_path}: {exc}; choose a data directory "
                f"in a writable place ({ENV_HOME})"
            ) from exc
        with f:
            deadline = time.monotonic() + _LOCK_TIMEOUT
            while True:
                try:
                    # flock, unlike fcntl record locks, also excludes threads of one process
                    # that open the file separately.
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise EmbeddedError(
                            f"another process has held {self._lock_path} for over "
                            f"{_LOCK_TIMEOUT:.0f} s: is a start or stop hanging?"
                        ) from None
                    time.sleep(_POLL)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# -- helpers -----------------------------------------------------------------------------------


# -- helpers -----------------------------------------------------------------------------------


def _conninfo(**params: str) -> str:
    def quote(v: str) -> str:
        if v and not re.search(r"[\s'\\]", v):
            return v
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"

    return " ".join(f"{k}={quote(v)}" for k, v in params.items())
