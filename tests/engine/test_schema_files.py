"""sql/functions/ is where a reader finds the engine's code: every function of schemas pgmq and
pgbroker is defined exactly once in the whole tree of engine SQL (structure/, functions/,
upgrades/), in functions/ and with CREATE OR REPLACE, so that it can run again on every install;
except the route functions pgbroker._write_routes generates.

Definitions are found in the files' text at the top level (outside comments, string literals and
function bodies, so the CREATE statements the route writer runs do not count), and each is
resolved to the installed function by its argument types.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import psycopg

from pgbroker import _sql as sql
from pgbroker._sql import SqlFile
from tests.support.tables import Conn

# What the route writer generates (see 90_routes.sql): created at install and rewritten whenever
# queues or policies change, so they have no definition of their own.
GENERATED = {("pgbroker", f"_route_{op}") for op in ("ack", "deliver", "pop", "read", "remove", "send")} | {
    ("pgbroker", "_stream_send_to")  # written by _stream_send_router_refresh (92_streams.sql)
}

_CREATE = re.compile(
    r"\bCREATE\s+(OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+(\w+)\s*\.\s*(\w+|\"\w+\")\s*\(", re.IGNORECASE
)
# Not after a word character: x$1$ is no quote.
_DOLLAR_QUOTE = re.compile(r"(?<![\w$])\$(?:[A-Za-z_]\w*)?\$")
_ARG_MODES = {"in", "out", "inout", "variadic"}


@dataclass(frozen=True)
class Definition:
    file: str
    line: int
    schema: str
    name: str
    arg_types: tuple[str, ...]
    or_replace: bool

    @property
    def signature(self) -> str:
        return f"{self.schema}.{self.name}({', '.join(self.arg_types)})"

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.signature}"


def top_level(text: str) -> str:
    """``text`` with comments, string literals and dollar-quoted strings blanked out (newlines and
    lengths kept, so positions still match)."""
    out = list(text)
    i = 0

    def blank(start: int, end: int) -> None:
        for k in range(start, end):
            if out[k] != "\n":
                out[k] = " "

    while i < len(text):
        if text.startswith("--", i):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            blank(i, end)
            i = end
        elif text.startswith("/*", i):
            end = text.index("*/", i) + 2
            blank(i, end)
            i = end
        elif text[i] == "'":
            end = i + 1
            while True:
                end = text.index("'", end) + 1
                if not text.startswith("'", end):  # '' is a quote inside the literal
                    break
                end += 1
            blank(i + 1, end - 1)
            i = end
        elif tag := _DOLLAR_QUOTE.match(text, i):
            end = text.index(tag.group(), tag.end()) + len(tag.group())
            blank(i, end)
            i = end
        else:
            i += 1
    return "".join(out)


def _split_args(args: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in args:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p for p in (*parts, current) if p.strip()]


def _input_type(arg: str) -> str | None:
    """The type of a declared argument (``[mode] name type [DEFAULT ...]``); None for OUT."""
    words = re.split(r"\s+(?:DEFAULT\b|=)", arg.strip(), maxsplit=1, flags=re.IGNORECASE)[0].split()
    if words[0].lower() in _ARG_MODES:
        mode, words = words[0].lower(), words[1:]
        if mode == "out":
            return None
    assert len(words) >= 2, f"argument {arg.strip()!r} has no name: every argument is named"
    return " ".join(words[1:])


def engine_files() -> tuple[SqlFile, ...]:
    """Every file of engine SQL in the package."""
    return (*sql.new_install(), *(u.file for u in sql.upgrades()), sql.dev_upgrade())


def definitions() -> list[Definition]:
    found = []
    for engine_file in engine_files():
        text = top_level(engine_file.sql)
        for match in _CREATE.finditer(text):
            depth, end = 0, match.end() - 1
            for end in range(match.end() - 1, len(text)):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            types = [_input_type(a) for a in _split_args(text[match.end() : end])]
            found.append(
                Definition(
                    engine_file.name,
                    text.count("\n", 0, match.start()) + 1,
                    match[2].lower(),
                    match[3].strip('"').lower(),
                    tuple(t for t in types if t is not None),
                    match[1] is not None,
                )
            )
    return found


def resolve(conn: Conn, found: list[Definition]) -> dict[Definition, int]:
    """The oid of the installed function each definition made."""
    oids: dict[Definition, int] = {}
    for d in found:
        row = conn.execute("SELECT to_regprocedure(%s)::oid", [d.signature]).fetchone()
        assert row is not None
        assert row[0] is not None, f"{d}: no such function installed"
        oids[d] = int(row[0])
    return oids


def test_top_level_ignores_bodies_comments_and_literals() -> None:
    text = (
        "-- CREATE FUNCTION a.b()\nCREATE FUNCTION x.y(v text DEFAULT 'CREATE FUNCTION c.d(') "
        "RETURNS void AS $F$ CREATE FUNCTION e.f() $F$;\nSELECT $$it''s$$, 'x''CREATE FUNCTION g.h()';"
    )
    assert [m[2] + "." + m[3] for m in _CREATE.finditer(top_level(text))] == ["x.y"]
    assert len(top_level(text)) == len(text)


def test_every_definition_is_a_create_or_replace_in_the_function_files() -> None:
    misplaced = [str(d) for d in definitions() if not d.file.startswith("functions/") or not d.or_replace]
    assert misplaced == []


def test_no_function_is_defined_twice_in_the_engine_files(dsn: str) -> None:
    found = definitions()
    assert len(found) > 150  # the parser sees the definitions
    with psycopg.connect(dsn, autocommit=True) as conn:
        oids = resolve(conn, found)
    counts = Counter(oids.values())
    twice = sorted(str(d) for d, oid in oids.items() if counts[oid] > 1)
    assert twice == []


def test_every_installed_function_is_defined_once_in_the_engine_files(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        defined = set(resolve(conn, definitions()).values())
        installed = conn.execute(
            "SELECT p.oid, n.nspname, p.proname, pg_get_function_identity_arguments(p.oid)"
            " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname IN ('pgmq', 'pgbroker') ORDER BY 2, 3, 4"
        ).fetchall()
    undefined = {(nsp, name) for oid, nsp, name, _ in installed if oid not in defined}
    assert undefined == GENERATED
