"""The fenced code blocks of the docs, as a reader pastes them: found with their language and the
``<!-- snippet: ... -->`` note on the line before, if any."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RUN_LANGUAGES", "Snippet", "snippets_of"]

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
