"""Stopping on SIGTERM and SIGINT: the one place where pgbroker's long-running processes (workers
under App, the scheduler alone, the bridges, `pgbroker serve`) install their signal handlers.

A long-running command holds the stop signals from its first moment (hold_stop_signals) until its
event loop handles them (on_stop_signals), which then acts on any held one at once: a SIGTERM that
came while it connected, waited for the database or announced itself met the default action before
(exit -15, whatever was half done left so), and is now a clean stop (exit 0).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = [
    "STOP_SIGNALS",
    "hold_stop_signals",
    "holding_stop_signals",
    "on_stop_signals",
    "release_stop_signals",
    "stop_asked_within",
    "take_held",
]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

# Stop signals held and not yet acted on, in the order they came; and whether any came at all.
_held: list[int] = []
_asked = threading.Event()


def hold_stop_signals() -> None:
    """From now on, SIGTERM and SIGINT are kept for the loop that will handle them (on_stop_signals,
    take_held) instead of ending the process; a second SIGINT (Ctrl-C twice) still interrupts at
    once (KeyboardInterrupt), for a start that hangs. Main thread only. Unblocks them too: one the
    command's entry blocked until now (pgbroker.cli.entry) comes at once, and is held."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _hold)
    release_stop_signals()


def release_stop_signals() -> None:
    """SIGTERM and SIGINT no longer blocked (pgbroker.cli.entry blocks them first): one that came
    meanwhile acts now, as its handler says."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextmanager
def holding_stop_signals() -> Iterator[None]:
    """hold_stop_signals for the block, from a clean slate; the handlers of before are back after
    it, and nothing held stays (a command run in-process, main(argv), leaves its caller as it was)."""
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    _forget()
    hold_stop_signals()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)
        _forget()


def _forget() -> None:
    _held.clear()
    _asked.clear()


def _hold(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGINT and signal.SIGINT in _held:
        raise KeyboardInterrupt
    _held.append(signum)
    _asked.set()


def take_held() -> list[int]:
    """The stop signals held and not yet acted on (then forgotten): the caller acts on them."""
    taken = list(_held)
    _held.clear()
    return taken


def stop_asked_within(seconds: float) -> bool:
    """Whether a stop signal came, before or within ``seconds`` (then at once); holds the stop
    signals from now on (hold_stop_signals) if they were not held yet."""
    if signal.getsignal(signal.SIGTERM) is not _hold:
        hold_stop_signals()
    return _asked.wait(seconds)


@contextmanager
def on_stop_signals(handler: Callable[[int], None], *, enabled: bool = True) -> Iterator[None]:
    """Call ``handler(signum)`` on the running event loop at each SIGTERM and SIGINT until the block
    ends, and soon for each one held until now (hold_stop_signals); then the handling of before is
    back. ``enabled=False``: leave the signals alone (a caller that handles them itself, or a loop
    outside the main thread)."""
    loop = asyncio.get_running_loop()
    signums = STOP_SIGNALS if enabled else ()
    previous = {signum: signal.getsignal(signum) for signum in signums}
    for signum in signums:
        loop.add_signal_handler(signum, handler, signum)
    if enabled:
        for held in take_held():
            loop.call_soon(handler, held)
    try:
        yield
    finally:
        for signum in signums:
            loop.remove_signal_handler(signum)
            if previous[signum] is not None:  # remove_signal_handler put the default back
                signal.signal(signum, previous[signum])
