"""The scheduler: sends the ticks of the cron schedules kept in Postgres (sql/functions/78_schedules.sql).

A small loop: send what is due (pgbroker.schedule_tick), ask how long until the next tick of any
schedule (pgbroker.schedule_next_wake), and sleep that long, or until a change to the schedules
is announced (NOTIFY on pgbroker.schedules_channel()), or until stop(). Every worker process
runs one (pgbroker.runtime._app.serve) and ``pgbroker scheduler`` runs one alone; however many run,
each tick is sent once, because the engine claims a tick with the schedule's row in the
transaction that sends it. This loop decides only when to ask.

A due tick that another scheduler holds right now is left to it: this one asks again shortly,
so if the other dies mid-tick (its transaction rolls back) the tick is still sent. Lost
connections are retried with back-off; a database whose schema predates schedules stops the
scheduler (with a warning) and not the worker that runs it.

A call unanswered within ``answer_within`` seconds (a hung server, a stuck pooler, a network that
drops packets without a word) counts as a lost connection (pgbroker._db.liveness.answered_within):
warned and retried on a new session, where the scheduler used to wait for the answer for as long
as the hang lasted and send no tick meanwhile. Should the call given up run after all, it finds
the tick claimed (or claims it first): each tick is still sent once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from pgbroker._db.backoff import Backoff
from pgbroker._db.listen_async import AsyncSubscription, nap
from pgbroker._db.liveness import answered_within, is_transient, stops_with
from pgbroker._db.schema_watch import SCHEMA_CHANGED_HINT, SchemaChanged, SchemaWatch
from pgbroker.errors import NotInstalled, PgbrokerError
from pgbroker.queues._client_async import AsyncBroker

__all__ = ["Scheduler", "SchedulerStats"]

log = logging.getLogger("pgbroker.scheduler")

T = TypeVar("T")

# The longest sleep: a missed notification (the listener reconnecting) or a clock change costs
# at most this long a delay.
MAX_SLEEP = 30.0
# How soon to ask again when a due tick is held by another scheduler (it is sending it now).
HELD_RETRY = 0.5
# Wake a little after the tick, so that the database's clock has surely reached it.
_PAST_THE_TICK = 0.01
_LISTEN_TIMEOUT = 1.0
# How long a call may go unanswered before it is given up as a lost connection: sending a tick takes
# milliseconds, a lock held by maintenance is met by the role's lock_timeout if it has one.
ANSWER_WITHIN = 30.0
_INSUFFICIENT_PRIVILEGE = "42501"


def _cannot_schedule(exc: PgbrokerError) -> bool:
    """Whether ``exc`` says this database or role cannot run schedules at all (then the scheduler
    stops with a warning: the worker running it goes on)."""
    if isinstance(exc, NotInstalled):
        log.warning("scheduler.stopped reason=%r (run pgbroker install)", exc.message)
        return True
    if exc.sqlstate == _INSUFFICIENT_PRIVILEGE:
        # A worker running as a role that may not send schedules (pgbroker_consumer): the
        # schedules are another process's job.
        log.warning(
            "scheduler.stopped reason=%r (this role may not run schedules: run pgbroker scheduler, or "
            "a worker, as the role that ran pgbroker install to send them; pgbroker worker "
            "--no-scheduler leaves this out)",
            exc.message,
        )
        return True
    return False


@dataclass
class SchedulerStats:
    sent: int = 0  # ticks this scheduler sent
    refused: int = 0  # ticks whose send the queue refused (see the schedule's last_error)
    errors: int = 0  # calls that failed (lost connections, ...)


class Scheduler:
    """Sends due schedule ticks until stop(); ``await scheduler.run(broker)``."""

    def __init__(self, *, max_sleep: float = MAX_SLEEP, answer_within: float = ANSWER_WITHIN) -> None:
        self.max_sleep = max_sleep
        self.answer_within = answer_within
        self.stats = SchedulerStats()
        # Why it stopped by itself (a database without the schema, a role without the right),
        # else None: the process running it goes on, unless the scheduler was all it had to run.
        self.gave_up: PgbrokerError | None = None
        self._schema = SchemaWatch()  # tells an upgrade from a bug when the schema is found wanting
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        """Stop after the current call; call on the scheduler's event loop."""
        self._stopping.set()

    async def run(self, broker: AsyncBroker) -> None:
        # Once stopping, a call waits for its answer STOP_PATIENCE seconds at most.
        with stops_with(self._stopping):
            await self._run(broker)

    async def _run(self, broker: AsyncBroker) -> None:
        subscription: AsyncSubscription | None = None
        retry = Backoff(0.1, 5.0)
        log.info("scheduler.started")
        while not self._stopping.is_set():
            try:
                if subscription is None:
                    subscription = await self._answered(broker, broker.listen_schedules(_LISTEN_TIMEOUT))
                await self._send_due(broker)
                wake = await self._answered(broker, broker.schedule_next_wake())
            except PgbrokerError as exc:
                if isinstance(exc, SchemaChanged):
                    await self._retry_later(f"{exc.message} ({SCHEMA_CHANGED_HINT})", retry)
                    continue
                if _cannot_schedule(exc):
                    self.gave_up = exc
                    return
                await self._retry_later(exc.message, retry)
                continue
            except Exception as exc:
                # A pool that found no connection in time raises PoolTimeout, no PgbrokerError
                # (a call given up unanswered, psycopg's OperationalError): retried too, else the
                # scheduler would end for good while its process runs on.
                if not is_transient(exc):
                    raise
                await self._retry_later(str(exc), retry)
                continue
            retry.reset()
            await self._nap(subscription, self._sleep_for(wake))
        log.info("scheduler.stopped sent=%d", self.stats.sent)

    async def _retry_later(self, error: str, retry: Backoff) -> None:
        self.stats.errors += 1
        if self._stopping.is_set():  # a call given up at the stop (StopCut): nothing to retry
            return
        log.warning("scheduler.retry error=%r", error)
        await self._nap(None, retry.next())

    def _sleep_for(self, wake: float | None) -> float:
        if wake is None:
            return self.max_sleep
        if wake <= 0:  # still due after our tick: another scheduler holds it
            return HELD_RETRY
        return min(wake + _PAST_THE_TICK, self.max_sleep)

    async def _send_due(self, broker: AsyncBroker) -> None:
        for tick in await self._answered(broker, broker.run_due_schedules()):
            if tick.error is None:
                self.stats.sent += 1
                log.info(
                    "schedule.sent name=%s tick=%s msg_id=%s", tick.schedule_name, tick.tick, tick.msg_id
                )
            else:
                self.stats.refused += 1
                log.warning(
                    "schedule.refused name=%s tick=%s error=%r", tick.schedule_name, tick.tick, tick.error
                )

    async def _answered(self, broker: AsyncBroker, call: Coroutine[Any, Any, T]) -> T:
        return await answered_within(self.answer_within, self._schema.call(broker, call))

    async def _nap(self, subscription: AsyncSubscription | None, seconds: float) -> None:
        """Sleep until a change to the schedules is announced, stop(), or ``seconds`` have passed."""
        await nap(self._stopping, subscription, seconds)
