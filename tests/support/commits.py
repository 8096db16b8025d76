"""A commit the client cannot see the end of, made for real on a private cluster.

With synchronous_standby_names naming a standby that never connects, a commit is written
locally and then waits for that standby (wait event SyncRep). Terminating the session then
(pg_terminate_backend from another one) ends the connection with the commit already done:
the server warns "the transaction has already committed locally", and the client only sees
its connection go. That is what a crash or failover right at the commit leaves a client with.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

WAIT = "SyncRep"


def _set_standby(dsn: str, names: str | None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if names is None:
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        else:
            conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 60
        while conn.execute("SHOW synchronous_standby_names").fetchone() != (names or "",):
            assert time.monotonic() < deadline, "the setting did not reload"
            time.sleep(0.05)


@contextmanager
def commits_cut_off(dsn: str) -> Iterator[threading.Thread]:
    """While inside: every commit of a writing transaction on the cluster waits for a standby
    that never comes, and the thread yielded (started) terminates the first session seen
    waiting so. Afterwards commits are normal again."""
    _set_standby(dsn, "nobody_connects")
    killed: list[int] = []

    def terminate_the_first_waiting() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event = %s LIMIT 1", (WAIT,)
                ).fetchone()
                if row is not None:
                    conn.execute("SELECT pg_terminate_backend(%s)", row)
                    killed.append(row[0])
                    return
                time.sleep(0.02)

    terminator = threading.Thread(target=terminate_the_first_waiting, daemon=True)
    terminator.start()
    try:
        yield terminator
    finally:
        terminator.join(timeout=130)
        _set_standby(dsn, None)
    assert killed, "no commit waited for the standby: nothing was cut off"
