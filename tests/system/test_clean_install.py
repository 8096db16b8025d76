"""`pip install pgbroker` with no extras, as a new user gets it: a wheel of this tree in a fresh
virtualenv gives a working client and CLI, and each command whose extra is missing says which
`pip install 'pgbroker[...]'` to run.

The wheel is built once per module from the tracked files (the generated sync twins among them) and
installed without extras; its two dependencies come from pip's usual sources.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


class BareInstall:
    """A virtualenv holding pgbroker's wheel and nothing of its extras."""

    def __init__(self, wheel: Path, env_dir: Path) -> None:
        self.wheel = wheel
        self.python = env_dir / "bin" / "python"
        self.pgbroker = env_dir / "bin" / "pgbroker"

    def cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.pgbroker), *args], input=stdin, capture_output=True, text=True, timeout=120, check=False
        )

    def python_code(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.python), "-c", code], capture_output=True, text=True, timeout=120, check=False
        )


def _pip(python: Path | str, *args: str) -> None:
    done = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"pip {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> BareInstall:
    work = tmp_path_factory.mktemp("clean-install")
    # From a copy of the tracked files, as a fresh clone would have them: the committed sync twins,
    # no build directory or egg-info left by the editable install of the test run.
    tree = work / "tree"
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True)
    tree.mkdir()
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    # The working tree's own changes count too (an uncommitted file under test).
    for changed in _changed_files():
        target = tree / changed
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((ROOT / changed).read_bytes())
    assert (tree / "src/pgbroker/queues/_client.py").exists(), "a fresh clone has the sync client"
    _pip(sys.executable, "wheel", "--no-deps", "-w", str(work / "dist"), str(tree))
    (wheel,) = (work / "dist").glob("pgbroker-*.whl")
    env_dir = work / "venv"
    venv.create(env_dir, with_pip=True)
    _pip(env_dir / "bin" / "python", "install", str(wheel))
    return BareInstall(wheel, env_dir)


def _changed_files() -> list[str]:
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--modified", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    )
    return [name for name in listed.stdout.splitlines() if (ROOT / name).is_file()]


def test_the_wheel_carries_the_generated_client_and_every_data_file(bare: BareInstall) -> None:
    names = set(zipfile.ZipFile(bare.wheel).namelist())
    assert "pgbroker/queues/_client.py" in names  # generated, committed
    assert "pgbroker/queues/_client_async.py" in names
    shipped_sql = {n for n in names if n.startswith("pgbroker/_sql/") and n.endswith(".sql")}
    expected_sql = {str(p.relative_to(ROOT / "src")) for p in (ROOT / "src/pgbroker/_sql").rglob("*.sql")}
    assert shipped_sql == expected_sql
    assert {n for n in names if n.startswith("pgbroker/http/static/")} == {
        str(p.relative_to(ROOT / "src")) for p in (ROOT / "src/pgbroker/http/static").iterdir()
    }
    client = zipfile.ZipFile(bare.wheel).read("pgbroker/queues/_client.py").decode()
    assert client.startswith("# Generated from _client_async.py")
    assert "class Broker" in client


def test_the_bare_install_has_no_extra(bare: BareInstall) -> None:
    for package in ("starlette", "uvicorn", "pika", "pyspark", "pyarrow", "prometheus_client", "pydantic"):
        found = bare.python_code(f"import importlib.util; print(importlib.util.find_spec({package!r}))")
        assert found.stdout.strip() == "None", f"{package} is installed without its extra"


def test_the_client_imports_without_extras(bare: BareInstall) -> None:
    done = bare.python_code(
        "import pgbroker; print(pgbroker.Broker.__module__, pgbroker.AsyncBroker.__module__)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["pgbroker.queues._client", "pgbroker.queues._client_async"]
    http = bare.python_code("import pgbroker.http")
    assert http.returncode != 0
    assert "No module named 'starlette'" in http.stderr


def test_the_cli_installs_creates_sends_reads_and_acks(bare: BareInstall, empty_dsn: str) -> None:
    installed = bare.cli("--dsn", empty_dsn, "install")
    assert installed.returncode == 0, installed.stderr
    created = bare.cli("--dsn", empty_dsn, "create", "orders")
    assert created.returncode == 0, created.stderr
    sent = bare.cli("--dsn", empty_dsn, "send", "orders", stdin='{"id": 1}\n{"id": 2}\n')
    assert sent.returncode == 0, sent.stderr
    read = bare.cli("--dsn", empty_dsn, "read", "orders", "--qty", "2", "--vt", "30")
    assert read.returncode == 0, read.stderr
    messages = [json.loads(line) for line in read.stdout.splitlines()]
    assert [m["message"] for m in messages] == [{"id": 1}, {"id": 2}]
    acked = bare.cli("--dsn", empty_dsn, "ack", "orders", *(m["receipt"] for m in messages))
    assert acked.returncode == 0, acked.stderr
    listed = bare.cli("--dsn", empty_dsn, "--json", "metrics", "orders")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["queue_length"] == 0


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["serve"], "http"),
        (["bridge", "out", "--queue", "q", "--amqp", "amqp://127.0.0.1:1/"], "bridge"),
        (["bridge", "in", "--from", "q", "--queue", "q", "--amqp", "amqp://127.0.0.1:1/"], "bridge"),
        (["pipeline", "drain", "--queue", "q"], "spark"),
    ],
    ids=["serve", "bridge-out", "bridge-in", "pipeline"],
)
def test_a_command_without_its_extra_says_what_to_install(
    bare: BareInstall, empty_dsn: str, argv: list[str], extra: str
) -> None:
    done = bare.cli("--dsn", empty_dsn, *argv)
    assert done.returncode == 2, done.stderr
    assert f"pip install 'pgbroker[{extra}]'" in done.stderr
    assert "Traceback" not in done.stderr
