"""The event loop of pgbroker's long-running entry points (pgbroker._event_loop): uvloop unless
told otherwise, the standard library's loop on request, and a clear error for a loop it cannot
give, before anything runs."""

from __future__ import annotations

import inspect
import sys

import pytest

from pgbroker._event_loop import LOOP_ENV, run, running_loop
from pgbroker.errors import InvalidArgument


async def _loop_name() -> str:
    return running_loop()


def test_uvloop_by_default_and_asyncio_s_own_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LOOP_ENV, raising=False)
    assert run(_loop_name()) == "uvloop"
    assert run(_loop_name(), "auto") == "uvloop"
    assert run(_loop_name(), "asyncio") == "asyncio"
    assert run(_loop_name(), "uvloop") == "uvloop"


def test_the_environment_chooses_when_the_caller_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOOP_ENV, "asyncio")
    assert run(_loop_name()) == "asyncio"
    assert run(_loop_name(), "uvloop") == "uvloop"  # the caller's choice wins


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LOOP_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert run(_loop_name()) == "asyncio"
    coroutine = _loop_name()
    with pytest.raises(InvalidArgument, match="uvloop event loop is not installed") as raised:
        run(coroutine, "uvloop")
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED
    assert raised.value.hint == "pip install uvloop, or choose the asyncio loop"


@pytest.mark.parametrize(
    ("argument", "env", "named"), [("trio", None, "loop"), (None, "tokio", f"${LOOP_ENV}")]
)
def test_an_unknown_loop_is_an_invalid_argument_and_nothing_runs(
    monkeypatch: pytest.MonkeyPatch, argument: str | None, env: str | None, named: str
) -> None:
    if env is None:
        monkeypatch.delenv(LOOP_ENV, raising=False)
    else:
        monkeypatch.setenv(LOOP_ENV, env)
    ran = []

    async def main() -> None:
        ran.append(True)

    coroutine = main()
    with pytest.raises(InvalidArgument) as raised:
        run(coroutine, argument)  # type: ignore[arg-type]
    assert str(raised.value) == f"{named} must be one of auto, asyncio, uvloop, got {argument or env!r}"
    assert ran == []
    # Closed, so that no "coroutine ... was never awaited" warning follows the error.
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED
