"""The suite's own layout: its folders mirror the source tree, and a test module never imports
another test module or a conftest.

A test lives beside the code it tests (tests/README.md says where a test goes): a folder per
source package, plus the engine's tests, the tree's own rules and three cross-cutting suites.

Shared fixtures are pytest plugins (tests/plugins, registered by the root conftest) and shared
helpers plain modules (tests/support and the helper modules beside the tests): importing a test
module runs its module-level code and re-registers its fixtures and tests where they were not
meant to be, and importing a conftest defines its fixtures twice.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SOURCE = TESTS.parent / "src" / "pgbroker"

# The folders that mirror no package of their own: the SQL engine's tests (its code is _sql/, SQL
# rather than Python), the tree's own rules, the cross-cutting suites, and the suite's plumbing.
NOT_A_PACKAGE = {"engine", "tree", "system", "compat", "conformance", "plugins", "support", "data"}


def _imports(tree: ast.Module) -> Iterator[tuple[int, list[str]]]:
    """(line, dotted names) of each import statement, a ``from`` import's names included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield node.lineno, [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            yield node.lineno, [module, *(f"{module}.{alias.name}" for alias in node.names)]


def _is_test_module_or_conftest(name: str) -> bool:
    parts = name.lstrip(".").split(".")
    local = name.startswith(".") or parts[0] == "tests"
    return local and any(part == "conftest" or part.startswith("test_") for part in parts)


def forbidden_imports(root: Path) -> list[str]:
    """``path:line imports name`` for each import of a test module or a conftest under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for line, names in _imports(ast.parse(path.read_text(), str(path))):
            bad = next((name for name in names if _is_test_module_or_conftest(name)), None)
            if bad is not None:
                found.append(f"{path.relative_to(root.parent)}:{line} imports {bad}")
    return found


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    found = forbidden_imports(TESTS)
    assert not found, (
        "move what is shared into tests/plugins (fixtures) or tests/support (helpers):\n" + "\n".join(found)
    )


def stray_test_places(tests: Path, source: Path) -> list[str]:
    """Test folders that mirror no source package and are no cross-cutting suite, and test
    modules outside any folder."""
    packages = {path.name.lstrip("_") for path in source.iterdir() if (path / "__init__.py").exists()}
    folders = [path for path in tests.iterdir() if path.is_dir() and not path.name.startswith((".", "__"))]
    stray = [f"{path.name}/" for path in folders if path.name not in packages | NOT_A_PACKAGE]
    return sorted(stray + [path.name for path in tests.glob("test_*.py")])


def test_the_test_folders_mirror_the_source_packages() -> None:
    stray = stray_test_places(TESTS, SOURCE)
    assert not stray, f"put each test beside the code it tests (tests/README.md): {stray}"
