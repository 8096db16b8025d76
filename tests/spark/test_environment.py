"""What the pipeline needs from its environment: clear errors (with the fix) for a missing pyarrow
or Java, through `pgbroker pipeline` as a user runs it; and the zip that ships pgbroker to
executors."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pgbroker._sql import new_install
from pgbroker.errors import PgbrokerError
from pgbroker.spark.connect import CANNOT_CONNECT, open_connection
from pgbroker.spark.shipping import build_zip

# Never reached: every case fails before it would connect.
NOWHERE = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2"


def pipeline(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgbroker.cli", "--dsn", NOWHERE, "pipeline", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )


def test_help_lists_the_jobs() -> None:
    done = pipeline("--help", env={})
    assert done.returncode == 0
    for job in ("drain", "route", "archive-report"):
        assert job in done.stdout


def test_missing_java_says_how_to_install_it() -> None:
    done = pipeline("drain", "orders", "--output", "/tmp/unused", env={"JAVA_HOME": "/nonexistent/jdk"})
    assert done.returncode == 5, done.stderr
    assert "error: Spark needs a Java runtime: JAVA_HOME=/nonexistent/jdk has no bin/java" in done.stderr
    assert "apt-get install openjdk-17-jre-headless" in done.stderr


def test_missing_pyarrow_says_how_to_install_it(tmp_path: Path) -> None:
    # A pyarrow that cannot be imported, ahead of the real one on the path.
    (tmp_path / "pyarrow").mkdir()
    (tmp_path / "pyarrow" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    done = pipeline("drain", "orders", "--output", "/tmp/unused", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 5, done.stderr
    assert (
        "error: pyarrow is not installed: the pgbroker data source exchanges data with Spark" in done.stderr
    )
    assert "pip install 'pgbroker[spark]'" in done.stderr


def test_an_unreachable_database_is_named() -> None:
    done = pipeline("drain", "orders", "--output", "/tmp/unused", env={})
    assert done.returncode == 5, done.stderr
    assert "cannot connect to the database" in done.stderr


def test_a_password_libpq_misreads_is_not_in_the_error() -> None:
    # An unencoded % in the password: libpq quoted the token, and the raw psycopg error went to
    # the executor's and the driver's logs.
    with pytest.raises(PgbrokerError) as failed:
        open_connection("postgresql://app:Xy7Q%zzZr8W@127.0.0.1:1/db", role="reader")
    assert str(failed.value).startswith(CANNOT_CONNECT)
    assert "Xy7Q" not in str(failed.value)
    assert failed.value.__cause__ is None


def test_the_shipped_zip_is_the_whole_package(tmp_path: Path) -> None:
    path = build_zip(tmp_path)
    names = set(zipfile.ZipFile(path).namelist())
    assert {"pgbroker/__init__.py", "pgbroker/spark/source.py", "pgbroker/_sql/queries/queues.sql"} <= names
    assert {f"pgbroker/_sql/{f.name}" for f in new_install()} <= names
    # Importable from the zip alone (its dependencies come from this environment).
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import pgbroker.spark.source, pgbroker._sql; "
        "assert pgbroker.__file__.startswith(sys.argv[1]), pgbroker.__file__; "
        "print(len(pgbroker._sql.new_install()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(len(new_install()))
