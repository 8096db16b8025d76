"""``pgbroker install``, ``create``, ``drop``, ``list`` and ``metrics``: the schema and the queues."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from pgbroker._db.install import install_roles
from pgbroker.cli.support.confirming import add_yes_option, confirmed
from pgbroker.cli.support.connecting import database_of
from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.output import print_listing, print_result, timestamped_json, wants_json
from pgbroker.cli.support.parsers import Subcommands, add_command
from pgbroker.cli.support.tables import local_time, metrics_table, table
from pgbroker.errors import QueueNotFound
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

    add_command(subcommands, "list", "list the queues", _list)

    sub = add_command(subcommands, "metrics", "queue lengths and ages", _metrics)
    sub.add_argument("name", nargs="?", metavar="QUEUE", help="one queue (default: all)")


def _install(args: argparse.Namespace, broker: Broker) -> int:
    result = broker.install()
    if not result.changed:
        done = f"already at version {result.version}"
    elif result.previous_version is None:
        done = f"installed version {result.version} (was not installed)"
    else:
        done = f"installed version {result.version} (was {result.previous_version})"
    lines = [f"{done} in {database_of(args.dsn, broker)}", *result.roles.repairs]
    granted: dict[str, int] = {}
    if args.roles:
        with broker.connection() as conn:
            granted = install_roles(conn, args.role_prefix)
        lines += [
            f"role {role}: execute on {n} functions, no table privileges" for role, n in granted.items()
        ]
    # A restored database's role sets whose roles this server lacks, less the one just made.
    warnings = [
        warning
        for (prefix, _), warning in zip(result.roles.missing, result.roles.warnings, strict=True)
        if not (args.roles and prefix == args.role_prefix)
    ]
    record = {
        "version": result.version,
        "previous_version": result.previous_version,
        "changed": result.changed,
        "roles": granted,  # role: the functions it may execute
        "repairs": list(result.roles.repairs),
        "warnings": warnings,
    }
    lines += [f"warning: {warning}" for warning in warnings]
    return print_result(args, record, "\n".join(lines))


def _create(args: argparse.Namespace, broker: Broker) -> int:
    existing = {info.queue_name: info for info in broker.list_queues()}.get(args.name)
    broker.create_queue(args.name, unlogged=args.unlogged)
    if existing is None:
        text = f'created {"unlogged " if args.unlogged else ""}queue "{args.name}"'
    elif args.unlogged and not existing.is_unlogged:
        text = f'queue "{args.name}" already exists as a logged queue; --unlogged changed nothing'
    else:
        text = f'queue "{args.name}" already exists'
    unlogged = args.unlogged if existing is None else existing.is_unlogged
    return print_result(args, {"queue": args.name, "created": existing is None, "unlogged": unlogged}, text)


def _drop(args: argparse.Namespace, broker: Broker) -> int:
    # Nothing to drop, nothing to confirm: a missing queue is said first, without --yes.
    try:
        broker.queue(args.name).policy()
    except QueueNotFound:
        raise _nothing_dropped(args.name) from None
    confirmed(
        args,
        f'drop deletes queue "{args.name}" with its messages and its archive',
        hint=f"Confirm with: pgbroker drop {args.name} --yes",
    )
    if not broker.drop_queue(args.name):
        raise _nothing_dropped(args.name)
    return print_result(
        args, {"queue": args.name, "dropped": True}, f'dropped queue "{args.name}" and its archive'
    )


def _nothing_dropped(name: str) -> CliError:
    return CliError(
        f'queue "{name}" does not exist; nothing dropped',
        code=Exit.NOT_FOUND,
        hint="See the queues with: pgbroker list",
    )


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
    print(json.dumps(_metrics_json(single), indent=2) if wants_json(args) else metrics_table([single]))
    return Exit.OK


def _metrics_json(metrics: Metrics) -> dict[str, object]:
    return timestamped_json(metrics, "scrape_time")
