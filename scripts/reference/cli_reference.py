"""docs/reference/cli.md: the ``--help`` of ``pgbroker`` and of every command and sub-command, from
the parser that ``pgbroker.cli.main.build_parser`` assembles."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager

from pgbroker.cli.main import build_parser
from scripts.reference import generated_notice

# argparse wraps help to the terminal's width: fix it, so the file is the same everywhere.
_WIDTH = "100"


@contextmanager
def _fixed_width() -> Iterator[None]:
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = _WIDTH
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def _commands(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:  # argparse has no public way to walk sub-commands
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{path} {name}")


def cli_reference() -> str:
    out = [
        generated_notice("pgbroker.cli.main.build_parser"),
        "# Command-line reference",
        "",
        "The `--help` of `pgbroker` and of each of its commands.",
        "",
    ]
    with _fixed_width():
        parser = build_parser()
        parser.prog = "pgbroker"
        for path, command in _commands(parser, "pgbroker"):
            out += [f"## `{path}`", "", "```text", command.format_help().rstrip(), "```", ""]
    return "\n".join(out).rstrip("\n") + "\n"
