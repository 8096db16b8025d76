"""The workers' maintenance rounds (a queue's archive retention and expired dedup keys, a
stream's retention) and what a round that fails does: it is logged, and the next round tries
again; a round the worker's role may not make (maintenance is the owner's, and the consumer role
has no grant for it) is logged once, with what to do instead, and the rounds stop, since waiting
does not change a grant."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import psycopg

from pgbroker.errors import PgbrokerError
from pgbroker.runtime._log_events import log_event

__all__ = ["maintenance_rounds"]

_DENIED = "42501"  # insufficient_privilege


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
            if _denied(exc):
                hint = f"the role may not maintain; run `{command}` as the owner, or turn maintenance off"
                log_event(logging.WARNING, f"{event}_off", **fields, error=exc, hint=hint)
                return
            log_event(logging.WARNING, f"{event}_failed", **fields, error=exc)


def _denied(exc: Exception) -> bool:
    if isinstance(exc, PgbrokerError):
        return exc.sqlstate == _DENIED
    return isinstance(exc, psycopg.errors.InsufficientPrivilege)
