"""The ceiling of W handlers: each awaits ``work`` seconds (the scenarios' synthetic job), then the
next, with no queue or database at all, in a process of its own as the systems' workers are. No
system can handle more a second with W handlers at once; scenarios (g) and (h) show it beside
them."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from typing import Any

from pgbroker import _event_loop as event_loop


def _child(workers: int, work: float, seconds: float, rate: Any) -> None:
    done = 0

    async def loop(until: float) -> None:
        nonlocal done
        while time.monotonic() < until:
            done += 1
            await asyncio.sleep(work)

    async def main() -> None:
        until = time.monotonic() + seconds
        await asyncio.gather(*(loop(until) for _ in range(workers)))

    event_loop.run(main())
    rate.value = done / seconds


def ceiling(workers: int, work: float, seconds: float) -> float:
    """Jobs a second that ``workers`` handlers of ``work`` seconds each get through alone."""
    context = multiprocessing.get_context("spawn")
    rate = context.Value("d", 0.0)
    proc = context.Process(target=_child, args=(workers, work, seconds, rate))
    proc.start()
    proc.join()
    return float(rate.value)
