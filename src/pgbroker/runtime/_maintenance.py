"""The workers' maintenance rounds (a queue's archive retention and expired dedup keys, a
stream's retention) and what a round that fails does: it is logged, and the next round tries
again; a round the worker's role may not make (maintenance is the owner's, and the consumer role
has no grant for it) is logged once, with what to do instead, and the rounds stop, since waiting
does not change a grant.

Each call of a round (one batch: a short transaction) is bounded (``maintenance_bound``): a hung
server or a stuck pooler would otherwise hold the round, and every round after it, for as long as
the hang lasts, without a word. The call given up fails the round as a lost connection would; the
connection is closed (pgbroker._db.liveness), and the next round runs on a new one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from pgbroker._db.liveness import is_denied
from pgbroker.runtime._log_events import log_event

__all__ = ["maintenance_bound", "maintenance_rounds"]


def maintenance_bound(every: float, lease: float) -> float:
    """How long a maintenance call may go unanswered: the worker's lease (how long its other
    calls may), or the interval between rounds when that is longer."""
    return max(every, lease)


async def maintenance_rounds(
    every: float, one_round: Callable[[], Awaitable[None]], event: str, command: str, **fields: object
) -> None:
    """Make ``one_round`` every ``every`` seconds until cancelled; failures are logged as
    ``<event>_failed``, a denied round as ``<event>_off``, which names ``command`` (the owner's
    way to maintain)."""
    while True:
        await asyncio.sleep(every)
        try:
            await one_round()
        except Exception as exc:
            if is_denied(exc):
                hint = f"the role may not maintain; run `{command}` as the owner, or turn maintenance off"
                log_event(logging.WARNING, f"{event}_off", **fields, error=exc, hint=hint)
                return
            log_event(logging.WARNING, f"{event}_failed", **fields, error=exc)
