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

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.snippets import BLOCK_TIMEOUT, KNOWN_LANGUAGES, needs_spark, run_page, snippets_of

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def _page_param(page: Path) -> Any:
    services = {s.needs for s in snippets_of(page) if s.needs and s.skip_reason is None}
    marks = [getattr(pytest.mark, service) for service in sorted(services)]
    return pytest.param(page, marks=marks, id=str(page.relative_to(ROOT)))


def test_every_block_has_a_language_and_every_skip_a_reason() -> None:
    wrong = [
        f"{s.where}: language {s.language!r}"
        for page in PAGES
        for s in snippets_of(page)
        if s.language not in KNOWN_LANGUAGES
    ]
    wrong += [
        f"{s.where}: a skip without a reason"
        for page in PAGES
        for s in snippets_of(page)
        if s.skip_reason == ""
    ]
    assert wrong == []


@pytest.mark.parametrize("page", [_page_param(page) for page in PAGES])
def test_the_blocks_of_a_page_run_as_pasted(
    page: Path, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if needs_spark(page):
        # In a fresh process: a Spark session is the process's, started once with the
        # environment and folder of its start (the spark tests share one from the repository).
        done = subprocess.run(
            [sys.executable, "-m", "tests.support.snippets", str(page), dsn],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT * 3,
            check=False,
        )
        assert done.returncode == 0, f"{page}:\n{done.stderr[-6000:]}"
        return
    monkeypatch.setenv("DATABASE_URL", dsn)
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    run_page(page, dsn)
