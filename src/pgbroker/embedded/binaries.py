"""Finding PostgreSQL's server binaries (initdb, pg_ctl, postgres): ``PGBROKER_PG_BIN``, else the
system's (PATH, ``/usr/lib/postgresql/<version>/bin``), else the ``pgserver`` wheel
(``pip install 'pgbroker[embedded]'``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from pgbroker.embedded.errors import EmbeddedError

__all__ = ["ENV_PG_BIN", "find_bin_dir", "has_tools", "pgserver_locations", "server_version"]

ENV_PG_BIN = "PGBROKER_PG_BIN"

_TOOLS = ("initdb", "pg_ctl", "postgres")

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


def has_tools(d: Path) -> bool:
    """Whether ``d`` holds executable initdb, pg_ctl and postgres."""
    return all(os.access(d / t, os.X_OK) and (d / t).is_file() for t in _TOOLS)


def _candidate_bin_dirs() -> list[Path]:
    override = os.environ.get(ENV_PG_BIN)
    if override:
        d = Path(override).expanduser().resolve()
        if not has_tools(d):
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
        if d not in found and has_tools(d):
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
    for location in pgserver_locations():
        add(location / "pginstall" / "bin")
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


def pgserver_locations() -> list[Path]:
    """Where the pgserver wheel is installed (none when it is not)."""
    # find_spec on a top-level name locates the package without importing it.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(loc) for loc in spec.submodule_search_locations]
