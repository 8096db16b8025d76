"""docs/reference/sql.md: the engine's public functions, by schema and concern file, each with its
signatures as a new database's catalog gives them, its header (sql_headers.py) and the roles that
may call it (pgbroker.role_function)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import psycopg

from scripts.reference import generated_notice
from scripts.reference.sql_headers import (
    PUBLIC_SCHEMAS,
    SqlFunction,
    engine_file_texts,
    file_summary,
    functions_in,
    is_public,
)

_SIGNATURES = """
SELECT n.nspname, p.proname,
       n.nspname || '.' || p.proname || '(' || pg_get_function_arguments(p.oid)
       || ') RETURNS ' || pg_get_function_result(p.oid)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = ANY(%(schemas)s) AND p.prokind = 'f'
ORDER BY 3
"""
_ROLES = "SELECT function_schema, function_name, role_kind FROM pgbroker.role_function ORDER BY 3"

Catalog = dict[tuple[str, str], list[str]]


def _catalog(conn: psycopg.Connection[Any]) -> tuple[Catalog, Catalog]:
    signatures: Catalog = defaultdict(list)
    for schema, name, signature in conn.execute(_SIGNATURES, {"schemas": list(PUBLIC_SCHEMAS)}):
        if is_public(schema, name):
            signatures[(schema, name)].append(signature)
    roles: Catalog = defaultdict(list)
    for schema, name, role in conn.execute(_ROLES):
        roles[(schema, name)].append(role)
    return signatures, roles


def _section(function: SqlFunction, signatures: list[str], roles: list[str]) -> list[str]:
    lines = [f"#### `{function.qualified}`", "", "```sql", *signatures, "```", ""]
    header = function.header
    if header is not None:
        lines += [header.description, ""]
        for label, name in (("Arguments", "Arguments"), ("Returns", "Returns"), ("Errors", "Errors")):
            if header.text(name):
                lines += [f"- **{label}:** {header.text(name)}"]
    callers = ", ".join(roles) if roles else "none granted (the installing role, or whom it grants)"
    since = header.text("Since") if header is not None else ""
    return [*lines, f"- **Roles:** {callers}", f"- **Since:** {since or '?'}", ""]


def sql_reference(dsn: str) -> str:
    """The SQL reference of the engine installed in the database at ``dsn``."""
    with psycopg.connect(dsn) as conn:
        signatures, roles = _catalog(conn)
    files = engine_file_texts()
    documented = {(f.schema, f.name) for file, text in files for f in functions_in(file, text)}
    unknown = sorted(".".join(key) for key in signatures if key not in documented)
    if unknown:
        raise LookupError(f"public functions in the catalog but in no functions/ file: {unknown}")
    out = [
        generated_notice("src/pgbroker/_sql/functions/ and a new database's catalog"),
        "# SQL reference",
        "",
        "Every public function of the engine: all of schema `pgmq` (pgmq's API, names fixed by pgmq)",
        "and the functions of schema `pgbroker` whose name does not start with `_`. Grouped by",
        "schema, then by the file of `src/pgbroker/_sql/functions/` that defines them. **Roles**",
        "are the kinds of `pgbroker install --roles` that may call the function (docs/security.md).",
        "",
    ]
    for schema in PUBLIC_SCHEMAS:
        out += [f"## Schema `{schema}`", ""]
        for file, text in files:
            public = [f for f in functions_in(file, text) if f.schema == schema and is_public(schema, f.name)]
            if not public:
                continue
            out += [f"### {file}", "", file_summary(text), ""]
            for function in public:
                key = (function.schema, function.name)
                out += _section(function, signatures[key], roles.get(key, []))
    return "\n".join(out).rstrip("\n") + "\n"
