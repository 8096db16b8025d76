"""``pgbroker keys`` and ``pgbroker serve`` parsers, on a parser of their own (pgbroker.cli wires
them into the real one)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import psycopg
import pytest

from pgbroker import cli_keys, cli_serve
from pgbroker.client import Broker


def run(conn: psycopg.Connection[Any], *argv: str) -> int:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="command")
    cli_keys.register(subparsers)
    cli_serve.register(subparsers)
    args = parser.parse_args(argv)
    code: int = args.handler(args, Broker(connection=conn))
    return code


def test_keys_commands(conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert run(conn, "keys", "create", "ci", "--scope", "send", "--scope", "read", "--queue", "jobs-*") == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("pgb_")
    assert run(conn, "keys", "list", "--json") == 0
    [listed] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (listed["name"], listed["scopes"], listed["queues"]) == ("ci", ["read", "send"], ["jobs-*"])
    assert token not in json.dumps(listed)
    assert run(conn, "keys", "revoke", str(listed["id"])) == 0
    assert run(conn, "keys", "revoke", str(listed["id"])) == 1
    assert run(conn, "keys", "list") == 0
    assert "ci" not in capsys.readouterr().out.split("revoked key")[-1]
    assert run(conn, "keys", "create", "x", "--scope", "read", "--rate", "0") == 2


def test_serve_parser() -> None:
    parser = argparse.ArgumentParser()
    cli_serve.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--port", "9000", "--public-metrics"])
    assert (args.port, args.public_metrics, args.host) == (9000, True, "127.0.0.1")
