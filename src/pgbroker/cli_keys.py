"""``pgbroker keys create|list|revoke``: the API keys of the HTTP API (pgbroker.http.auth).

``register(subparsers)`` adds the commands to pgbroker's parser. The token is printed once, by
create; the database keeps only its hash.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from pgbroker.cli import (
    EXIT_NOTHING_DONE,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    _add_global_options,
    _table,
    _timestamp,
)
from pgbroker.client import Broker
from pgbroker.http.auth import SCOPES, ApiKey, create_key, list_keys, revoke_key

__all__ = ["register"]

Command = Callable[[argparse.Namespace, Broker], int]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``keys create|list|revoke`` to pgbroker's parser."""
    keys = subparsers.add_parser(
        "keys", help="API keys of the HTTP API", description="API keys of the HTTP API"
    )
    actions = keys.add_subparsers(dest="keys_action", metavar="ACTION", required=True)

    def command(
        name: str, summary: str, handler: Command, *, json_output: bool = False
    ) -> argparse.ArgumentParser:
        sub = actions.add_parser(
            name, help=summary, description=summary, epilog="exit codes: see pgbroker --help"
        )
        _add_global_options(sub, top_level=False, json_output=json_output)
        sub.set_defaults(handler=handler)
        return sub

    sub = command(
        "create", "create a key and print its token (shown only once)", _cmd_create, json_output=True
    )
    sub.add_argument("name", help="what the key is for")
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
        help="queues it may use, a glob pattern (repeat; default: every queue)",
    )
    sub.add_argument(
        "--rate", type=float, metavar="PER_SECOND", help="its own rate limit (default: the server's)"
    )

    sub = command("list", "list the keys (never their tokens)", _cmd_list, json_output=True)
    sub.add_argument("--all", action="store_true", help="include revoked keys")

    sub = command("revoke", "revoke a key by id", _cmd_revoke)
    sub.add_argument("id", type=int, help="the key's id (see keys list)")


def _key_json(key: ApiKey) -> dict[str, object]:
    return {
        "id": key.id,
        "name": key.name,
        "queues": list(key.queues),
        "scopes": sorted(key.scopes),
        "rate_per_second": key.rate_per_second,
        "created_at": key.created_at.isoformat(),
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }


def _cmd_create(args: argparse.Namespace, broker: Broker) -> int:
    if args.rate is not None and not args.rate > 0:
        raise CliError(f"--rate must be > 0, got {args.rate}", code=EXIT_USAGE)
    with broker.connection() as conn:
        try:
            key, token = create_key(
                conn, args.name, scopes=args.scopes, queues=args.queues or ["*"], rate_per_second=args.rate
            )
        except ValueError as exc:
            raise CliError(str(exc), code=EXIT_USAGE) from None
    if getattr(args, "json", False):
        print(json.dumps({**_key_json(key), "token": token}))
    else:
        print(token)
    return EXIT_OK


def _cmd_list(args: argparse.Namespace, broker: Broker) -> int:
    with broker.connection() as conn:
        keys = list_keys(conn, include_revoked=args.all)
    if getattr(args, "json", False):
        for key in keys:
            print(json.dumps(_key_json(key)))
        return EXIT_OK
    rows = [
        [
            str(k.id),
            k.name,
            ",".join(sorted(k.scopes)),
            ",".join(k.queues),
            "" if k.rate_per_second is None else f"{k.rate_per_second:g}/s",
            _timestamp(k.created_at),
            _timestamp(k.revoked_at) if k.revoked_at else "",
        ]
        for k in keys
    ]
    print(_table(["id", "name", "scopes", "queues", "rate", "created", "revoked"], rows, right_aligned=[0]))
    return EXIT_OK


def _cmd_revoke(args: argparse.Namespace, broker: Broker) -> int:
    with broker.connection() as conn:
        if not revoke_key(conn, args.id):
            raise CliError(
                f"no live key with id {args.id}", code=EXIT_NOTHING_DONE, hint="See pgbroker keys list --all."
            )
    print(f"revoked key {args.id}")
    return EXIT_OK
