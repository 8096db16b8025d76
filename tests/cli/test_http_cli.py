"""``pgbroker keys`` and ``pgbroker serve`` parsers, on a parser of their own (pgbroker.cli.main wires
them into the real one)."""

from __future__ import annotations

import argparse
import json
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgbroker._db.api_keys import create_key
from pgbroker._event_loop import LOOP_ENV
from pgbroker.cli.commands import keys as cli_keys
from pgbroker.cli.commands import serve as cli_serve
from pgbroker.cli.support.errors import CliError
from pgbroker.queues._client import Broker
from tests.http.live import LiveServer, free_port, pgbroker_serve
from tests.support.cli import Cli, _assert_error
from tests.support.forwarding import relaying


def run(conn: psycopg.Connection[Any], *argv: str) -> int:
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers(dest="command")
    cli_keys.register(subparsers)
    cli_serve.register(subparsers)
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args, Broker(connection=conn))
    except CliError as exc:  # what pgbroker.cli.main.main turns into the exit code
        return exc.code
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
    assert run(conn, "keys", "revoke", str(listed["id"])) == 0  # revoked already: nothing to do
    assert f"key {listed['id']} was revoked already" in capsys.readouterr().out
    assert run(conn, "keys", "revoke", str(listed["id"] + 1000)) == 4
    assert run(conn, "keys", "list") == 0
    assert "ci" not in capsys.readouterr().out.split("revoked key")[-1]


def test_keys_take_and_show_group_patterns(
    conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["keys", "create", "billing", "--scope", "read", "--queue", "clicks", "--group", "billing"]
    assert run(conn, *argv, "--group", "billing-*", "--json") == 0
    made = json.loads(capsys.readouterr().out)
    assert (made["queues"], made["groups"]) == (["clicks"], ["billing", "billing-*"])
    assert run(conn, "keys", "create", "any", "--scope", "read") == 0  # without --group: every group
    capsys.readouterr()
    assert run(conn, "keys", "list", "--json") == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(k["name"], k["groups"]) for k in listed] == [
        ("billing", ["billing", "billing-*"]),
        ("any", ["*"]),
    ]
    assert run(conn, "keys", "list") == 0
    header, first, second = capsys.readouterr().out.splitlines()
    assert header.split()[:5] == ["id", "name", "scopes", "queues", "groups"]
    assert first.split()[1:5] == ["billing", "read", "clicks", "billing,billing-*"]
    assert second.split()[1:5] == ["any", "read", "*", "*"]
    with pytest.raises(SystemExit):  # --group takes a pattern
        run(conn, "keys", "create", "x", "--scope", "read", "--group")
    assert run(conn, "keys", "create", "x", "--scope", "read", "--group", "") == 2


def test_a_key_is_revoked_by_its_token_too_and_a_token_is_never_echoed(
    conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """Who holds a leaked token has the token at hand, not the id: argparse refused it ('invalid
    int value'), printing the whole token to stderr."""
    assert run(conn, "keys", "create", "leaked", "--scope", "read") == 0
    token = capsys.readouterr().out.strip()
    assert run(conn, "keys", "revoke", token) == 0
    assert capsys.readouterr().out == f"revoked key {token.split('_')[1]}\n"
    assert run(conn, "keys", "revoke", token) == 0  # already revoked: nothing to do
    capsys.readouterr()
    mangled = token.replace("_", "-")
    with pytest.raises(SystemExit) as exited:
        run(conn, "keys", "revoke", mangled)
    assert exited.value.code == 2
    said = capsys.readouterr().err
    assert "expected a key's id (keys list) or its token, got a longer text, not shown" in said
    assert mangled[-20:] not in said


def test_keys_and_serve_on_a_database_without_pgbroker_say_to_install(empty_dsn: str) -> None:
    """Before `pgbroker install`, the keys commands say so (they said only that a relation or
    schema does not exist), and serve does not start: it served, answering every key 401."""
    cli = Cli(empty_dsn)
    for command in (["keys", "create", "ci", "--scope", "admin"], ["keys", "list"], ["keys", "revoke", "1"]):
        _assert_error(cli(*command), 5, "pgbroker is not installed", "hint: Install the schema first")
    with pytest.raises(RuntimeError) as refused, pgbroker_serve(empty_dsn):
        pass
    said = str(refused.value)
    assert "exited with 5 before answering" in said
    assert (
        f"pgbroker: error: pgbroker is not installed in {conninfo_to_dict(empty_dsn)['dbname']} at " in said
    )
    assert "hint: Install the schema first: pgbroker install" in said
    assert "Traceback" not in said


def test_serve_parser() -> None:
    parser = argparse.ArgumentParser()
    cli_serve.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--port", "9000", "--public-metrics"])
    assert (args.port, args.public_metrics, args.host) == (9000, True, "127.0.0.1")


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--port", "80000", "must be a port number from 0 to 65535, got 80000"),  # uvicorn took 14464
        ("--port", "-1", "must be a port number from 0 to 65535, got -1"),
        ("--connections", "0", "must be at least 1, got 0"),  # exit 70, 'a bug in pgbroker'
        ("--max-concurrency", "0", "must be at least 1, got 0"),  # every request 503
        ("--max-body", "-1", "must be at least 1, got -1"),  # every body 413
        ("--rate", "-1", "must be a number > 0, got -1"),  # past the burst, 429 with a negative Retry-After
        ("--rate", "0", "must be a number > 0, got 0"),  # past the burst, 500: a division by zero
        ("--burst", "0", "must be a number > 0, got 0"),
        ("--auth-failure-rate", "0", "must be a number > 0, got 0"),
        ("--auth-failure-burst", "-1", "must be a number > 0, got -1"),
        ("--max-wait", "-1", "must be a duration >= 0, got -1"),  # a read's wait: 'at most -1'
        # every connection closed at once: answered or not by a race
        ("--head-timeout", "0", "must be a duration > 0, got 0"),
        ("--body-timeout", "nan", "expected a duration: seconds (30, 1.5) or a number with a unit"),
        ("--keep-alive", "-1", "must be a duration >= 0, got -1"),
    ],
)
def test_serve_refuses_a_setting_it_cannot_serve_with(
    option: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each was taken as given: the server started and refused requests, or bound another port
    than the one asked, or failed as a bug of pgbroker's."""
    parser = argparse.ArgumentParser()
    cli_serve.register(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["serve", option, value])
    assert exited.value.code == 2
    assert f"argument {option}: {said}" in capsys.readouterr().err


def test_serve_on_an_address_it_cannot_have_says_why_in_its_own_words(dsn: str) -> None:
    """uvicorn logged 'ERROR:    [Errno 98] error while attempting to bind ...' and exited 3, which
    pgbroker --help lists as a stale receipt."""
    cli = Cli(dsn)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        _assert_error(
            cli("serve", "--port", str(port)),
            2,
            f"pgbroker: error: cannot listen on 127.0.0.1:{port}: Address already in use",
            "hint: Another process listens there",
        )
    # An address of no interface here (TEST-NET-1): the bind fails on this machine, no packet sent.
    _assert_error(
        cli("serve", "--host", "192.0.2.1", "--port", str(port)),
        2,
        f"pgbroker: error: cannot listen on 192.0.2.1:{port}: Cannot assign requested address",
        "hint: No interface of this machine has that address",
    )


def test_serve_runs_through_the_cli_and_stops_cleanly_on_sigterm(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    _, token = create_key(conn, "cli", scopes=["admin"])
    headers = {"Authorization": f"Bearer {token}"}
    conn.execute("SELECT pgmq.create('jobs')")
    with pgbroker_serve(dsn, "--max-wait", "5") as server:
        assert (
            httpx.get(f"{server.url}/v1/queues", headers=headers).json()["queues"][0]["queue_name"] == "jobs"
        )
        # Without -v too, the one line that says where to go.
        where = f"serving the API at {server.url}/v1 and the dashboard at {server.url}/dashboard"
        assert where in server.log()
        assert "(event loop uvloop; stop: Ctrl-C or SIGTERM)" in server.log()
        # A long poll in flight when SIGTERM comes is answered before the server exits.
        with ThreadPoolExecutor(1) as pool:
            reading = pool.submit(
                httpx.post, f"{server.url}/v1/queues/jobs/read", json={"wait": 2}, headers=headers, timeout=10
            )
            time.sleep(0.5)
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            assert server.process.wait(timeout=15) == 0
            assert reading.result().json() == {"messages": []}
        assert time.monotonic() - started < 10
        assert "Traceback" not in server.log(), server.log()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{server.url}/healthz")


def test_serve_stopped_with_ctrl_c_exits_0_as_a_worker_does(dsn: str) -> None:
    """Ctrl-C is how a server run in a terminal is stopped: a graceful stop, a success, as for
    SIGTERM and for `pgbroker worker` (it exited 130, interrupted)."""
    with pgbroker_serve(dsn) as server:
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=30) == 0, server.log()
        assert "Traceback" not in server.log(), server.log()


def test_serve_runs_on_the_loop_it_is_told(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pgbroker_serve(dsn, "--loop", "asyncio") as server:
        assert httpx.get(f"{server.url}/healthz").status_code == 200
        assert "(event loop asyncio; stop: Ctrl-C or SIGTERM)" in server.log()
    monkeypatch.setenv(LOOP_ENV, "tokio")
    with pytest.raises(RuntimeError) as refused, pgbroker_serve(dsn):
        pass
    said = str(refused.value)
    assert "exited with 2 before answering" in said
    assert f"pgbroker: error: ${LOOP_ENV} must be one of auto, asyncio, uvloop, got 'tokio'" in said


def _lines_about(log: str, port: int) -> list[str]:
    return [line for line in log.splitlines() if f"127.0.0.1:{port}" in line or f"port {port}" in line]


def _wait_for_log(server: LiveServer, text: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while server.log().count(text) < count:
        assert time.monotonic() < deadline, f"no {count} x {text!r} in:\n{server.log()}"
        time.sleep(0.1)


def _from_the_primary(stats: httpx.Response) -> bool:
    return stats.status_code == 200 and stats.json()["replica_lag_seconds"] is None


def test_serve_with_a_replica_down_says_it_once_reads_from_the_primary_and_says_when_it_is_back(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """With --replica-dsn naming a server that was down, serve logged psycopg_pool's 'error
    connecting in pgbroker-http-replica' for each of its connections at every retry (about 40
    warnings in the first seconds) and answered the reports 503 (or after --pool-timeout) until
    it was back. Now one warning says the replica is unreachable and the reports read from the
    primary; retries are quiet, with back-off; one line says when it answers again, and the
    reports read from it then. A replica lost while serving is said once the same way."""
    conn.execute("SELECT pgmq.create('jobs')")
    _, token = create_key(conn, "reports", scopes=["send", "read"])
    port = free_port()  # nobody listens on it: the replica is down
    replica_dsn = make_conninfo(dsn, host="127.0.0.1", port=str(port))
    with (
        pgbroker_serve(dsn, "--replica-dsn", replica_dsn) as server,
        httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {token}"}, timeout=60) as http,
    ):
        stats = http.get("/v1/stats")
        assert _from_the_primary(stats), stats.text  # no lag to report: not from a replica
        time.sleep(5)  # the retries of the first seconds, which were the noisiest
        [said] = _lines_about(server.log(), port)
        assert "serve.replica_unreachable" in said
        assert "Connection refused" in said
        assert "reports are read from the primary until the replica answers" in said
        assert "error connecting" not in server.log()

        with relaying(port, dsn):
            _wait_for_log(server, "serve.replica_back", 1)
            assert http.get("/v1/stats").json()["replica_lag_seconds"] == 0  # the replica's (a primary)
            assert http.post("/v1/queues/jobs/messages", json={"message": {"n": 1}}).status_code == 201
        # Lost while serving: said once, and the reports go back to the primary.
        _wait_for_log(server, "serve.replica_unreachable", 2)
        deadline = time.monotonic() + 60
        while not _from_the_primary(http.get("/v1/stats")):
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.1)
        time.sleep(3)
        about = _lines_about(server.log(), port)
        assert [line.split()[1] for line in about] == [
            "serve.replica_unreachable", "serve.replica_back", "serve.replica_unreachable",
        ], server.log()  # fmt: skip
        assert "error connecting" not in server.log()
        assert "Traceback" not in server.log(), server.log()
