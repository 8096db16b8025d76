"""What the pipeline needs before Spark starts, checked up front so that a missing piece is named
with its fix, instead of surfacing as a Java stack trace or a Python worker that "crashed".
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
from pathlib import Path

from pgbroker.errors import PgbrokerError

MIN_PYSPARK = (4, 2)  # latestOffset(start, limit): admission control for Python sources
MIN_JAVA = 17
INSTALL_HINT = "pip install 'pgbroker[spark]' (pyspark, pyarrow and matplotlib) in the Python that runs Spark"
JAVA_HINT = (
    "Install Java 17 or 21 (Debian/Ubuntu: apt-get install openjdk-17-jre-headless; "
    "macOS: brew install openjdk@17) or point JAVA_HOME at one."
)


class MissingRequirement(PgbrokerError):
    """Something the Spark pipeline needs is not installed; the hint says how to get it."""


def check_python_packages() -> None:
    """pyspark (recent enough) and pyarrow are importable here."""
    for module, why in (
        ("pyspark", "the pgbroker pipeline runs on Apache Spark"),
        ("pyarrow", "the pgbroker data source exchanges data with Spark as Arrow record batches"),
    ):
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingRequirement(f"{module} is not installed: {why}", hint=INSTALL_HINT) from None
    version = _version_tuple(importlib.metadata.version("pyspark"))
    if version < MIN_PYSPARK:
        raise MissingRequirement(
            f"pyspark {'.'.join(map(str, version))} is too old: the pgbroker data source needs "
            f">= {'.'.join(map(str, MIN_PYSPARK))}",
            hint=INSTALL_HINT,
        )


def java_executable() -> Path | None:
    """The java that Spark will start: $JAVA_HOME/bin/java, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None
    found = shutil.which("java")
    return Path(found) if found else None


def check_java() -> None:
    """A Java runtime new enough for Spark 4 is there."""
    java = java_executable()
    if java is None:
        where = (
            f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/java"
            if os.environ.get("JAVA_HOME")
            else ("no java on PATH and JAVA_HOME is not set")
        )
        raise MissingRequirement(f"Spark needs a Java runtime: {where}", hint=JAVA_HINT)
    try:
        result = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError as exc:
        raise MissingRequirement(f"cannot run {java}: {exc}", hint=JAVA_HINT) from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
    if result.returncode != 0 or match is None:
        raise MissingRequirement(f"{java} -version failed: {result.stderr.strip()[:200]}", hint=JAVA_HINT)
    major = int(match[1]) if match[1] != "1" else int(match[2] or 0)
    if major < MIN_JAVA:
        raise MissingRequirement(
            f"{java} is Java {major}; Spark 4 needs Java {MIN_JAVA} or newer", hint=JAVA_HINT
        )


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])
