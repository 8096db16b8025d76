"""``pgbroker keys create|list|revoke``: the API keys of the HTTP API (pgbroker._db.api_keys).

The token is printed once, by create; the database keeps only its hash. Managing keys needs no
HTTP server, so these commands work without the ``http`` extra.
"""

from __future__ import annotations

import argparse
import re

from pgbroker._db.api_keys import SCOPES, ApiKey, create_key, list_keys, revoke_key
from pgbroker.cli.support.arguments import positive_number
from pgbroker.cli.support.connecting import require_installed
from pgbroker.cli.support.errors import CliError, Exit
from pgbroker.cli.support.output import print_each, print_result, wants_json
from pgbroker.cli.support.parsers import Subcommands, add_command, add_group
from pgbroker.cli.support.patterns import say_if_unmatched
from pgbroker.cli.support.tables import local_time, table
from pgbroker.queues._client import Broker

__all__ = ["register"]


def register(subcommands: Subcommands) -> None:
    actions = add_group(subcommands, "keys", "API keys of the HTTP API")
    summary = "create a key and print its token (shown only once)"
    sub = add_command(actions, "create", summary, _create)
    sub.add_argument("name", metavar="NAME", help="what the key is for")
    sub.add_argument(
        "--scope",
        action="append",
        choices=SCOPES,
        required=True,
        dest="scopes",
        help="an operation it may do (repeat; admin implies all)",
    )
    sub.add_argument(
        "--queue",
        action="append",
        dest="queues",
        metavar="GLOB",
        help="queues (and streams) it may use, a glob pattern (repeat; default: every queue)",
    )
    sub.add_argument(
        "--group",
        action="append",
        dest="groups",
        metavar="GLOB",
        help="consumer groups of its streams it may use (read, ack, make, see), a glob pattern matched"
        " with letter case, as group names are (repeat; default: every group)",
    )
    sub.add_argument(
        "--rate",
        type=positive_number,
        metavar="PER_SECOND",
        help="its own rate limit, requests a second > 0 (default: the server's)",
    )

    sub = add_command(actions, "list", "list the keys (never their tokens)", _list)
    sub.add_argument("--all", action="store_true", help="include revoked keys")

    sub = add_command(actions, "revoke", "revoke a key by id, or by its token", _revoke)
    sub.add_argument("id", type=_key_id, metavar="ID", help="the key's id (see keys list), or its token")


def _key_id(text: str) -> int:
    """A key's id, written as the number or as the token that carries it (pgb_<id>_<secret>): the
    token is what someone holding a leaked one has at hand."""
    found = re.fullmatch(r"([0-9]{1,18})|pgb_([0-9]{1,18})_\S+", text.strip())
    if found is None:
        shown = repr(text) if len(text) <= 20 else "a longer text, not shown: it may be a token"
        raise argparse.ArgumentTypeError(f"expected a key's id (keys list) or its token, got {shown}")
    return int(found[1] or found[2])


def _key_json(key: ApiKey) -> dict[str, object]:
    return {
        "id": key.id,
        "name": key.name,
        "queues": list(key.queues),
        "groups": list(key.groups),
        "scopes": sorted(key.scopes),
        "rate_per_second": key.rate_per_second,
        "created_at": key.created_at.isoformat(),
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }


def _create(args: argparse.Namespace, broker: Broker) -> int:
    require_installed(broker)
    with broker.connection() as conn:
        try:
            key, token = create_key(
                conn,
                args.name,
                scopes=args.scopes,
                queues=args.queues or ["*"],
                groups=args.groups or ["*"],
                rate_per_second=args.rate,
            )
        except ValueError as exc:
            raise CliError(str(exc), code=Exit.USAGE) from None
    say_if_unmatched(broker, args.queues or [], streams=True)
    return print_result(args, {**_key_json(key), "token": token}, token)


def _list(args: argparse.Namespace, broker: Broker) -> int:
    require_installed(broker)
    with broker.connection() as conn:
        keys = list_keys(conn, include_revoked=args.all)
    if wants_json(args):
        print_each(args, map(_key_json, keys), str)
        return Exit.OK
    rows = [
        [
            str(k.id),
            k.name,
            ",".join(sorted(k.scopes)),
            ",".join(k.queues),
            ",".join(k.groups),
            "" if k.rate_per_second is None else f"{k.rate_per_second:g}/s",
            local_time(k.created_at),
            local_time(k.revoked_at) if k.revoked_at else "",
        ]
        for k in keys
    ]
    print(
        table(
            ["id", "name", "scopes", "queues", "groups", "rate", "created", "revoked"],
            rows,
            right_aligned=[0],
        )
    )
    return Exit.OK


def _revoke(args: argparse.Namespace, broker: Broker) -> int:
    require_installed(broker)
    with broker.connection() as conn:
        if revoke_key(conn, args.id):
            return print_result(args, {"revoked": args.id}, f"revoked key {args.id}")
        # Revoked already: nothing to do, like a pause of a paused queue; no such key: not found.
        if all(key.id != args.id for key in list_keys(conn, include_revoked=True)):
            raise CliError(
                f"no key with id {args.id}", code=Exit.NOT_FOUND, hint="See pgbroker keys list --all."
            )
    return print_result(args, {"revoked": args.id}, f"key {args.id} was revoked already")
