"""Which pooler pgbroker is behind (pgbroker._db.dsn.pooler_mode): the ``pooler`` argument, else
$PGBROKER_POOLER, else none; and a bad value of either is refused before anything connects."""

from __future__ import annotations

import pytest

from pgbroker import AsyncBroker, Broker
from pgbroker._db.dsn import POOLER_ENV, behind_transaction_pooler, connection_kwargs, pooler_mode
from pgbroker.errors import InvalidArgument


@pytest.fixture(autouse=True)
def no_pooler_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POOLER_ENV, raising=False)


def test_nothing_said_means_no_pooler() -> None:
    assert pooler_mode() == "none"
    assert connection_kwargs() == {}


@pytest.mark.parametrize("mode", ["transaction", "session", "none", "Transaction"])
def test_the_argument_names_the_mode(mode: str) -> None:
    assert pooler_mode(mode) == mode.lower()


def test_the_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOLER_ENV, "transaction")
    assert behind_transaction_pooler()
    assert not behind_transaction_pooler("none")
    assert not behind_transaction_pooler("session")
    assert connection_kwargs("transaction") == {"prepare_threshold": None}
    monkeypatch.setenv(POOLER_ENV, "none")
    assert behind_transaction_pooler("transaction")


def test_a_bad_argument_is_refused_naming_the_argument() -> None:
    with pytest.raises(InvalidArgument, match=r"pooler must be one of transaction, session, none, not 'txn'"):
        pooler_mode("txn")


def test_a_bad_environment_value_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POOLER_ENV, "statement")
    with pytest.raises(InvalidArgument, match=POOLER_ENV):
        pooler_mode()


def test_a_client_refuses_a_bad_pooler_before_connecting() -> None:
    # Port 1 of localhost: nothing listens there, and nothing is tried.
    with pytest.raises(InvalidArgument, match="pooler"):
        Broker("postgresql://127.0.0.1:1/none", pooler="txn")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="pooler"):
        AsyncBroker("postgresql://127.0.0.1:1/none", pooler="txn")  # type: ignore[arg-type]
