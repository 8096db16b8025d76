"""Destructive commands (drop, purge): nothing is done without ``--yes``, so that a command
recalled from the shell's history or mistyped does not lose data. A purge with nothing to delete
says so and succeeds, a drop of what does not exist says so and fails, without asking (each
command checks before it calls ``confirmed``)."""

from __future__ import annotations

import argparse

from pgbroker.cli.support.errors import CliError, Exit


def add_yes_option(parser: argparse.ArgumentParser, action: str) -> None:
    parser.add_argument("--yes", action="store_true", help=f"confirm: {action} cannot be undone")


def confirmed(args: argparse.Namespace, what: str, *, hint: str) -> None:
    """Raise a usage error saying what the command would destroy, unless ``--yes`` was given."""
    if not args.yes:
        raise CliError(f"{what} and cannot be undone", code=Exit.USAGE, hint=hint)
