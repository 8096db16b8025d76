"""Every fenced block of README.md and docs/ runs as pasted, against a fresh database.

A page is read as a reader pastes it, top to bottom, into one Python session and one shell, with
DATABASE_URL set: its python blocks run in one namespace (a later block uses what an earlier one
made), each sh block in bash (``-eu -o pipefail``, the virtualenv's ``pgbroker`` and ``python`` on
PATH), each sql block in psql, and json blocks are parsed. A block that cannot run here
says why on the line above it, ``<!-- snippet: skip, REASON -->`` (a package index, a process that
runs until stopped, a cluster of its own); one that needs a service the suite starts says
``<!-- snippet: needs spark -->``, which marks its page's test. A block without a language fails:
diagrams and output are ``text``. The generated references (docs/reference/) hold signatures,
not snippets, and are left out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pgbroker import Broker, tracing
from tests.support.snippets import KNOWN_LANGUAGES, Snippet, snippets_of

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
# A block that runs longer is hung, not slow (a Spark job on a loaded machine takes minutes).
BLOCK_TIMEOUT = 600


def _page_param(page: Path) -> Any:
    services = {s.needs for s in snippets_of(page) if s.needs and s.skip_reason is None}
    marks = [getattr(pytest.mark, service) for service in sorted(services)]
    return pytest.param(page, marks=marks, id=str(page.relative_to(ROOT)))


def test_every_block_has_a_language_and_every_skip_a_reason() -> None:
    wrong = [
        f"{s.where}: language {s.language!r}" for page in PAGES for s in snippets_of(page)
        if s.language not in KNOWN_LANGUAGES
    ]
    wrong += [
        f"{s.where}: a skip without a reason" for page in PAGES for s in snippets_of(page)
        if s.skip_reason == ""
    ]
    assert wrong == []


@pytest.mark.parametrize("page", [_page_param(page) for page in PAGES])
def test_the_blocks_of_a_page_run_as_pasted(
    page: Path, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", dsn)
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    namespace: dict[str, Any] = {"__name__": "__main__"}
    try:
        for snippet in snippets_of(page):
            if snippet.skip_reason is not None:
                continue
            if snippet.language == "python":
                _run_python(snippet, namespace)
            elif snippet.language == "sh":
                _run_shell(snippet, tmp_path)
            elif snippet.language == "sql":
                _run_sql(snippet, dsn)
            elif snippet.language == "json":
                json.loads(snippet.code)
    finally:
        # The pools a page left open, before its database goes (a Spark session stays: the
        # spark tests share one per process).
        for value in namespace.values():
            if isinstance(value, Broker):
                value.close()
        # What a page switches on for the whole process stays in this test: tracing
        # (docs/observability.md) would add a traceparent to every later test's sends.
        tracing.uninstrument()


def _run_python(snippet: Snippet, namespace: dict[str, Any]) -> None:
    try:
        exec(compile(snippet.code, snippet.where, "exec"), namespace)  # the docs' own code
    except Exception as exc:
        raise AssertionError(f"{snippet.where} fails: {type(exc).__name__}: {exc}\n{snippet.code}") from exc


def _run_shell(snippet: Snippet, cwd: Path) -> None:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    done = subprocess.run(
        ["bash", "-eu", "-o", "pipefail", "-c", snippet.code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PATH": path},
        timeout=BLOCK_TIMEOUT,
        check=False,
    )
    output = f"stdout: {done.stdout}\nstderr: {done.stderr}"
    assert done.returncode == 0, f"{snippet.where} exits {done.returncode}\n{snippet.code}\n{output}"


def _run_sql(snippet: Snippet, dsn: str) -> None:
    """In psql, where a reader pastes SQL: each statement on its own, stopping at an error."""
    psql = shutil.which("psql") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"))), None)
    assert psql is not None, "psql is missing: apt-get install postgresql-client"
    done = subprocess.run(
        [str(psql), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", "-"],
        input=snippet.code,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"{snippet.where} fails: {done.stderr}\n{snippet.code}"
