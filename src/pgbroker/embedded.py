"""A private PostgreSQL cluster that pgbroker initialises, starts and reuses when no DSN is given.

The cluster lives in a data directory pgbroker owns and listens on a Unix socket only, never on
TCP, so it cannot collide with (or be mistaken for) a system server on port 5432. Binaries come
from ``PGBROKER_PG_BIN``, else the system's PostgreSQL, else the ``pgserver`` wheel
(``pip install 'pgbroker[embedded]'``). PostgreSQL refuses to run as root, so as root the server
runs as the ``postgres`` user, or as a ``pgbroker`` system user created on first use.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import logging
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = [
    "EmbeddedError",
    "EmbeddedPostgres",
    "EmbeddedStatus",
    "default_data_dir",
    "find_bin_dir",
]

log = logging.getLogger(__name__)

ENV_PG_BIN = "PGBROKER_PG_BIN"
ENV_HOME = "PGBROKER_HOME"
# As root the default must be a path the unprivileged server user can reach: /root is not.
ROOT_DATA_DIR = Path("/var/lib/pgbroker/embedded")
# Where pgserver's binaries are copied when root's site-packages is out of the server user's reach.
ROOT_BIN_CACHE = Path("/var/lib/pgbroker")
SUPERUSER = "postgres"
DATABASE = "postgres"
SERVICE_USER = "pgbroker"
MAX_CONNECTIONS = 200
PORT_RANGE = (20000, 29999)

_TOOLS = ("initdb", "pg_ctl", "postgres")
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


class EmbeddedError(Exception):
    """The embedded cluster cannot be found, started or reached; the message says how to fix it."""


@dataclass(frozen=True)
class EmbeddedStatus:
    """A snapshot of an embedded cluster, as :meth:`EmbeddedPostgres.status` saw it."""

    running: bool
    data_dir: Path
    dsn: str | None
    pid: int | None
    server_version: str | None
    bin_dir: Path | None


@dataclass(frozen=True)
class _RunAs:
    uid: int
    gid: int
    name: str
    home: str


@dataclass(frozen=True)
class _PidFile:
    pid: int
    port: int | None
    socket_dir: str | None
    state: str


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


_NO_BINARIES = (
    "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found: install PostgreSQL "
    "(e.g. `apt-get install postgresql`), or `pip install 'pgbroker[embedded]'` for bundled "
    f"binaries, or set {ENV_PG_BIN} to a bin directory that has them, or set DATABASE_URL "
    "to use an existing server"
)


def find_bin_dir(major: int | None = None, *, data_dir: Path | None = None) -> Path:
    """The first directory holding initdb, pg_ctl and postgres, of the given major if one is given.

    ``data_dir`` only names the cluster in the error raised when no binaries of ``major`` exist.

    ``PGBROKER_PG_BIN`` wins outright; then PATH, the newest ``/usr/lib/postgresql/<ver>/bin``,
    and the ``pgserver`` wheel.
    """
    candidates = _candidate_bin_dirs()
    if not candidates:
        raise EmbeddedError(_NO_BINARIES)
    if major is None:
        return candidates[0]
    for cand in candidates:
        if _major(server_version(cand)) == major:
            return cand
    found = ", ".join(f"{c} (PostgreSQL {server_version(c)})" for c in candidates)
    raise EmbeddedError(
        f"the data directory {data_dir or ''} was initialised by PostgreSQL {major} but only "
        f"{found} was found: "
        f"install PostgreSQL {major} or point {ENV_PG_BIN} at its bin directory, "
        "or use a new data directory"
    )


def _has_tools(d: Path) -> bool:
    return all(os.access(d / t, os.X_OK) and (d / t).is_file() for t in _TOOLS)


def _candidate_bin_dirs() -> list[Path]:
    override = os.environ.get(ENV_PG_BIN)
    if override:
        d = Path(override).expanduser().resolve()
        if not _has_tools(d):
            missing = [t for t in _TOOLS if not os.access(d / t, os.X_OK)]
            raise EmbeddedError(
                f"{ENV_PG_BIN}={override} has no executable {', '.join(missing)}: point it at a "
                "PostgreSQL bin directory, or unset it to search PATH, /usr/lib/postgresql and "
                "the pgserver wheel (`pip install 'pgbroker[embedded]'`); or set DATABASE_URL "
                "to use an existing server"
            )
        return [d]
    found: list[Path] = []

    def add(d: Path) -> None:
        # Debian puts wrapper scripts on PATH; the real tools sit together in one directory.
        d = d.resolve()
        if d not in found and _has_tools(d):
            found.append(d)

    initdb = shutil.which("initdb")
    if initdb:
        add(Path(initdb).resolve().parent)
    versioned = []
    for d in Path("/usr/lib/postgresql").glob("*/bin"):
        m = re.fullmatch(r"(\d+)(?:\.(\d+))?", d.parent.name)
        if m:
            versioned.append(((int(m[1]), int(m[2] or 0)), d))
    for _, d in sorted(versioned, reverse=True):
        add(d)
    # find_spec on a top-level name locates the package without importing it.
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            add(Path(loc) / "pginstall" / "bin")
    return found


@functools.cache
def server_version(bin_dir: Path) -> str:
    """The version of the server in ``bin_dir``, such as ``"15.19"``."""
    try:
        out = subprocess.run(
            [str(bin_dir / "postgres"), "--version"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise EmbeddedError(f"cannot run {bin_dir / 'postgres'} --version: {exc}") from exc
    m = re.search(r"\)\s*(\d+\S*)", out)
    if not m:
        raise EmbeddedError(f"unexpected output from {bin_dir / 'postgres'} --version: {out!r}")
    return m[1]


def _major(version: str) -> int:
    m = re.match(r"\d+", version)
    return int(m[0]) if m else 0


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
                "EmbeddedPostgres(...).start() (pgbroker.dsn.resolve_dsn() does so when no DSN "
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
            run_as = self._run_as()
            bin_dir = self._usable_bin_dir(
                find_bin_dir(self._data_dir_major(), data_dir=self.data_dir), run_as
            )
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
                    f"(pg_ctl exit {res.returncode}): {_output(res)}\n{self._log_tail()}"
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
            if not _is_our_postmaster(pid, self.data_dir):
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

    def _initdb(self, bin_dir: Path, run_as: _RunAs | None) -> None:
        parent = self.data_dir.parent
        parent.mkdir(parents=True, exist_ok=True)
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise EmbeddedError(
                f"{self.data_dir} exists, is not empty and is not a PostgreSQL data directory: "
                "empty it or choose another data directory"
            )
        if run_as is not None:
            _check_reachable(parent, run_as)
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
                    f"initdb for {self.data_dir} failed (exit {res.returncode}): {_output(res)}"
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

    def _write_conf(self, run_as: _RunAs | None) -> None:
        # Rewritten at every start so that a moved data directory gets a matching socket.
        if self.socket_dir != self.data_dir:
            _make_private_dir(self.socket_dir, run_as)
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

    def _read_pid_file(self) -> _PidFile | None:
        try:
            text = (self.data_dir / "postmaster.pid").read_text()
        except FileNotFoundError:
            return None
        except PermissionError as exc:
            raise EmbeddedError(
                f"cannot read {self.data_dir}: it belongs to another user; run as that user "
                "or choose another data directory (PGBROKER_HOME)"
            ) from exc
        return _parse_pid_file(text)

    def _live_pid_file(self) -> _PidFile | None:
        pf = self._read_pid_file()
        if pf is None or not _is_our_postmaster(pf.pid, self.data_dir):
            return None
        return pf

    def _clear_stale(self) -> None:
        """Remove what a killed postmaster left behind, once none of its children remain.

        PostgreSQL clears a stale postmaster.pid itself, but not one whose PID is a zombie
        (an init that does not reap) or was reused by another process; it would refuse to start.
        """
        orphans = self._orphans()
        deadline = time.monotonic() + _ORPHAN_TIMEOUT
        while orphans and time.monotonic() < deadline:
            time.sleep(_POLL)
            orphans = self._orphans()
        if orphans:
            raise EmbeddedError(
                f"processes {sorted(orphans)} of a previous embedded PostgreSQL still use "
                f"{self.data_dir}: stop them, then start again"
            )
        pid_path = self.data_dir / "postmaster.pid"
        pf = self._read_pid_file()
        if pf is not None:
            log.warning("removing stale %s (pid %s is gone)", pid_path, pf.pid)
            pid_path.unlink(missing_ok=True)
        sock_lock = self.socket_dir / f".s.PGSQL.{self.port}.lock"
        try:
            lock_pf = _parse_pid_file(sock_lock.read_text())
        except OSError:
            lock_pf = None
        if lock_pf is not None and not _is_our_postmaster(lock_pf.pid, self.data_dir):
            sock_lock.unlink(missing_ok=True)

    def _orphans(self) -> set[int]:
        """Live server processes working in this data directory (Linux only: /proc)."""
        proc = Path("/proc")
        if not (proc / "self").exists():
            return set()
        try:
            ref = self.data_dir.stat()
        except OSError:
            return set()
        me = os.getpid()
        found: set[int] = set()
        for entry in proc.iterdir():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                cwd = os.stat(entry / "cwd")
                if (cwd.st_dev, cwd.st_ino) != (ref.st_dev, ref.st_ino):
                    continue
                if (entry / "comm").read_text().strip() not in ("postgres", "postmaster"):
                    continue
                if _proc_state(int(entry.name)) in ("Z", "X", "x"):
                    continue
            except OSError:
                continue
            found.add(int(entry.name))
        return found

    def _dsn_from(self, pf: _PidFile) -> str:
        host = pf.socket_dir or str(self.socket_dir)
        port = pf.port or self.port
        return _conninfo(host=host, port=str(port), dbname=DATABASE, user=SUPERUSER)

    # -- users and permissions ---------------------------------------------------------------

    def _run_as(self) -> _RunAs | None:
        if os.geteuid() != 0:
            return None
        # An existing cluster keeps running as whoever owns it.
        try:
            owner = self.data_dir.stat().st_uid
            if owner != 0 and self._initialised():
                return _run_as_entry(pwd.getpwuid(owner))
        except (OSError, KeyError):
            pass
        for name in (SUPERUSER, SERVICE_USER):
            with contextlib.suppress(KeyError):
                return _run_as_entry(pwd.getpwnam(name))
        _create_service_user()
        return _run_as_entry(pwd.getpwnam(SERVICE_USER))

    def _usable_bin_dir(self, bin_dir: Path, run_as: _RunAs | None) -> Path:
        if run_as is None or _first_unreachable(bin_dir, run_as) is None:
            return bin_dir
        spec = importlib.util.find_spec("pgserver")
        roots = spec.submodule_search_locations if spec else None
        if roots and any(bin_dir.is_relative_to(Path(r).resolve()) for r in roots):
            return _copy_install(bin_dir)
        raise EmbeddedError(
            f"the PostgreSQL binaries in {bin_dir} cannot be reached by user {run_as.name} "
            f"({_first_unreachable(bin_dir, run_as)} is not searchable): install PostgreSQL "
            f"system-wide or point {ENV_PG_BIN} at a copy the user can reach"
        )

    def _run(
        self,
        exe: Path,
        args: Sequence[str],
        run_as: _RunAs | None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        log.debug("running %s %s", exe, " ".join(args))
        try:
            return subprocess.run(
                [str(exe), *args],
                capture_output=True,
                text=True,
                env=_child_env(os.environ, run_as),
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


def _parse_pid_file(text: str) -> _PidFile | None:
    # Line 1: pid; 4: port; 5: first socket directory; 8: state (PostgreSQL 10+). The file
    # grows line by line while the server starts, so later fields may be missing.
    lines = text.splitlines()
    if not lines or not lines[0].strip().isdigit():
        return None

    def field(i: int) -> str | None:
        return lines[i].strip() if len(lines) > i and lines[i].strip() else None

    port = field(3)
    return _PidFile(
        pid=int(lines[0].strip()),
        port=int(port) if port and port.isdigit() else None,
        socket_dir=field(4),
        state=field(7) or "starting",
    )


def _proc_state(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name in parentheses may itself contain spaces and parentheses.
    return raw.rsplit(")", 1)[-1].split()[0]


def _is_our_postmaster(pid: int, data_dir: Path) -> bool:
    """Whether ``pid`` is a live process working in ``data_dir`` (not a zombie, not a reused PID)."""
    if pid <= 0:
        return False
    if not Path("/proc/self").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    state = _proc_state(pid)
    if state is None or state in ("Z", "X", "x"):
        return False
    try:
        cwd = os.stat(f"/proc/{pid}/cwd")
        ref = data_dir.stat()
    except OSError:
        # Gone, or another user's process: a postmaster we started would be readable.
        return False
    return (cwd.st_dev, cwd.st_ino) == (ref.st_dev, ref.st_ino)


def _conninfo(**params: str) -> str:
    def quote(v: str) -> str:
        if v and not re.search(r"[\s'\\]", v):
            return v
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"

    return " ".join(f"{k}={quote(v)}" for k, v in params.items())


def _output(res: subprocess.CompletedProcess[str]) -> str:
    return ((res.stderr or "") + (res.stdout or "")).strip() or "(no output)"


def _child_env(environ: Mapping[str, str], run_as: _RunAs | None) -> dict[str, str]:
    # PG* variables (PGDATA, PGPORT, ...) of the caller are meant for its clients, not our server.
    env = {k: v for k, v in environ.items() if not k.startswith("PG")}
    env["LC_MESSAGES"] = "C"
    if run_as is not None:
        env.update(HOME=run_as.home, USER=run_as.name, LOGNAME=run_as.name)
    return env


def _run_as_entry(pw: pwd.struct_passwd) -> _RunAs:
    return _RunAs(uid=pw.pw_uid, gid=pw.pw_gid, name=pw.pw_name, home=pw.pw_dir)


def _create_service_user() -> None:
    useradd = shutil.which("useradd", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if useradd is None:
        raise EmbeddedError(
            "PostgreSQL cannot run as root and neither a 'postgres' nor a 'pgbroker' user "
            "exists (no useradd to create one): create one of them, or run as a normal user"
        )
    res = subprocess.run(
        [
            useradd,
            "--system",
            "--user-group",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            SERVICE_USER,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        pwd.getpwnam(SERVICE_USER)  # another process may have created it meanwhile
    except KeyError:
        raise EmbeddedError(
            f"cannot create the system user {SERVICE_USER!r} to run PostgreSQL as: {_output(res)}"
        ) from None
    log.info("created system user %s to run the embedded PostgreSQL", SERVICE_USER)


def _first_unreachable(path: Path, run_as: _RunAs) -> Path | None:
    """The first existing directory from ``/`` down to ``path`` that ``run_as`` cannot enter."""
    for d in [*reversed(path.parents), path]:
        try:
            st = d.stat()
        except FileNotFoundError:
            return None
        if st.st_uid == run_as.uid:
            bit = stat.S_IXUSR
        elif st.st_gid == run_as.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return d
    return None


def _check_reachable(path: Path, run_as: _RunAs) -> None:
    blocked = _first_unreachable(path, run_as)
    if blocked is not None:
        raise EmbeddedError(
            f"user {run_as.name}, which runs the embedded PostgreSQL (it refuses to run as root), "
            f"cannot enter {blocked}: choose a data directory it can reach (PGBROKER_HOME, "
            f"default {ROOT_DATA_DIR} for root) or `chmod o+x {blocked}`"
        )


def _make_private_dir(d: Path, run_as: _RunAs | None) -> None:
    """Create (or accept) a 0700 directory owned by the server user; refuse anything else."""
    with contextlib.suppress(FileExistsError):
        d.mkdir(mode=0o700)
        if run_as is not None:
            os.chown(d, run_as.uid, run_as.gid)
    st = d.lstat()
    owner = run_as.uid if run_as is not None else os.geteuid()
    # It lives in /tmp: anyone could have made it first, to watch or spoof our socket.
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != owner or st.st_mode & 0o077:
        raise EmbeddedError(
            f"socket directory {d} exists but is not a private (0700) directory of uid {owner}: "
            "remove it and start again"
        )


def _copy_install(bin_dir: Path) -> Path:
    """Copy pgserver's install to where the unprivileged server user can reach it.

    Its binaries find libpq through an RPATH relative to themselves
    (``$ORIGIN/../../../pgserver.libs``), so the copy keeps the wheel's layout:
    ``<dest>/pgserver/pginstall/{bin,lib,share}`` beside ``<dest>/pgserver.libs``.
    """
    install = bin_dir.parent
    package = install.parent
    libs = package.parent / f"{package.name}.libs"
    tag = hashlib.sha256(str(install).encode()).hexdigest()[:10]
    dest = ROOT_BIN_CACHE / f"pginstall-{server_version(bin_dir)}-{tag}"
    dest_bin = dest / package.name / install.name / bin_dir.name
    done = dest / ".complete"
    if done.exists() and _has_tools(dest_bin):
        return dest_bin
    ROOT_BIN_CACHE.mkdir(parents=True, exist_ok=True)
    os.chmod(ROOT_BIN_CACHE, 0o755)
    with open(ROOT_BIN_CACHE / ".pginstall.lock", "ab") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        if not (done.exists() and _has_tools(dest_bin)):
            tmp = dest.with_name(dest.name + f".tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(install, tmp / package.name / install.name, symlinks=True)
            if libs.is_dir():
                shutil.copytree(libs, tmp / libs.name, symlinks=True)
            for d in (tmp, tmp / package.name):
                os.chmod(d, 0o755)
            shutil.rmtree(dest, ignore_errors=True)
            os.rename(tmp, dest)
            done.touch()
            log.info("copied PostgreSQL binaries from %s to %s for the server user", install, dest)
    return dest_bin
