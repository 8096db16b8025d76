"""The --codec-module option of the commands that encode bodies in this process (send, serve):
Avro schemas and Protobuf types are known to a process only once a module of yours registers or
defines them (docs/codecs.md)."""

from __future__ import annotations

import argparse

from pgbroker.cli.support.user_modules import importable_from_cwd
from pgbroker.codecs.modules import import_codec_modules


def add_codec_module_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--codec-module",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first, from the current directory or PYTHONPATH (repeatable): it registers "
        "Avro schemas or defines Protobuf types",
    )


def load_codec_modules(args: argparse.Namespace) -> None:
    if args.codec_module:
        importable_from_cwd()  # as pgbroker worker finds its handlers
    import_codec_modules(args.codec_module)
