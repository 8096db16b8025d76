"""``pgbroker pause`` and ``resume``: stop and restart every read of a queue; sends go on."""

from __future__ import annotations

import argparse

from pgbroker.cli.support.errors import Exit
from pgbroker.cli.support.parsers import Subcommands, add_command
from pgbroker.queues._client import Broker

__all__ = ["register"]


def register(subcommands: Subcommands) -> None:
    sub = add_command(subcommands, "pause", "stop every read of a queue (sends still succeed)", _pause)
    sub.add_argument("name", metavar="QUEUE", help="queue name")
    sub = add_command(subcommands, "resume", "let a paused queue's messages be read again", _resume)
    sub.add_argument("name", metavar="QUEUE", help="queue name")


def _pause(args: argparse.Namespace, broker: Broker) -> int:
    if broker.queue(args.name).pause():
        print(f'paused queue "{args.name}": reads return nothing until: pgbroker resume {args.name}')
    else:
        print(f'queue "{args.name}" was paused already')
    return Exit.OK


def _resume(args: argparse.Namespace, broker: Broker) -> int:
    if broker.queue(args.name).resume():
        print(f'resumed queue "{args.name}"')
    else:
        print(f'queue "{args.name}" was not paused')
    return Exit.OK
