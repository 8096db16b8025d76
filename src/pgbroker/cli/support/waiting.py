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
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg

from pgbroker._db.backoff import Backoff
from pgbroker._db.refusals import passes
from pgbroker.cli.support.errors import CliError, first_line
from pgbroker.errors import PgbrokerError
from pgbroker.runtime._log_events import log_event
from pgbroker.runtime._signals import stop_asked_within

T = TypeVar("T")

# Pauses between tries: doubling (jittered, so that a fleet does not come back in step) up to 10 s.
REACH_RETRY = (0.5, 10.0)


def until_reachable(attempt: Callable[[], T], *, within: float | None, refused_too: bool = False) -> T | None:
    """``attempt()``, tried again while it fails to reach the database (refusals.passes), with a
    WARNING each try (what failed, the next try in how long), for ``within`` seconds at most
    (None: for ever; 0: no second try); None when SIGTERM or SIGINT came before or during a pause.
    ``refused_too``: a connection refused for a reason that stays (a login) is tried again as
    well, as a running command's pool does (a replacement of a worker process)."""
    retry = Backoff(*REACH_RETRY)
    deadline = None if within is None else time.monotonic() + within
    while True:
        try:
            return attempt()
        except Exception as exc:
            left = float("inf") if deadline is None else deadline - time.monotonic()
            if left <= 0 or not (passes(exc) or (refused_too and _connection_refused(exc))):
                raise
            pause = min(retry.next(), left)
            log_event(
                logging.WARNING, "start.database_unavailable", error=_message(exc), retry_in=f"{pause:.1f}"
            )
            if stop_asked_within(pause):
                return None


def _connection_refused(exc: Exception) -> bool:
    """Whether ``exc`` is a connection that could not be made (its cause libpq's, with no
    SQLSTATE), not an error of a call on one (pgbroker not installed, a queue missing)."""
    cause = exc.__cause__
    return isinstance(cause, psycopg.OperationalError) and not cause.sqlstate


def _message(exc: Exception) -> str:
    if isinstance(exc, CliError | PgbrokerError):
        return first_line(exc.message)
    return first_line(str(exc))
