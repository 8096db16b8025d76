"""docs/reference/python.md: every name of ``pgbroker.__all__`` and of the public packages' ``__all__``,
with its signature and the first paragraph of its docstring."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pgbroker
from scripts.reference import generated_notice

PACKAGE = Path(pgbroker.__file__).parent


def public_packages() -> list[str]:
    """``pgbroker`` and each of its packages whose name has no underscore and that declares ``__all__``."""
    names = ["pgbroker"]
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        name = init.parent.name
        if not name.startswith("_") and "__all__" in init.read_text(encoding="utf-8"):
            names.append(f"pgbroker.{name}")
    return names


def _signature(value: object) -> str:
    try:
        signature = inspect.signature(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    if inspect.isclass(value):  # a constructor's "-> None" says nothing
        signature = signature.replace(return_annotation=inspect.Signature.empty)
    return str(signature)


def _first_paragraph(value: object) -> str:
    doc = inspect.getdoc(value) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def _kind(value: object) -> str:
    if inspect.isclass(value):
        return "class"
    if callable(value):
        return "function"
    return "constant"


def _entry(module: str, name: str, value: object) -> list[str]:
    kind = _kind(value)
    lines = [f"### `{module}.{name}`", ""]
    if kind == "constant":
        lines += [f"`{name}` = `{value!r}`", ""]
        return lines
    lines += ["```python", f"{kind} {name}{_signature(value)}", "```", ""]
    summary = _first_paragraph(value)
    return [*lines, summary, ""] if summary else lines


def python_reference() -> str:
    out = [
        generated_notice("the public packages' __all__"),
        "# Python reference",
        "",
        "The declared public surface (docs/adr/0001-layout.md): `pgbroker.__all__`, then what each",
        "public package exports beyond it. Anything else is private, whatever its name.",
        "",
    ]
    listed: set[int] = set()
    for module_name in public_packages():
        module = importlib.import_module(module_name)
        entries = []
        for name in module.__all__:
            value = getattr(module, name)
            if module_name != "pgbroker" and id(value) in listed:
                continue
            listed.add(id(value))
            entries += _entry(module_name, name, value)
        if entries:
            out += [f"## `{module_name}`", "", _first_paragraph(module), "", *entries]
    return "\n".join(out).rstrip("\n") + "\n"
