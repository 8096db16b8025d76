"""The pools a broker opens from a DSN: timeouts judged before anything, and a server that cannot
be reached fails at once with libpq's own words (not a PoolTimeout 30 s later). Nothing listens
on the closed port these tests use."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from psycopg.conninfo import conninfo_to_dict

from pgbroker import Broker
from pgbroker.cli.main import build_parser
from pgbroker.cli.support.connecting import dsn_of
from pgbroker.errors import DatabaseError, InvalidArgument
from pgbroker.queues._client_async import AsyncBroker

# Refused at once: the bound is for a loaded machine, far under the 30 s of a PoolTimeout.
FAILS_WITHIN = 10.0


def closed_port_dsn() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return f"host=127.0.0.1 port={port} dbname=nothing user=nobody"


def test_a_broker_on_a_server_that_cannot_be_reached_fails_at_once_with_the_cause() -> None:
    started = time.monotonic()
    with pytest.raises(DatabaseError, match="refused") as info, Broker(closed_port_dsn()) as broker:
        broker.list_queues()
    assert time.monotonic() - started < FAILS_WITHIN
    assert info.value.hint is not None


def test_an_async_broker_on_a_server_that_cannot_be_reached_fails_at_once_with_the_cause() -> None:
    async def attempt() -> None:
        async with AsyncBroker(closed_port_dsn()) as broker:
            await broker.list_queues()

    started = time.monotonic()
    with pytest.raises(DatabaseError, match="refused"):
        asyncio.run(attempt())
    assert time.monotonic() - started < FAILS_WITHIN


@pytest.mark.parametrize("option", ["connect_timeout", "pool_timeout"])
@pytest.mark.parametrize("value", [0, -1, True, "5"])
def test_timeouts_are_judged_before_connecting(option: str, value: object) -> None:
    with pytest.raises(InvalidArgument, match=option):
        AsyncBroker(closed_port_dsn(), **{option: value})  # type: ignore[arg-type]


def test_the_cli_gives_its_processes_the_dsn_as_given_with_its_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    given = "host=db-a.internal,db-b.internal port=5432,5433 dbname=app target_session_attrs=read-write"
    params = conninfo_to_dict(dsn_of(given, connect_timeout=2.5))
    assert params == {**conninfo_to_dict(given), "connect_timeout": "3"}
    own = conninfo_to_dict(dsn_of(f"{given} connect_timeout=7", connect_timeout=2.5))
    assert own["connect_timeout"] == "7"  # the DSN's own wins


LONG_RUNNING = [["worker", "m:app"], ["serve"], ["scheduler"], ["bridge", "out", "--queue", "q"]]


@pytest.mark.parametrize("command", LONG_RUNNING)
def test_the_cli_takes_a_pool_timeout_for_its_long_running_processes(command: list[str]) -> None:
    parser = build_parser()
    assert parser.parse_args([*command]).pool_timeout == 30
    assert parser.parse_args(["--pool-timeout", "2.5", *command]).pool_timeout == 2.5
    assert parser.parse_args([*command, "--pool-timeout", "4"]).pool_timeout == 4
    with pytest.raises(SystemExit):
        parser.parse_args(["--pool-timeout", "0", *command])
