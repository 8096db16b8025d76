"""Stopping on SIGTERM and SIGINT: the one place where pgbroker's long-running processes (workers
under App, the scheduler alone, the bridges) install their signal handlers on the event loop."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["STOP_SIGNALS", "on_stop_signals"]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def on_stop_signals(handler: Callable[[int], None], *, enabled: bool = True) -> Iterator[None]:
    """Call ``handler(signum)`` on the running event loop at each SIGTERM and SIGINT until the block
    ends (then the default handling is back). ``enabled=False``: leave the signals alone (a caller
    that handles them itself, or a loop outside the main thread)."""
    loop = asyncio.get_running_loop()
    signums = STOP_SIGNALS if enabled else ()
    for signum in signums:
        loop.add_signal_handler(signum, handler, signum)
    try:
        yield
    finally:
        for signum in signums:
            loop.remove_signal_handler(signum)
