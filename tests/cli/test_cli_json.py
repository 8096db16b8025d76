"""``--json`` on every command that prints a result: its stdout is JSON alone (one object, an array,
or JSON lines, one object per item), for scripts; the commands that run until stopped (worker,
scheduler, serve, bridges, Spark pipelines) print logs instead and take no --json."""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgbroker.cli.main import build_parser, main

# Commands that run until they are stopped: what they print is progress and logs, not a result.
RUN_UNTIL_STOPPED = {"worker", "scheduler", "serve", "bridge out", "bridge in", "pipeline"}


def _leaf_commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                inner = _leaf_commands(sub, f"{prefix}{name} ")
                found.update(inner or {f"{prefix}{name}": sub})
    return found


def test_every_command_that_prints_a_result_takes_json() -> None:
    commands = _leaf_commands(build_parser())
    assert commands.keys() >= RUN_UNTIL_STOPPED
    without = {
        name for name, parser in commands.items() if not any(a.dest == "json" for a in parser._actions)
    }
    assert without == RUN_UNTIL_STOPPED


def _json(capsys: pytest.CaptureFixture[str], dsn: str, *args: str) -> list[Any]:
    """Run a command with --json in this process: each line of stdout, parsed (an indented
    document counts as one)."""
    code = main(["--dsn", dsn, *args, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    try:
        return [json.loads(out)]
    except json.JSONDecodeError:
        return [json.loads(line) for line in out.splitlines()]


def test_each_commands_json_output_is_its_result(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    def run(*args: str) -> list[Any]:
        return _json(capsys, dsn, *args)

    [installed] = run("install")
    assert installed["changed"] is False
    assert isinstance(installed["version"], str)
    assert run("create", "orders") == [{"queue": "orders", "created": True, "unlogged": False}]
    assert run("create", "orders") == [{"queue": "orders", "created": False, "unlogged": False}]
    [first] = run("send", "orders", '{"id": 1}')
    assert set(first) == {"msg_id"}
    run("send", "orders", '{"id": 2}')
    run("send", "orders", '{"id": 3}')
    [read] = run("read", "orders")
    assert read["msg_id"] == first["msg_id"]
    assert run("ack", "orders", read["receipt"]) == [{"msg_id": first["msg_id"]}]
    [second] = run("read", "orders")
    [extended] = run("extend", "orders", second["receipt"], "--vt", "60")
    assert extended["msg_id"] == second["msg_id"]
    assert extended["receipt"] != second["receipt"]
    assert run("nack", "orders", extended["receipt"]) == [{"msg_id": second["msg_id"]}]
    assert run("archive", "orders", str(second["msg_id"])) == [{"msg_id": second["msg_id"]}]
    [third] = run("pop", "orders")
    assert third["msg_id"] == second["msg_id"] + 1
    run("send", "orders", '{"id": 4}')
    [fourth] = run("peek", "orders")
    assert run("delete", "orders", str(fourth["msg_id"])) == [{"msg_id": fourth["msg_id"]}]
    run("send", "orders", '{"id": 5}')
    assert run("purge", "orders", "--yes") == [{"queue": "orders", "purged": 1}]
    assert run("pause", "orders") == [{"queue": "orders", "paused": True, "changed": True}]
    assert run("resume", "orders") == [{"queue": "orders", "paused": False, "changed": True}]

    run("policy", "set", "orders", "--max-deliveries", "1")
    run("send", "orders", '{"id": 6}')
    [sixth] = run("read", "orders")
    main(["--dsn", dsn, "nack", "orders", sixth["receipt"]])
    capsys.readouterr()
    assert run("read", "orders") == []  # the read that dead-letters it (delivered once already)
    assert run("dlq", "replay", "orders") == [{"queue": "orders", "replayed": 1}]
    [again] = run("read", "orders")
    main(["--dsn", dsn, "nack", "orders", again["receipt"]])
    run("read", "orders")
    assert run("dlq", "purge", "orders", "--yes") == [{"queue": "orders", "purged": 1}]
    [maintained] = run("maintain")
    assert maintained == {"dedup_keys_forgotten": 0, "archived_deleted": {}}

    run("stream", "create", "clicks", "--partitions", "1")
    [sent] = run("stream", "send", "clicks", '{"x": 1}', "--key", "k")
    assert set(sent) == {"id"}
    assert run("stream", "create-group", "clicks", "g", "--start", "start") == [
        {"stream": "clicks", "group": "g", "retry_queue": "clicks_g_retry"}
    ]
    [clicked] = run("stream", "read", "clicks", "g")
    assert clicked["id"] == sent["id"]
    assert run("stream", "maintain", "clicks") == [{"stream": "clicks", "emptied": 0}]
    dropped = run("stream", "drop-group", "clicks", "g", "--yes")
    assert dropped == [{"stream": "clicks", "group": "g", "dropped": True}]
    assert run("stream", "drop", "clicks", "--yes") == [{"stream": "clicks", "dropped": True}]

    [key] = run("keys", "create", "ops", "--scope", "read")
    assert run("keys", "revoke", str(key["id"])) == [{"revoked": key["id"]}]
    assert run("drop", "orders", "--yes") == [{"queue": "orders", "dropped": True}]


def test_grant_and_revoke_print_json(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"j{uuid.uuid4().hex[:10]}"
    role = f"{prefix}_user"
    [installed] = _json(capsys, dsn, "install", "--roles", "--role-prefix", prefix)
    assert set(installed["roles"]) == {f"{prefix}_{kind}" for kind in ("producer", "consumer", "monitor")}
    roles = sql.SQL(", ").join(sql.Identifier(name) for name in [role, *installed["roles"]])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
    try:
        assert _json(capsys, dsn, "grant", "consumer", role, "--queue", "ord*") == [
            {"role": role, "kind": "consumer", "queues": "ord*", "granted": True}
        ]
        assert _json(capsys, dsn, "revoke", "consumer", role, "--all") == [
            {"role": role, "kind": "consumer", "revoked": 1}
        ]
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(roles))
            conn.execute(sql.SQL("DROP ROLE {}").format(roles))
