"""The ``pgbroker`` console script: the parser, assembled from the command modules, and main()."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pgbroker.cli.commands import (
    bridge,
    db,
    dead_letters,
    grants,
    keys,
    messages,
    pause,
    peek,
    pipeline,
    policy,
    queues,
    schedules,
    serve,
    sessions,
    streams,
    worker,
)
from pgbroker.cli.support.parsers import new_parser
from pgbroker.cli.support.running import execute

__all__ = ["build_parser", "main"]

# In the order `pgbroker --help` lists them. A module whose command needs an optional extra
# (bridge, serve, pipeline) imports it only when the command runs.
COMMAND_MODULES = (
    queues,
    pause,
    messages,
    peek,
    streams,
    db,
    pipeline,
    worker,
    schedules,
    dead_letters,
    policy,
    sessions,
    bridge,
    keys,
    grants,
    serve,
)


def build_parser() -> argparse.ArgumentParser:
    parser, subcommands = new_parser()
    for module in COMMAND_MODULES:
        module.register(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return execute(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
