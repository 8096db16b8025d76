"""LISTEN/NOTIFY wake-ups for waiting reads, in both clients; polling stays the fallback.

A listener owns one dedicated autocommit connection. It LISTENs on the channel
of every queue a read has waited on (the server names it:
pgbroker.notify_channel) and counts the notifications of each channel. A
waiting read subscribes, reads, and sleeps until its channel's count moves or
the poll interval has passed, then reads again. A notification is only a
hint: one that never comes (notify not enabled, throttled, or sent while the
listener was reconnecting) costs at most a poll interval of latency, never a
message.

The connection loop is written once, for asyncio: AsyncListener runs it as a
task on the caller's event loop, Listener (sync) on a private event loop in a
daemon thread. Both reconnect after the connection drops and LISTEN again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import Generic, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgbroker._db.dsn import behind_transaction_pooler, listen_dsn
from pgbroker.errors import InvalidArgument

__all__ = ["DEFAULT_POLL_INTERVAL", "AsyncListener", "Listener", "Waiting", "conninfo_of", "nap"]

log = logging.getLogger(__name__)

# Seconds between reads of a waiting reader that hears nothing.
DEFAULT_POLL_INTERVAL = 0.5

_RECONNECT_FIRST = 0.1
_RECONNECT_MAX = 5.0
# A peer that vanishes without closing the socket is found by TCP keepalive (libpq
# ignores these on Unix sockets); until then waiting reads only poll.
_KEEPALIVE = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
}


def conninfo_of(info: psycopg.ConnectionInfo) -> str:
    """A conninfo for a connection like ``info``'s (psycopg leaves the password out of info.dsn)."""
    params = conninfo_to_dict(info.dsn)
    if info.password:
        params["password"] = info.password
    for key, value in _KEEPALIVE.items():
        params.setdefault(key, value)
    return make_conninfo("", **params)


def check_poll_interval(poll_interval: float) -> float:
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, int | float) or not poll_interval > 0:
        raise InvalidArgument(f"poll_interval must be a number of seconds > 0, got {poll_interval!r}")
    return float(poll_interval)


def reconnect_delay(failures: int) -> float:
    """Seconds before the next connection attempt after ``failures`` failed ones in a row."""
    return min(_RECONNECT_MAX, _RECONNECT_FIRST * 2.0 ** min(failures, 16))


class Waiting:
    """The schedule of one waiting read, shared by both clients.

    They read; if that found nothing and there is time left, subscribe, then
    read again and sleep for ``timeout()`` until ``done()``. Subscribing before
    the second read is what makes a send that commits between a read and the
    sleep wake the sleep.
    """

    def __init__(self, wait: float, poll_interval: float) -> None:
        self.poll_interval = poll_interval
        self._deadline = time.monotonic() + wait

    def done(self, found: Sequence[object]) -> bool:
        return bool(found) or time.monotonic() >= self._deadline

    def timeout(self) -> float:
        """How long to sleep: until the deadline, but never longer than a poll interval."""
        return max(0.0, min(self._deadline - time.monotonic(), self.poll_interval))


class _Loop:
    """The listening loop and what it has heard; it lives on one event loop.

    ``counts[channel]`` moves on every notification of the channel and every
    time the channel is LISTENed to anew (anything may have been sent while it
    was not). ``on_change`` runs on the loop after every change, so that the
    wrappers can wake their sleepers.
    """

    def __init__(self, conninfo: str, on_change: Callable[[], None]) -> None:
        self.counts: dict[str, int] = {}
        self.listening: set[str] = set()
        self._conninfo = conninfo
        self._on_change = on_change
        self._wanted = asyncio.Event()

    def want(self, channel: str) -> None:
        if channel not in self.counts:
            self.counts[channel] = 0
            self._wanted.set()

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
            except psycopg.Error as exc:
                log.warning("pgbroker listener cannot connect, waiting reads poll meanwhile: %s", exc)
                await asyncio.sleep(reconnect_delay(failures))
                failures += 1
                continue
            failures = 0
            try:
                async with conn:
                    await self._serve(conn)
            except psycopg.Error as exc:
                log.warning("pgbroker listener lost its connection, reconnecting: %s", exc)
            finally:
                self.listening.clear()
                self._on_change()
            # Not at once: a server that drops every new connection must not be hammered.
            await asyncio.sleep(reconnect_delay(0))

    async def _serve(self, conn: psycopg.AsyncConnection[object]) -> None:
        while True:
            self._wanted.clear()
            fresh = [channel for channel in self.counts if channel not in self.listening]
            if fresh:
                await conn.execute(
                    sql.SQL("; ").join(sql.SQL("LISTEN {}").format(sql.Identifier(c)) for c in fresh)
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
        receiving = asyncio.ensure_future(self._receive(conn))
        wanted = asyncio.ensure_future(self._wanted.wait())
        try:
            await asyncio.wait((receiving, wanted), return_when=asyncio.FIRST_COMPLETED)
        finally:
            wanted.cancel()
            receiving.cancel()
            with suppress(asyncio.CancelledError):
                await receiving  # raises the connection's error, if that is what ended it

    async def _receive(self, conn: psycopg.AsyncConnection[object]) -> None:
        async for notify in conn.notifies():
            if notify.channel in self.counts:
                self.counts[notify.channel] += 1
                self._on_change()


class _Wakeups:
    """What both listeners share: the poll interval, each queue's channel, and the counts heard."""

    def __init__(self, poll_interval: float) -> None:
        self.poll_interval = check_poll_interval(poll_interval)
        # Behind a transaction pooler a LISTEN ends with its transaction: without a direct
        # connection for it, waiting reads only poll (pgbroker._db.dsn).
        self.polling_only = behind_transaction_pooler() and listen_dsn() is None
        self._channels: dict[str, str] = {}
        self._listening: _Loop | None = None

    def _count(self, channel: str) -> int:
        return self._listening.counts.get(channel, 0) if self._listening is not None else 0


_ListenerT = TypeVar("_ListenerT", bound=_Wakeups)


class _Place(Generic[_ListenerT]):
    """A reader's place in a channel's count: there is news when the count moved since it looked."""

    def __init__(self, listener: _ListenerT, channel: str) -> None:
        self._listener = listener
        self._channel = channel
        self._seen = listener._count(channel)

    def _has_news(self) -> bool:
        return self._listener._count(self._channel) != self._seen

    def _catch_up(self) -> None:
        self._seen = self._listener._count(self._channel)


class Subscription(_Place["Listener"]):
    """One sync reader's view of a channel: wait() returns once it has news."""

    def wait(self, timeout: float) -> bool:
        """Sleep until a notification (or reconnect) since the last wait, or timeout; True if one came."""
        changed = self._listener._cond
        with changed:
            heard = changed.wait_for(self._has_news, timeout)
            self._catch_up()
        return heard


class Listener(_Wakeups):
    """Wake-ups for the sync client: the listening loop on a daemon thread, started on first use.

    ``conninfo`` is called once, at start, for the dedicated connection's conninfo.
    """

    def __init__(self, conninfo: Callable[[], str], poll_interval: float = DEFAULT_POLL_INTERVAL) -> None:
        super().__init__(poll_interval)
        self._conninfo = conninfo
        self._cond = threading.Condition()
        self._start_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None

    def subscribe(self, queue: str, channel_of: Callable[[], str], timeout: float) -> Subscription:
        """Listen to the queue's channel (waiting up to ``timeout`` for the LISTEN); see Subscription.

        ``channel_of`` asks the server for the channel, once per queue name.
        """
        if self.polling_only:
            return Subscription(self, "")
        channel = self._channels.get(queue)
        if channel is None:
            channel = self._channels[queue] = channel_of()
        loop, listening = self._start()
        loop.call_soon_threadsafe(listening.want, channel)
        with self._cond:
            self._cond.wait_for(lambda: channel in listening.listening, timeout)
            return Subscription(self, channel)

    def close(self) -> None:
        """Stop the thread and close the connection; waiting reads then only poll."""
        with self._start_lock:
            loop, task, thread = self._loop, self._task, self._thread
            self._loop = self._task = self._thread = None
        if loop is not None and task is not None and thread is not None:
            loop.call_soon_threadsafe(task.cancel)
            thread.join()

    def _changed(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _start(self) -> tuple[asyncio.AbstractEventLoop, _Loop]:
        with self._start_lock:
            if self._loop is None or self._listening is None:
                conninfo = self._conninfo()
                # Selector loop: psycopg's async connections need it on Windows too.
                loop = asyncio.SelectorEventLoop()
                listening = _Loop(conninfo, self._changed)
                task = loop.create_task(listening.run())
                thread = threading.Thread(
                    target=self._run, args=(loop, task), name="pgbroker-listener", daemon=True
                )
                self._loop, self._listening, self._task, self._thread = loop, listening, task, thread
                thread.start()
            return self._loop, self._listening

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
        asyncio.set_event_loop(loop)
        try:
            with suppress(asyncio.CancelledError):
                loop.run_until_complete(task)
        finally:
            loop.close()


class AsyncSubscription(_Place["AsyncListener"]):
    """One async reader's view of a channel: wait() returns once it has news."""

    async def wait(self, timeout: float) -> bool:
        """Sleep until a notification (or reconnect) since the last wait, or timeout; True if one came."""
        heard = await self._listener._until(self._has_news, timeout)
        self._catch_up()
        return heard


class AsyncListener(_Wakeups):
    """Wake-ups for the asyncio client: the listening loop as a task, started on first use.

    ``conninfo`` is awaited once, at start, for the dedicated connection's conninfo.
    """

    def __init__(
        self, conninfo: Callable[[], Awaitable[str]], poll_interval: float = DEFAULT_POLL_INTERVAL
    ) -> None:
        super().__init__(poll_interval)
        self._conninfo = conninfo
        self._task: asyncio.Task[None] | None = None
        # Replaced on every change, so that everyone sleeping on the old one wakes.
        self._changed_event = asyncio.Event()

    async def subscribe(
        self, queue: str, channel_of: Callable[[], Awaitable[str]], timeout: float
    ) -> AsyncSubscription:
        """Listen to the queue's channel (waiting up to ``timeout`` for the LISTEN); see AsyncSubscription.

        ``channel_of`` asks the server for the channel, once per queue name.
        """
        if self.polling_only:
            return AsyncSubscription(self, "")
        channel = self._channels.get(queue)
        if channel is None:
            channel = self._channels[queue] = await channel_of()
        listening = await self._start()
        listening.want(channel)
        await self._until(lambda: channel in listening.listening, timeout)
        return AsyncSubscription(self, channel)

    async def close(self) -> None:
        """Cancel the task and close the connection; waiting reads then only poll."""
        task, self._task, self._listening = self._task, None, None
        if task is not None:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task

    def _changed(self) -> None:
        event, self._changed_event = self._changed_event, asyncio.Event()
        event.set()

    async def _until(self, ready: Callable[[], bool], timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not ready():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._changed_event.wait()
        return True

    async def _start(self) -> _Loop:
        if self._listening is None:
            conninfo = await self._conninfo()
            if self._listening is None:  # another reader may have started it meanwhile
                self._listening = _Loop(conninfo, self._changed)
                self._task = asyncio.get_running_loop().create_task(self._listening.run())
        return self._listening


async def nap(stopping: asyncio.Event, subscription: AsyncSubscription | None, seconds: float) -> None:
    """Sleep until the subscription hears news, ``stopping`` is set, or ``seconds`` have passed
    (the idle wait of a worker or a scheduler)."""
    sleepers: list[asyncio.Future[bool]] = [asyncio.ensure_future(stopping.wait())]
    if subscription is not None:
        sleepers.append(asyncio.ensure_future(subscription.wait(seconds)))
    await asyncio.wait(sleepers, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    for sleeper in sleepers:
        sleeper.cancel()
