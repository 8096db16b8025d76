"""Running the server as an unprivileged user when pgbroker runs as root, as PostgreSQL demands:
the ``postgres`` user, else a ``pgbroker`` system user created on first use; the directories and
binaries that user must reach, and the environment its commands get.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import pwd
import shutil
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pgbroker.embedded.binaries import ENV_PG_BIN, has_tools, pgserver_locations, server_version
from pgbroker.embedded.errors import EmbeddedError, command_output

__all__ = [
    "ROOT_DATA_DIR",
    "RunAs",
    "check_reachable",
    "child_env",
    "make_private_dir",
    "run_as_for",
    "usable_bin_dir",
]

log = logging.getLogger("pgbroker.embedded")

# As root the default must be a path the unprivileged server user can reach: /root is not.
ROOT_DATA_DIR = Path("/var/lib/pgbroker/embedded")
# Where pgserver's binaries are copied when root's site-packages is out of the server user's reach.
ROOT_BIN_CACHE = Path("/var/lib/pgbroker")
# The system user Debian's PostgreSQL packages create, else the one pgbroker creates.
POSTGRES_USER = "postgres"
SERVICE_USER = "pgbroker"


@dataclass(frozen=True)
class RunAs:
    uid: int
    gid: int
    name: str
    home: str


def run_as_for(data_dir: Path, initialised: bool) -> RunAs | None:
    """Whom the server in ``data_dir`` runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    # An existing cluster keeps running as whoever owns it.
    try:
        owner = data_dir.stat().st_uid
        if owner != 0 and initialised:
            return _run_as_entry(pwd.getpwuid(owner))
    except (OSError, KeyError):
        pass
    for name in (POSTGRES_USER, SERVICE_USER):
        with contextlib.suppress(KeyError):
            return _run_as_entry(pwd.getpwnam(name))
    _create_service_user()
    return _run_as_entry(pwd.getpwnam(SERVICE_USER))


def usable_bin_dir(bin_dir: Path, run_as: RunAs | None) -> Path:
    """``bin_dir``, or a copy of a pgserver install that ``run_as`` can reach."""
    if run_as is None or _first_unreachable(bin_dir, run_as) is None:
        return bin_dir
    if any(bin_dir.is_relative_to(location.resolve()) for location in pgserver_locations()):
        return _copy_install(bin_dir)
    raise EmbeddedError(
        f"the PostgreSQL binaries in {bin_dir} cannot be reached by user {run_as.name} "
        f"({_first_unreachable(bin_dir, run_as)} is not searchable): install PostgreSQL "
        f"system-wide or point {ENV_PG_BIN} at a copy the user can reach"
    )


def child_env(environ: Mapping[str, str], run_as: RunAs | None) -> dict[str, str]:
    # PG* variables (PGDATA, PGPORT, ...) of the caller are meant for its clients, not our server.
    env = {k: v for k, v in environ.items() if not k.startswith("PG")}
    env["LC_MESSAGES"] = "C"
    if run_as is not None:
        env.update(HOME=run_as.home, USER=run_as.name, LOGNAME=run_as.name)
    return env


def _run_as_entry(pw: pwd.struct_passwd) -> RunAs:
    return RunAs(uid=pw.pw_uid, gid=pw.pw_gid, name=pw.pw_name, home=pw.pw_dir)


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
            f"cannot create the system user {SERVICE_USER!r} to run PostgreSQL as: {command_output(res)}"
        ) from None
    log.info("created system user %s to run the embedded PostgreSQL", SERVICE_USER)


def _first_unreachable(path: Path, run_as: RunAs) -> Path | None:
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


def check_reachable(path: Path, run_as: RunAs) -> None:
    blocked = _first_unreachable(path, run_as)
    if blocked is not None:
        raise EmbeddedError(
            f"user {run_as.name}, which runs the embedded PostgreSQL (it refuses to run as root), "
            f"cannot enter {blocked}: choose a data directory it can reach (PGBROKER_HOME, "
            f"default {ROOT_DATA_DIR} for root) or `chmod o+x {blocked}`"
        )


def make_private_dir(d: Path, run_as: RunAs | None) -> None:
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
    if done.exists() and has_tools(dest_bin):
        return dest_bin
    ROOT_BIN_CACHE.mkdir(parents=True, exist_ok=True)
    os.chmod(ROOT_BIN_CACHE, 0o755)
    with open(ROOT_BIN_CACHE / ".pginstall.lock", "ab") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        if not (done.exists() and has_tools(dest_bin)):
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
