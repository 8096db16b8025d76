"""The fenced code blocks of the docs, as a reader pastes them: found with their language and the
``<!-- snippet: ... -->`` note on the line before, if any, and run as the reader would
(run_page, or ``python -m tests.support.snippets PAGE DSN`` for a page run in a fresh process)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgbroker import Broker, tracing

__all__ = [
    "BLOCK_TIMEOUT",
    "KNOWN_LANGUAGES",
    "RUN_LANGUAGES",
    "Snippet",
    "needs_spark",
    "run_page",
    "snippets_of",
]

# A block that runs longer is hung, not slow (a Spark job on a loaded machine takes minutes).
BLOCK_TIMEOUT = 600

# What a block may be: run (python, sh, sql), parsed (json), or shown (text: diagrams, output).
RUN_LANGUAGES = ("python", "sh", "sql", "json")
KNOWN_LANGUAGES = (*RUN_LANGUAGES, "text")

_FENCE = re.compile(r"^```(?P<language>[\w-]*)\n(?P<code>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
# On the line right above the fence: <!-- snippet: skip, why --> or <!-- snippet: needs SERVICE -->.
_NOTE = re.compile(r"<!--\s*snippet:\s*(?P<note>.*?)\s*-->\s*\n$")


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening fence
    language: str
    code: str
    note: str | None  # the annotation: "skip, <reason>" or "needs <service>"

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        if self.note is None or not self.note.startswith("skip"):
            return None
        return self.note.removeprefix("skip").lstrip(", ").strip()

    @property
    def needs(self) -> str | None:
        if self.note is None or not self.note.startswith("needs "):
            return None
        return self.note.removeprefix("needs ").strip()


def snippets_of(path: Path) -> list[Snippet]:
    text = path.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()]
        note = _NOTE.search(before[-300:])
        found.append(
            Snippet(
                path=path,
                line=before.count("\n") + 1,
                language=match["language"],
                code=match["code"],
                note=note["note"] if note else None,
            )
        )
    return found


def needs_spark(page: Path) -> bool:
    return any(s.needs == "spark" and s.skip_reason is None for s in snippets_of(page))


def run_page(page: Path, dsn: str) -> None:
    """Run a page's blocks top to bottom in the current folder, with DATABASE_URL set to ``dsn``:
    python blocks in one namespace, sh in bash, sql in psql, json parsed; AssertionError naming the
    block that fails."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    try:
        for snippet in snippets_of(page):
            if snippet.skip_reason is not None:
                continue
            if snippet.language == "python":
                _run_python(snippet, namespace)
            elif snippet.language == "sh":
                _run_shell(snippet, Path.cwd())
            elif snippet.language == "sql":
                _run_sql(snippet, dsn)
            elif snippet.language == "json":
                json.loads(snippet.code)
    finally:
        # The pools a page left open, before its database goes; and what a page switches on for
        # the whole process (tracing, docs/observability.md) is switched off again.
        for value in namespace.values():
            if isinstance(value, Broker):
                value.close()
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


if __name__ == "__main__":
    # A page in a fresh process (a Spark page: its session, started by the page's own
    # getOrCreate(), sees this DATABASE_URL and this folder), in a folder of its own.
    page_path, page_dsn = Path(sys.argv[1]).resolve(), sys.argv[2]
    os.environ["DATABASE_URL"] = page_dsn
    with tempfile.TemporaryDirectory(prefix="pgbroker-snippets-") as folder:
        os.chdir(folder)
        try:
            run_page(page_path, page_dsn)
        except AssertionError as failed:
            print(failed, file=sys.stderr)
            sys.exit(1)
