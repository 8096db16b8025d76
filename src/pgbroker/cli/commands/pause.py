"""``pgbroker pause`` and ``resume``: stop and restart every read of a queue; sends go on."""

from __future__ import annotations

import argparse

from pgbroker.cli.support.output import print_result
from pgbroker.cli.support.parsers import Subcommands, add_command
from pgbroker.queues._client import Broker

__all__ = ["register"]


def register(subcommands: Subcommands) -> None:
    sub = add_command(subcommands, "pause", "stop every read of a queue (sends still succeed)", _pause)
    sub.add_argument("name", metavar="QUEUE", help="queue name")
    sub = add_command(subcommands, "resume", "let a paused queue's messages be read again", _resume)
    sub.add_argument("name", metavar="QUEUE", help="queue name")


def _pause(args: argparse.Namespace, broker: Broker) -> int:
    changed = broker.queue(args.name).pause()
    if changed:
        text = f'paused queue "{args.name}": reads return nothing until: pgbroker resume {args.name}'
    else:
        text = f'queue "{args.name}" was paused already'
    return print_result(args, {"queue": args.name, "paused": True, "changed": changed}, text)


def _resume(args: argparse.Namespace, broker: Broker) -> int:
    changed = broker.queue(args.name).resume()
    text = f'resumed queue "{args.name}"' if changed else f'queue "{args.name}" was not paused'
    return print_result(args, {"queue": args.name, "paused": False, "changed": changed}, text)
