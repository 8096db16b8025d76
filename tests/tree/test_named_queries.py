"""Every SQL statement Python runs is named in a file of _sql/queries/, by caller, with a one-line
description (issue 22, item 4): no module of src/pgbroker holds a statement of its own, and every
named query is defined once and used."""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgbroker import _sql

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "pgbroker"

# A string that opens with an upper-case SQL command and a space (an f-string's first part too):
# a single word (an HTTP "DELETE", a "NOTIFY" label) is not a statement.
_STATEMENT = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP|LISTEN|UNLISTEN|NOTIFY|SET|SHOW|CALL|"
    r"EXPLAIN|COPY|TRUNCATE|GRANT|REVOKE|LOCK|DO|VALUES|BEGIN|COMMIT|ROLLBACK)\s"
)

# The installer's bootstrap stays inline: it creates the bookkeeping table the installer reads
# before anything else, in a statement that must run on a database pgbroker has never touched.
ALLOWED = {("_db/install_rules.py", "BOOTSTRAP")}


def _docstrings(tree: ast.Module) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _allowed(tree: ast.Module, module: str) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and (module, t.id) in ALLOWED for t in targets):
                found.update(id(n) for n in ast.walk(node))
    return found


def _string_constants(source: str, module: str) -> Iterator[tuple[int, str, bool]]:
    """Each string constant of a module: its line, its text, and whether it is exempt (a docstring
    or an allowed one)."""
    tree = ast.parse(source, module)
    exempt = _docstrings(tree) | _allowed(tree, module)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value, id(node) in exempt


def inline_statements(source: str, module: str) -> list[str]:
    return [
        f"{module}:{line}: {text.strip()[:60]!r}"
        for line, text, exempt in _string_constants(source, module)
        if not exempt and _STATEMENT.match(text)
    ]


def _modules() -> Iterator[tuple[str, str]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.read_text(), path.relative_to(PACKAGE).as_posix()


def test_no_module_runs_an_inline_statement() -> None:
    found = [line for source, module in _modules() for line in inline_statements(source, module)]
    assert not found, "name these in _sql/queries/<caller>.sql:\n" + "\n".join(found)


def test_the_check_sees_statements_not_prose() -> None:
    source = (
        'def f(cur):\n    """SELECT in a docstring is prose."""\n'
        '    cur.execute("SELECT 1")\n    cur.execute(sql.SQL(f"LISTEN {x}"))\n    method = "DELETE"\n'
    )
    assert [line.split(": ", 1)[1] for line in inline_statements(source, "probe.py")] == [
        "'SELECT 1'",
        "'LISTEN'",
    ]
    bootstrap = 'BOOTSTRAP = "CREATE TABLE t (x int)"\nOTHER = "CREATE TABLE u (x int)"\n'
    assert len(inline_statements(bootstrap, "_db/install_rules.py")) == 1


def _defined_names() -> Counter[str]:
    names: Counter[str] = Counter()
    for caller in _sql.query_files():
        file = f"queries/{caller}.sql"
        text = (PACKAGE / "_sql" / file).read_text()
        names.update(q.name for q in _sql.parse_queries(text, file))
    return names


def test_each_named_query_is_defined_once() -> None:
    twice = sorted(name for name, count in _defined_names().items() if count > 1)
    assert not twice, f"named queries defined more than once: {twice}"


@pytest.mark.parametrize("caller", _sql.query_files())
def test_each_named_query_has_a_description(caller: str) -> None:
    # The loader refuses a query without its description line; loading the file is the check.
    assert _sql.queries(caller)


def test_each_named_query_is_used() -> None:
    used = {text for source, module in _modules() for _, text, _ in _string_constants(source, module)}
    unused = sorted(set(_defined_names()) - used)
    assert not unused, f"named queries no module uses: {unused}"


def test_a_query_without_a_description_is_refused() -> None:
    with pytest.raises(RuntimeError, match="lacks its one-line description"):
        _sql.parse_queries("-- name: bare\nSELECT 1\n", "queries/probe.sql")
