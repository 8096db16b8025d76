"""What both LISTEN wake-up listeners share, with no I/O in it: the schedule of a waiting read, the
reconnect delays, the poll interval's check, and the conninfo of a listener's own connection.

A waiting read reads; if that found nothing and there is time left, it subscribes to its queue's
channel (listen_async.AsyncListener, or its generated sync twin listen.Listener), reads again,
and sleeps until a notification or the poll interval, then reads again. A notification is only a
hint: one that never comes costs at most a poll interval of latency, never a message, and one
that comes for nothing costs a read, so a subscriber is woken by news within a budget
(WakeBudget).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgbroker._db.liveness import stop_requested
from pgbroker.errors import InvalidArgument

__all__ = [
    "DEFAULT_POLL_INTERVAL",
    "NEWS_CREDIT",
    "WAKE_BURST",
    "WAKE_RATE",
    "Waiting",
    "WakeBudget",
    "check_poll_interval",
    "conninfo_of",
    "listen_conninfo",
    "reconnect_delay",
]

# Seconds between reads of a waiting reader that hears nothing.
DEFAULT_POLL_INTERVAL = 0.5

# The wake-ups by news a subscriber takes: WAKE_BURST at once, then WAKE_RATE a second. Any login
# may NOTIFY any channel (PostgreSQL has no privilege on channels), and each wake-up costs a read:
# a flood of NOTIFY from a login with no pgbroker role made an idle worker read back to back (897
# empty reads in 3 s). Only wake-ups that bring nothing count (listen_async.AsyncSubscription says
# which): sends at any rate wake a worker at once (1,000 a second in batches of 10 are 100
# wake-ups a second), and a flood costs each subscriber WAKE_RATE reads a second.
WAKE_BURST = 5
WAKE_RATE = 20.0
# What a wake-up that brought messages earns: as many more that bring nothing. Consumers that
# compete for a queue (worker processes, a stream group's members) are each woken by every send
# and most find it taken, N - 1 empty wake-ups a send for N of them: not a flood, and the budget
# alone held them (two worker processes at 1,500 jobs a second warned of a flood). A flood still
# gets no more than NEWS_CREDIT reads a real wake-up, and WAKE_RATE a second without any.
NEWS_CREDIT = 16

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


def listen_conninfo(conninfo: str, kwargs: Mapping[str, Any] | None = None) -> str:
    """The conninfo of a listener's own connection, from the one a pool was given (and the pool's
    connection ``kwargs``, of which only libpq's parameters count): kept as given, every host of
    a multi-host list, hostnames unresolved and target_session_attrs included, so that a
    reconnect after a failover finds the new primary as the pool does; keepalives added."""
    params = conninfo_to_dict(conninfo)
    params.update((key, value) for key, value in (kwargs or {}).items() if key in _libpq_keywords())
    for key, value in _KEEPALIVE.items():
        params.setdefault(key, value)
    return make_conninfo("", **params)


def conninfo_of(info: psycopg.ConnectionInfo) -> str:
    """A listener's conninfo for a connection like ``info``'s, when nothing else is known (a
    single connection passed in): it names the one server that answered, not the DSN's list.
    psycopg leaves the password out of info.dsn."""
    password = {"password": info.password} if info.password else {}
    return listen_conninfo(info.dsn, password)


@cache
def _libpq_keywords() -> frozenset[str]:
    return frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


def check_poll_interval(poll_interval: float) -> float:
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, int | float) or not poll_interval > 0:
        raise InvalidArgument(f"poll_interval must be a number of seconds > 0, got {poll_interval!r}")
    return float(poll_interval)


def reconnect_delay(failures: int) -> float:
    """Seconds before the next connection attempt after ``failures`` failed ones in a row."""
    return min(_RECONNECT_MAX, _RECONNECT_FIRST * 2.0 ** min(failures, 16))


class WakeBudget:
    """A subscriber's wake-ups by news (a token bucket, filled by time up to ``burst`` and by news
    up to ``burst + credit``): take() says how long to wait before one."""

    def __init__(self, burst: int = WAKE_BURST, rate: float = WAKE_RATE, credit: int = NEWS_CREDIT) -> None:
        self._burst = float(burst)
        self._rate = rate
        self._credit = float(credit)
        self._tokens = float(burst)
        self._at = time.monotonic()

    def take(self) -> float:
        """Spend a wake-up: 0 within the budget, else the seconds until it has one. At most one is
        owed, so a wake-up cut short by its sleeper's timeout leaves no debt that grows."""
        now = time.monotonic()
        if self._tokens < self._burst:  # time refills the burst, not what news earned beyond it
            self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._tokens = max(self._tokens - 1, -1.0)
        self._at = now
        return max(0.0, -self._tokens / self._rate)

    def news(self, *, refund: bool) -> None:
        """The last wake-up brought messages: it earns ``credit`` wake-ups, and gives back the one
        it cost (``refund``: it was counted)."""
        self._tokens = min(self._burst + self._credit, self._tokens + self._credit + (1 if refund else 0))


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
        """Whether to answer ``found``: it holds messages, the wait is over, or the loop the read
        works for is stopping (liveness.stops_with: its sleeps end then, liveness.unless_stopping)."""
        return bool(found) or time.monotonic() >= self._deadline or stop_requested()

    def timeout(self) -> float:
        """How long to sleep: until the deadline, but never longer than a poll interval."""
        return max(0.0, min(self._deadline - time.monotonic(), self.poll_interval))
