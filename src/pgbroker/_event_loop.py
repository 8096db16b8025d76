"""The event loop that pgbroker's own long-running entry points run on: ``pgbroker worker``,
``pgbroker scheduler``, ``pgbroker bridge``, ``App.run()``, and ``pgbroker serve`` (through uvicorn,
which takes the same names).

uvloop where it is installed (it comes with pgbroker on Linux and macOS), as PgQueuer's CLI and
uvicorn choose: a worker's own time a message is mostly the event loop's (a timer, a future, a
socket wake-up per handler run and per round trip), and uvloop does that in about half the CPU.
``asyncio`` is the standard library's loop, for whoever needs it (a debugger, a library that
knows only it); ``uvloop`` insists on uvloop and fails when it is missing.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar, cast, get_args

from pgbroker.errors import InvalidArgument

__all__ = ["LOOP_ENV", "LOOP_NAMES", "LoopName", "chosen", "loop_factory", "run", "running_loop"]

T = TypeVar("T")
LoopName = Literal["auto", "asyncio", "uvloop"]
LOOP_NAMES: tuple[LoopName, ...] = get_args(LoopName)
# The loop when a caller names none (`auto` without it).
LOOP_ENV = "PGBROKER_LOOP"


def chosen(loop: LoopName | None = None) -> LoopName:
    """The loop asked for: ``loop``, else $PGBROKER_LOOP, else auto."""
    name = loop or os.environ.get(LOOP_ENV) or "auto"
    if name not in LOOP_NAMES:
        source = "loop" if loop else f"${LOOP_ENV}"
        raise InvalidArgument(f"{source} must be one of {', '.join(LOOP_NAMES)}, got {name!r}")
    return name


def loop_factory(loop: LoopName | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of the loop chosen(loop) names; None for the standard library's own."""
    name = chosen(loop)
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if name == "uvloop":
            raise InvalidArgument(
                "the uvloop event loop is not installed",
                hint="pip install uvloop, or choose the asyncio loop",
            ) from None
        return None
    return cast(Callable[[], asyncio.AbstractEventLoop], uvloop.new_event_loop)


def run(main: Coroutine[Any, Any, T], loop: LoopName | None = None) -> T:
    """``asyncio.run(main)`` on the loop ``loop`` names (see loop_factory)."""
    try:
        factory = loop_factory(loop)
    except BaseException:
        main.close()  # never awaited: say nothing of it
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_loop() -> str:
    """The package of the running event loop ("uvloop", "asyncio"), for the workers' start-up logs."""
    return type(asyncio.get_running_loop()).__module__.partition(".")[0]
