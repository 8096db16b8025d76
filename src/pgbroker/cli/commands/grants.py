"""``pgbroker grant``, ``revoke`` and ``grants``: database roles scoped to queues.

A grant lets an existing role act as a producer, consumer or monitor on the queues whose names
match a glob, and on no other (sql/functions/15_scopes.sql). It needs the roles of
``pgbroker install --roles``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from pgbroker._db.install import grant_queue_access, list_queue_grants, revoke_queue_access
from pgbroker._db.install_rules import QueueGrant
from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.output import plural, print_each, print_listing, print_result, timestamped_json
from pgbroker.cli.support.parsers import Subcommands, add_command
from pgbroker.cli.support.patterns import say_if_unmatched
from pgbroker.cli.support.tables import local_time, table
from pgbroker.queues._client import Broker

__all__ = ["register"]

KINDS = ("producer", "consumer", "monitor")


def register(subcommands: Subcommands) -> None:
    sub = add_command(subcommands, "grant", "let a database role use some queues as one role kind", _grant)
    _add_role_arguments(sub)
    sub.add_argument(
        "--queue",
        action="append",
        dest="queues",
        metavar="GLOB",
        required=True,
        help="queues it may use: a name or a glob (* any characters, ? one), any letter case (repeat)",
    )

    sub = add_command(subcommands, "revoke", "take queue grants back from a database role", _revoke)
    _add_role_arguments(sub)
    which = sub.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--queue", action="append", dest="queues", metavar="GLOB", help="a grant's glob (repeat)"
    )
    which.add_argument("--all", action="store_true", help="every grant of that kind to the role")

    add_command(subcommands, "grants", "list the queue grants of database roles", _list)


def _add_role_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=KINDS, help="what the role may do on the queues")
    parser.add_argument("role", metavar="ROLE", help="an existing database role (CREATE ROLE ... LOGIN)")


def _grant(args: argparse.Namespace, broker: Broker) -> int:
    with broker.connection() as conn:
        for pattern in args.queues:
            added = grant_queue_access(conn, args.kind, args.role, pattern)
            record = {"role": args.role, "kind": args.kind, "queues": pattern, "granted": added}
            print_each(args, [record], _grant_text)
    say_if_unmatched(broker, args.queues, streams=False)
    return Exit.OK


def _grant_text(record: Mapping[str, Any]) -> str:
    state = "granted" if record["granted"] else "already granted"
    return f"{state}: {record['role']} may act as {record['kind']} on queues matching {record['queues']!r}"


def _revoke(args: argparse.Namespace, broker: Broker) -> int:
    patterns: list[str | None] = [None] if args.all else list(args.queues)
    removed = 0
    with broker.connection() as conn:
        for pattern in patterns:
            removed += revoke_queue_access(conn, args.kind, args.role, pattern)
    if not removed:
        raise CliError(
            f"{args.role} has no such {args.kind} grant; nothing revoked",
            code=Exit.NOT_FOUND,
            hint="See pgbroker grants.",
        )
    text = f"revoked {plural(removed, args.kind + ' grant')} from {args.role}"
    return print_result(args, {"role": args.role, "kind": args.kind, "revoked": removed}, text)


def _list(args: argparse.Namespace, broker: Broker) -> int:
    with broker.connection() as conn:
        grants = list_queue_grants(conn)
    return print_listing(
        args,
        grants,
        lambda grant: timestamped_json(grant, "granted_at"),
        _table,
        empty="no queue grants (add one with: pgbroker grant KIND ROLE --queue GLOB)",
    )


def _table(grants: Sequence[QueueGrant]) -> str:
    rows = [[g.role_name, g.role_kind, g.pattern, local_time(g.granted_at)] for g in grants]
    return table(["role", "kind", "queues", "granted"], rows)
