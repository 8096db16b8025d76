"""Fixtures of the CLI tests: the command bound to the test's database, and a queue made with it."""

from __future__ import annotations

import pytest

from tests.support.cli import Cli


@pytest.fixture
def cli(dsn: str) -> Cli:
    return Cli(dsn)


@pytest.fixture
def orders(cli: Cli) -> str:
    cli.ok("create", "orders")
    return "orders"
