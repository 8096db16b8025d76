"""The structured header comments of the engine's public SQL functions (CONTRIBUTING.md has the shape).

A header is the block of ``--`` lines directly above a ``CREATE [OR REPLACE] FUNCTION``: prose first
(its first sentence is the summary), then ``Arguments:``, ``Returns:``, ``Errors:`` where they apply,
and always ``Since:``. Overloads share the header of the first of them that has one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources

FIELDS = ("Arguments", "Returns", "Errors", "Since")
PUBLIC_SCHEMAS = ("pgmq", "pgbroker")

_CREATE = re.compile(r"^CREATE (?:OR REPLACE )?FUNCTION (\w+)\.\"?(\w+)\"?\s*\(", re.IGNORECASE)
_FIELD = re.compile(rf"^({'|'.join(FIELDS)}):\s*(.*)$")
_RELEASE = re.compile(r"\d+\.\d+\.\d+")
_RULE = re.compile(r"^-{4,}\s*$")  # a line of dashes separates sections of a file, not a header


@dataclass
class Header:
    prose: list[str] = field(default_factory=list)
    fields: dict[str, list[str]] = field(default_factory=dict)

    def text(self, name: str) -> str:
        return " ".join(self.fields.get(name, [])).strip()

    @property
    def description(self) -> str:
        """The prose, its paragraphs (split by a bare ``--`` line) apart by a blank line."""
        paragraphs = " ".join(line or "\n\n" for line in self.prose).split("\n\n")
        return "\n\n".join(p.strip() for p in paragraphs if p.strip())

    @property
    def structured(self) -> bool:
        return bool(self.description) and _RELEASE.fullmatch(self.text("Since")) is not None


@dataclass
class SqlFunction:
    schema: str
    name: str
    file: str  # relative to _sql/, such as "functions/60_acks.sql"
    header: Header | None

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


def is_public(schema: str, name: str) -> bool:
    """pgmq's whole API is public; pgbroker's internals start with an underscore."""
    return schema == "pgmq" or (schema == "pgbroker" and not name.startswith("_"))


def parse_header(comment_lines: list[str]) -> Header | None:
    if not comment_lines:
        return None
    header = Header()
    current: list[str] = header.prose
    for line in comment_lines:
        text = line[2:].strip()
        found = _FIELD.match(text)
        if found:
            current = header.fields.setdefault(found[1], [])
            text = found[2]
        if text or current is header.prose:
            current.append(text)
    return header


def _comment_above(lines: list[str], index: int) -> list[str]:
    block: list[str] = []
    for line in reversed(lines[:index]):
        if not line.startswith("--") or _RULE.match(line):
            break
        block.append(line)
    return block[::-1]


def functions_in(file: str, text: str) -> list[SqlFunction]:
    """The functions ``text`` creates, each name once (in order), with the first header it has."""
    found: dict[tuple[str, str], SqlFunction] = {}
    lines = text.splitlines()
    for index, line in enumerate(lines):
        created = _CREATE.match(line)
        if not created:
            continue
        key = (created[1].lower(), created[2].lower())
        header = parse_header(_comment_above(lines, index))
        known = found.get(key)
        if known is None:
            found[key] = SqlFunction(key[0], key[1], file, header)
        elif known.header is None or not known.header.structured:
            known.header = header or known.header
    return list(found.values())


def engine_file_texts() -> list[tuple[str, str]]:
    """Each file of _sql/functions/, in load order, with its text."""
    folder = resources.files("pgbroker._sql").joinpath("functions")
    entries = sorted((e for e in folder.iterdir() if e.name.endswith(".sql")), key=lambda e: e.name)
    return [(f"functions/{e.name}", e.read_text(encoding="utf-8")) for e in entries]


def public_functions() -> list[SqlFunction]:
    return [
        function
        for file, text in engine_file_texts()
        for function in functions_in(file, text)
        if is_public(function.schema, function.name)
    ]


def file_summary(text: str) -> str:
    """The first line of a file's header comment, such as "Acks: what ends or changes a delivery."."""
    first = text.splitlines()[0] if text else ""
    return first[2:].strip() if first.startswith("--") else ""
