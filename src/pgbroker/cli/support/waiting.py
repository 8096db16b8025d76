"""Waiting for a database out of reach at the start of a long-running command (worker, serve,
bridge, scheduler), as the running ones ride out an outage: a process started during a restart or
a failover (a deploy, a node reboot) that exited instead stayed down for good under a shell, and
for minutes under Kubernetes (CrashLoopBackOff's growing pauses) after the database was back.

Only a failure that ends on its own waits: the server down or not yet there, starting up,
shutting down, in recovery, a standby when the DSN asks for a primary, out of connection slots.
A refusal that stays (a wrong password, a database or role that does not exist, pgbroker not
installed, a DSN that cannot be used) still fails at once.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg

from pgbroker._db.backoff import Backoff
from pgbroker._db.liveness import is_read_only_server
from pgbroker._db.refusals import refusal_sqlstates
from pgbroker.cli.support.errors import CliError, first_line
from pgbroker.errors import PgbrokerError
from pgbroker.runtime._log_events import log_event
from pgbroker.runtime._signals import stop_asked_within

T = TypeVar("T")

# Pauses between tries: doubling (jittered, so that a fleet does not come back in step) up to 10 s.
REACH_RETRY = (0.5, 10.0)

# libpq's own words for a server it did not reach, or that it left (no SQLSTATE: no server answered
# with an error). libpq says them in English in a process that leaves LC_MESSAGES alone, as Python does.
_NOT_REACHED = re.compile(
    "|".join(
        (
            r"Connection refused",
            r'socket "[^"]*" failed: No such file or directory',  # the server is down
            r"Connection reset by peer",
            r"No route to host",
            r"Network is unreachable",
            r"timeout expired",
            r"server closed the connection unexpectedly",
            r"session is read-only",  # target_session_attrs=read-write and a standby not yet promoted
            r"server is in hot standby mode",
        )
    )
)
# The server's own words, in English, for a refusal that passes: only when its SQLSTATE cannot be had
# (refusals.refusal_sqlstates), since a server with another lc_messages says them otherwise.
_SERVER_PASSING = re.compile(
    "|".join(
        (
            r"the database system is (starting up|shutting down|in recovery mode"
            r"|not yet accepting connections|not accepting connections)",
            r"too many clients",
            r"too many connections for (role|database)",  # a CONNECTION LIMIT, reached for now
            r"remaining connection slots are reserved",
        )
    )
)
# SQLSTATEs of a refusal that passes: a connection exception (08), insufficient resources (53: out
# of connection slots, a role's or database's CONNECTION LIMIT, memory, disk), a shutdown (57P01,
# 57P02) or a server that cannot take connections now (57P03: starting up, shutting down, in
# recovery), a read-only server (25006); and 00000, connected when asked again.
_PASSING_CLASSES = ("00", "08", "53")
_PASSING_STATES = ("57P01", "57P02", "57P03", "25006")


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is a failure to reach the database that
    ends on its own, rather than a refusal that stays: by the SQLSTATE the server gave, whatever
    the language of its message; by libpq's words when no server answered."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, psycopg.OperationalError) and _passes(seen):
            return True
        if is_read_only_server(seen):
            return True
        seen = seen.__cause__
    return False


def _passes(error: psycopg.OperationalError) -> bool:
    if error.sqlstate:  # an error on a session that was made
        return _passing_state(error.sqlstate)
    message = str(error)
    if _NOT_REACHED.search(message):
        return True
    # A failed connection: psycopg has no SQLSTATE for it, the refusal is asked for its own.
    states = None if error.pgconn is None else refusal_sqlstates(error.pgconn)
    if states:
        return any(_passing_state(state) for state in states)
    return bool(_SERVER_PASSING.search(message))


def _passing_state(sqlstate: str) -> bool:
    return sqlstate[:2] in _PASSING_CLASSES or sqlstate in _PASSING_STATES


def until_reachable(attempt: Callable[[], T], *, within: float | None) -> T | None:
    """``attempt()``, tried again while it fails to reach the database (is_unreachable), with a
    WARNING each try (what failed, the next try in how long), for ``within`` seconds at most
    (None: for ever; 0: no second try); None when SIGTERM or SIGINT came before or during a pause."""
    retry = Backoff(*REACH_RETRY)
    deadline = None if within is None else time.monotonic() + within
    while True:
        try:
            return attempt()
        except Exception as exc:
            left = float("inf") if deadline is None else deadline - time.monotonic()
            if left <= 0 or not is_unreachable(exc):
                raise
            pause = min(retry.next(), left)
            log_event(
                logging.WARNING, "start.database_unavailable", error=_message(exc), retry_in=f"{pause:.1f}"
            )
            if stop_asked_within(pause):
                return None


def _message(exc: Exception) -> str:
    if isinstance(exc, CliError | PgbrokerError):
        return first_line(exc.message)
    return first_line(str(exc))
