"""Ship pgbroker to Spark's executors, so that the jobs run on a cluster whose machines do not
share this one's files: a zip of the installed package, added with SparkContext.addPyFile.

The zip holds the package as it is installed here (its .py and .sql files), so driver and
executors run the same code. Its dependencies (psycopg, psycopg-pool, pyarrow, numpy) are compiled and
cannot travel in a zip: they must be installed on the executors' Python, or shipped as a packed
environment (spark-submit --archives env.tar.gz#env, with PYSPARK_PYTHON=./env/bin/python).
check_executors says which one is missing, from an executor.
"""

from __future__ import annotations

import importlib.metadata
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

from pgbroker.spark.requirements import MissingRequirement

# What a task needs besides pgbroker itself.
EXECUTOR_MODULES = ("psycopg", "psycopg_pool", "pyarrow", "numpy")


def build_zip(directory: Path | None = None) -> Path:
    """Write pgbroker-<version>.zip (the package, importable from the zip) and return its path."""
    # Found from here rather than by importing pgbroker, whose __init__ imports the public API
    # (clients, worker runtime): the import boundaries keep Spark apart from the worker runtime.
    package = Path(__file__).resolve().parents[1]
    target_dir = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="pgbroker-ship-"))
    target = target_dir / zip_name()
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package.rglob("*")):
            if (
                path.is_file()
                and path.suffix in (".py", ".sql", ".typed")
                and "__pycache__" not in path.parts
            ):
                archive.write(path, Path("pgbroker") / path.relative_to(package))
    return target


def zip_name() -> str:
    return f"pgbroker-{_version()}.zip"


def _version() -> str:
    try:
        return importlib.metadata.version("pgbroker")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "dev"


def ship(spark: Any) -> Path | None:
    """Add pgbroker to every executor's Python path for this SparkSession, unless a zip of the
    same name is there already (spark-submit --py-files pgbroker-x.y.z.zip): Spark refuses a
    second file of the same name from another path. Returns the zip added, if any."""
    context = spark.sparkContext
    if any(PurePosixPath(urlparse(added).path).name == zip_name() for added in context.listFiles):
        return None
    path = build_zip()
    context.addPyFile(str(path))
    return path


def check_executors(spark: Any) -> None:
    """Fail with a clear message when an executor cannot import what the tasks need."""
    modules = (*EXECUTOR_MODULES, "pgbroker.spark.source")

    # Nested, so that it travels by value: a module-level function would make the executor
    # import this module (and so psycopg) just to unpickle the probe.
    def probe(_: Any) -> list[str]:
        import importlib

        missing = []
        for name in modules:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                missing.append(f"{name} ({exc})")
        return missing

    missing = spark.sparkContext.parallelize([0], 1).flatMap(probe).collect()
    if missing:
        raise MissingRequirement(
            "an executor cannot import " + ", ".join(sorted(set(missing))),
            hint="Install pgbroker[spark] in the executors' Python (PYSPARK_PYTHON), or ship a packed "
            "environment with --archives; see docs/spark.md.",
        )
