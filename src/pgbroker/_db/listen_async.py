# The one written copy of the LISTEN wake-ups. Its synchronous twin, listen.py, is generated from
# this file by scripts/async_to_sync.py and committed, like the clients'.
"""LISTEN/NOTIFY wake-ups for waiting reads (AsyncListener); polling stays the fallback.

A listener owns one dedicated autocommit connection. It LISTENs on the channel
of every queue a read has waited on (the server names it:
pgbroker.notify_channel) and counts the notifications of each channel. A
waiting read subscribes, reads, and sleeps until its channel's count moves or
the poll interval has passed, then reads again (pgbroker._db.wakeups.Waiting).

The connection loop runs as a task on the caller's event loop (asyncio) or on a
daemon thread (the sync twin); it reconnects after the connection drops and
LISTENs again. What has no I/O in it is in pgbroker._db.wakeups.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeAlias

import psycopg
from psycopg import sql

from pgbroker import _sql
from pgbroker._credentials import hide_passwords
from pgbroker._db.dsn import behind_transaction_pooler, listen_dsn
from pgbroker._db.liveness import NoAnswer
from pgbroker._db.pools import DEFAULT_CONNECT_TIMEOUT
from pgbroker._db.wakeups import (
    DEFAULT_POLL_INTERVAL,
    WAKE_RATE,
    WakeBudget,
    check_poll_interval,
    reconnect_delay,
)
from pgbroker.errors import from_postgres

# True here; the generator drops this line and every `if ASYNC:` block (mypy: always_true).
ASYNC = True

if ASYNC:
    import asyncio
    from collections.abc import Awaitable
    from contextlib import suppress

    from pgbroker._background import said_if_failed
    from pgbroker._db.liveness import stop_requested, unless_stopping

__all__ = ["AsyncListener", "AsyncSubscription"]

log = logging.getLogger("pgbroker.listen")

# What gives the dedicated connection's conninfo, and a queue's channel (given the seconds the
# server has to answer, or NoAnswer): called once each.
_Conninfo: TypeAlias = Callable[[], Awaitable[str]]  # sync: _Conninfo: TypeAlias = Callable[[], str]
_ChannelOf: TypeAlias = Callable[[float], Awaitable[str]]  # sync: _ChannelOf = Callable[[float], str]

# Seconds the sync twin's thread waits for notifications at a time, between its looks for new
# channels to LISTEN to and for close() (the asyncio loop is interrupted instead).
_RECEIVE_SLICE = 0.05
# Seconds the sync twin's close() waits for its thread to close the connection.
_CLOSE_WAIT = 5.0
# Seconds between two warnings that wake-ups are held (AsyncSubscription._held_back).
_HELD_WARNING_EVERY = 60.0
# Held wake-ups are a flood only when no read found messages for this long: a consumer that
# competes for a queue's sends finds most of them taken, and its wake-ups are held too.
_QUIET_BEFORE_WARNING = 10.0
# LISTEN {channel}, the channel composed as an identifier.
_LISTEN = sql.SQL(_sql.queries("listen")["listen_channel"])


class _Loop:
    """The listening loop and what it has heard.

    ``counts[channel]`` moves on every notification of the channel and every
    time the channel is LISTENed to anew (anything may have been sent while it
    was not). ``on_change`` runs after every change, so that the listener can
    wake its sleepers.
    """

    def __init__(self, conninfo: str, on_change: Callable[[], None]) -> None:
        self.counts: dict[str, int] = {}
        self.listening: set[str] = set()
        self._conninfo = conninfo
        self._on_change = on_change
        self._wanted = asyncio.Event()  # sync: self._wanted = threading.Event()
        self._stopped = asyncio.Event()  # sync: self._stopped = threading.Event()

    def _said(self, exc: psycopg.Error) -> str:
        # libpq's words may quote a password it misread ($PGBROKER_LISTEN_DSN is read as given).
        return hide_passwords(str(exc), self._conninfo)

    def want(self, channel: str) -> None:
        if channel not in self.counts:
            self.counts[channel] = 0
            self._wanted.set()

    def stop(self) -> None:
        """End the loop (the sync twin's close(); the asyncio listener cancels the task)."""
        self._stopped.set()
        self._wanted.set()

    async def run(self) -> None:
        failures = 0
        while not self._stopped.is_set():
            try:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
            except psycopg.Error as exc:
                said = self._said(exc)
                log.warning("pgbroker listener cannot connect, waiting reads poll meanwhile: %s", said)
                await self._pause(reconnect_delay(failures))
                failures += 1
                continue
            try:
                async with conn:
                    await self._serve(conn)
            except psycopg.Error as exc:
                log.warning("pgbroker listener lost its connection, reconnecting: %s", self._said(exc))
            finally:
                # A connection that LISTENed was of use; one that did not (a standby refuses
                # LISTEN) counts as a failed attempt, so that the pauses grow.
                failures = 0 if self.listening else failures
                self.listening.clear()
                self._on_change()
            # Not at once: a server that drops every new connection must not be hammered.
            await self._pause(reconnect_delay(failures))
            failures += 1

    async def _pause(self, seconds: float) -> None:
        """Sleep before connecting again, unless the loop is stopped meanwhile."""
        if ASYNC:
            with suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._stopped.wait()
        else:
            self._stopped.wait(seconds)

    async def _serve(self, conn: psycopg.AsyncConnection[object]) -> None:
        while not self._stopped.is_set():
            self._wanted.clear()
            # A copy: in the sync twin, readers add channels from their own threads.
            fresh = [channel for channel in list(self.counts) if channel not in self.listening]
            if fresh:
                await conn.execute(
                    sql.SQL("; ").join(_LISTEN.format(channel=sql.Identifier(c)) for c in fresh)
                )
            for channel in fresh:
                self.counts[channel] += 1
                self.listening.add(channel)
            if fresh:
                self._on_change()
            await self._receive_until_wanted(conn)

    async def _receive_until_wanted(self, conn: psycopg.AsyncConnection[object]) -> None:
        # A LISTEN cannot be sent while notifies() holds the connection, so a
        # new channel interrupts the receiving (the connection is idle then).
        if ASYNC:
            receiving = asyncio.ensure_future(self._receive(conn))
            wanted = asyncio.ensure_future(self._wanted.wait())
            try:
                await asyncio.wait((receiving, wanted), return_when=asyncio.FIRST_COMPLETED)
            finally:
                wanted.cancel()
                receiving.cancel()
                with suppress(asyncio.CancelledError):
                    await receiving  # raises the connection's error, if that is what ended it
        else:
            while not self._wanted.is_set():
                for notify in conn.notifies(timeout=_RECEIVE_SLICE):
                    self._heard(notify.channel)

    if ASYNC:

        async def _receive(self, conn: psycopg.AsyncConnection[object]) -> None:
            async for notify in conn.notifies():
                self._heard(notify.channel)

    def _heard(self, channel: str) -> None:
        if channel in self.counts:
            self.counts[channel] += 1
            self._on_change()


class AsyncSubscription:
    """One reader's view of a channel: wait() returns once it has news, that is once the channel's
    count moved since the reader last looked, within the wake-ups' budget (wakeups.WakeBudget)."""

    def __init__(self, listener: AsyncListener, channel: str) -> None:
        self._listener = listener
        self._channel = channel
        self._seen = listener._count(channel)
        self._budget = WakeBudget()
        # Only a wake-up after one that brought nothing counts against the budget, and one that
        # then brings messages is given back, with credit (confirm()): sends at any rate wake a
        # reader at once, and so do its competitors' sends.
        self._unconfirmed = False  # the last wake-up has brought no message so far
        self._charged = False  # the last wake-up was counted
        self._held = 0  # wake-ups the budget delayed since the last warning
        self._warned_at: float | None = None
        self._news_at = time.monotonic()  # when a read last found messages (subscribing counts)

    async def wait(self, timeout: float) -> bool:
        """Sleep until a notification (or reconnect) since the last wait, or timeout; True if one came.
        Past the budget of wake-ups, news waits its turn (within the timeout)."""
        deadline = time.monotonic() + timeout
        heard = await self._listener._until(self.has_news, timeout)
        if heard:
            self._charged = self._unconfirmed
            turn = min(self._budget.take(), deadline - time.monotonic()) if self._charged else 0.0
            if turn > 0:
                self._held_back()
                await asyncio.sleep(turn)
            self._unconfirmed = True
        self.catch_up()
        return heard

    def confirm(self) -> None:
        """A read found messages: the last wake-up, if one led here, was news; it is not counted and
        earns the wake-ups of consumers competing for the same sends (wakeups.NEWS_CREDIT)."""
        if self._unconfirmed:
            self._budget.news(refund=self._charged)
        self._charged = self._unconfirmed = False
        self._news_at = time.monotonic()

    def _held_back(self) -> None:
        """Say so when wake-ups are held while no read finds messages: empty ones faster than the
        budget, with no news for a while, are not pgbroker's sends (another login NOTIFYing the
        channel, most likely). Once a minute at most."""
        self._held += 1
        now = time.monotonic()
        if now - self._news_at < _QUIET_BEFORE_WARNING:
            return  # reads find messages: competitors took the rest of the sends
        if self._warned_at is None or now - self._warned_at >= _HELD_WARNING_EVERY:
            log.warning(
                "listen.wakeups_held channel=%s held=%d: notifications that brought no message came "
                "faster than %g a second, and none brought any for %g s (another login NOTIFYing this "
                "channel?); waking is slowed",
                json.dumps(self._channel),
                self._held,
                WAKE_RATE,
                _QUIET_BEFORE_WARNING,
            )
            self._warned_at, self._held = now, 0

    @property
    def announced(self) -> bool:
        """Whether notifications reach it (False: it only polls, behind a transaction pooler)."""
        return not self._listener.polling_only

    def has_news(self) -> bool:
        """A notification (or reconnect) since the last wait or catch_up."""
        return self._listener._count(self._channel) != self._seen

    def catch_up(self) -> None:
        """Count what came so far as seen (a read about to run covers it)."""
        self._seen = self._listener._count(self._channel)


class AsyncListener:
    """A client's wake-ups, started on first use: the listening loop runs as a task on the event
    loop (in the sync twin, on a daemon thread).

    ``conninfo`` is called once, at start, for the dedicated connection's conninfo; ``pooler`` is
    what stands in front of Postgres (pgbroker._db.dsn.pooler_mode); ``answer_within``: the seconds
    the server has to answer the look-up of a channel (the broker's connect_timeout).
    """

    def __init__(
        self,
        conninfo: _Conninfo,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        pooler: str | None = None,
        answer_within: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self.poll_interval = check_poll_interval(poll_interval)
        self.answer_within = answer_within
        # Behind a transaction pooler a LISTEN ends with its transaction: without a direct
        # connection for it, waiting reads only poll (pgbroker._db.dsn).
        self.polling_only = behind_transaction_pooler(pooler) and listen_dsn() is None
        self._conninfo = conninfo
        self._channels: dict[str, str] = {}
        self._listening: _Loop | None = None
        if ASYNC:
            self._task: asyncio.Task[None] | None = None
            # Replaced on every change, so that everyone sleeping on the old one wakes.
            self._changed_event = asyncio.Event()
        else:
            self._cond = threading.Condition()
            self._start_lock = threading.Lock()
            self._thread: threading.Thread | None = None

    async def subscribe(self, queue: str, channel_of: _ChannelOf, timeout: float) -> AsyncSubscription:
        """Listen to the queue's channel (waiting up to ``timeout`` for the LISTEN); see AsyncSubscription.

        ``channel_of`` asks the server for the channel, once per queue name: ConnectionLost when
        the server has not answered within ``answer_within`` seconds (a hung server, a stuck
        pooler), where a reader waited for good.
        """
        if self.polling_only:
            return AsyncSubscription(self, "")
        channel = self._channels.get(queue)
        if channel is None:
            try:
                channel = self._channels[queue] = await channel_of(self.answer_within)
            except NoAnswer as exc:
                raise from_postgres(exc) from exc
        listening = await self._start()
        listening.want(channel)
        await self._until(lambda: channel in listening.listening, timeout)
        return AsyncSubscription(self, channel)

    async def close(self) -> None:
        """Stop listening and close the connection; waiting reads then only poll."""
        if ASYNC:
            task, self._task, self._listening = self._task, None, None
            if task is not None:
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
        else:
            with self._start_lock:
                listening, thread = self._listening, self._thread
                self._listening = self._thread = None
            if listening is not None and thread is not None:
                listening.stop()
                thread.join(_CLOSE_WAIT)

    def _count(self, channel: str) -> int:
        return self._listening.counts.get(channel, 0) if self._listening is not None else 0

    def _changed(self) -> None:
        if ASYNC:
            event, self._changed_event = self._changed_event, asyncio.Event()
            event.set()
        else:
            with self._cond:
                self._cond.notify_all()

    async def _until(self, ready: Callable[[], bool], timeout: float) -> bool:
        if ASYNC:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while not ready():
                remaining = deadline - loop.time()
                if remaining <= 0 or stop_requested():  # a long poll answers at the stop
                    return False
                with suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await unless_stopping(self._changed_event.wait())
            return True
        else:
            with self._cond:
                return self._cond.wait_for(ready, timeout)

    async def _start(self) -> _Loop:
        if ASYNC:
            if self._listening is None:
                conninfo = await self._conninfo()
                if self._listening is None:  # another reader may have started it meanwhile
                    self._listening = _Loop(conninfo, self._changed)
                    self._task = asyncio.get_running_loop().create_task(self._listening.run())
                    # Wake-ups end with it (reads only poll then): said at once.
                    self._task.add_done_callback(said_if_failed(log, "listen.ended"))
            return self._listening
        else:
            with self._start_lock:
                if self._listening is None:
                    listening = _Loop(self._conninfo(), self._changed)
                    thread = threading.Thread(target=listening.run, name="pgbroker-listener", daemon=True)
                    self._listening, self._thread = listening, thread
                    thread.start()
                return self._listening


if ASYNC:
    __all__ += ["nap"]

    async def nap(stopping: asyncio.Event, subscription: AsyncSubscription | None, seconds: float) -> None:
        """Sleep until the subscription hears news, ``stopping`` is set, or ``seconds`` have passed
        (the idle wait of a worker or a scheduler)."""
        sleepers: list[asyncio.Future[bool]] = [asyncio.ensure_future(stopping.wait())]
        if subscription is not None:
            sleepers.append(asyncio.ensure_future(subscription.wait(seconds)))
        await asyncio.wait(sleepers, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        for sleeper in sleepers:
            sleeper.cancel()
