"""``pgbroker install``, ``create``, ``drop``, ``list`` and ``metrics``: the schema and the queues."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from pgbroker._db.install import install_roles
from pgbroker.cli.support.confirming import add_yes_option, confirmed
from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.output import print_listing, timestamped_json
from pgbroker.cli.support.parsers import Subcommands, add_command
from pgbroker.cli.support.tables import local_time, metrics_table, table
from pgbroker.queues._client import Broker
from pgbroker.queues._records import Metrics, QueueInfo

__all__ = ["register"]


def register(subcommands: Subcommands) -> None:
    sub = add_command(subcommands, "install", "install or upgrade the pgbroker schema (idempotent)", _install)
    sub.add_argument(
        "--roles",
        action="store_true",
        help="also create the least-privilege roles PREFIX_producer, PREFIX_consumer, PREFIX_monitor",
    )
    sub.add_argument(
        "--role-prefix", default="pgbroker", metavar="PREFIX", help="prefix of the roles' names (pgbroker)"
    )

    sub = add_command(subcommands, "create", "create a queue (idempotent)", _create)
    sub.add_argument("name", metavar="QUEUE", help="queue name")
    sub.add_argument("--unlogged", action="store_true", help="faster, but emptied by a server crash")

    sub = add_command(subcommands, "drop", "drop a queue and its archive", _drop)
    sub.add_argument("name", metavar="QUEUE", help="queue name")
    add_yes_option(sub, "drop")

    add_command(subcommands, "list", "list the queues", _list, json_output=True)

    sub = add_command(subcommands, "metrics", "queue lengths and ages", _metrics, json_output=True)
    sub.add_argument("name", nargs="?", metavar="QUEUE", help="one queue (default: all)")


def _install(args: argparse.Namespace, broker: Broker) -> int:
    result = broker.install()
    if not result.changed:
        print(f"already at version {result.version}")
    elif result.previous_version is None:
        print(f"installed version {result.version} (was not installed)")
    else:
        print(f"installed version {result.version} (was {result.previous_version})")
    if args.roles:
        with broker.connection() as conn:
            granted = install_roles(conn, args.role_prefix)
        for role, functions in granted.items():
            print(f"role {role}: execute on {functions} functions, no table privileges")
    return Exit.OK


def _create(args: argparse.Namespace, broker: Broker) -> int:
    existing = {info.queue_name: info for info in broker.list_queues()}.get(args.name)
    broker.create_queue(args.name, unlogged=args.unlogged)
    if existing is None:
        print(f'created {"unlogged " if args.unlogged else ""}queue "{args.name}"')
    elif args.unlogged and not existing.is_unlogged:
        print(f'queue "{args.name}" already exists as a logged queue; --unlogged changed nothing')
    else:
        print(f'queue "{args.name}" already exists')
    return Exit.OK


def _drop(args: argparse.Namespace, broker: Broker) -> int:
    confirmed(
        args,
        f'drop deletes queue "{args.name}" with its messages and its archive',
        hint=f"Confirm with: pgbroker drop {args.name} --yes",
    )
    if not broker.drop_queue(args.name):
        raise CliError(
            f'queue "{args.name}" does not exist; nothing dropped',
            code=Exit.NOTHING_DONE,
            hint="See the queues with: pgbroker list",
        )
    print(f'dropped queue "{args.name}" and its archive')
    return Exit.OK


def _list(args: argparse.Namespace, broker: Broker) -> int:
    return print_listing(args, broker.list_queues(), _queue_info_json, _queue_table)


def _queue_info_json(info: QueueInfo) -> dict[str, object]:
    return timestamped_json(info, "created_at")


def _queue_table(queues: Sequence[QueueInfo]) -> str:
    rows = [[info.queue_name, _storage(info), local_time(info.created_at)] for info in queues]
    return table(["QUEUE", "STORAGE", "CREATED"], rows)


def _storage(info: QueueInfo) -> str:
    kind = "unlogged" if info.is_unlogged else "logged"
    return f"{kind}, partitioned" if info.is_partitioned else kind


def _metrics(args: argparse.Namespace, broker: Broker) -> int:
    if args.name is None:
        return print_listing(args, broker.metrics_all(), _metrics_json, metrics_table)
    single = broker.metrics(args.name)
    print(json.dumps(_metrics_json(single), indent=2) if args.json else metrics_table([single]))
    return Exit.OK


def _metrics_json(metrics: Metrics) -> dict[str, object]:
    return timestamped_json(metrics, "scrape_time")
