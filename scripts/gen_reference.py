"""Write the generated references of docs/reference/ (what `make reference` runs).

    python -m scripts.gen_reference              # a throwaway embedded cluster for sql.md
    python -m scripts.gen_reference --dsn DSN    # a server where DSN's role may create databases

- sql.md: the engine's public SQL functions, from their header comments (CONTRIBUTING.md has the
  shape) and a new database's catalog (signatures, and the roles pgbroker.role_function grants);
- python.md: the names of pgbroker.__all__ and of the public packages' __all__;
- cli.md: the --help of every command, from pgbroker.cli.main.build_parser.

tests/tree/test_reference_docs.py and tests/engine/test_sql_reference.py fail while a file is
stale, or while a public SQL function has no header.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scripts.dump_schema import ROOT, new_database, throwaway_server
from scripts.reference.cli_reference import cli_reference
from scripts.reference.python_reference import python_reference
from scripts.reference.sql_reference import sql_reference

REFERENCE = ROOT / "docs" / "reference"
SQL_MD = REFERENCE / "sql.md"
PYTHON_MD = REFERENCE / "python.md"
CLI_MD = REFERENCE / "cli.md"


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)}")


def write_all(admin_dsn: str) -> None:
    with new_database(admin_dsn) as dsn:
        _write(SQL_MD, sql_reference(dsn))
    _write(PYTHON_MD, python_reference())
    _write(CLI_MD, cli_reference())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--dsn", help="a server where this role may create databases (default: a throwaway one)"
    )
    args = parser.parse_args(argv)
    if args.dsn:
        write_all(args.dsn)
    else:
        with throwaway_server() as admin_dsn:
            write_all(admin_dsn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
