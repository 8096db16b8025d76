"""A bound on the wait for the server's answer on the data source's blocking connections.

A hung server, a stuck pooler or a network that drops packets without a word leaves a call
waiting forever: statement_timeout cannot end it (the server may not be running the statement at
all), nor can TCP keepalives (a stopped backend's kernel still answers them). So the calls of the
driver's source process are bounded: past the bound the connection's socket is shut down
(pgbroker._db.liveness.cut_if_unanswered), which wakes the call at once, and the call fails as a
lost connection (NoAnswer, as the asyncio clients' answered_within; a ConnectionLost once
pgbroker.spark.connect has it). The threads that run for the whole query (lease renewals,
releases) make the call again on a new connection (connect.KeptConnection); a driver call that
fails ends the query visibly (the jobs start it again) instead of stalling it without a word.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.abc import Params, QueryNoTemplate

from pgbroker._db.liveness import cut_if_unanswered

Cursor = psycopg.Cursor[tuple[Any, ...]]

# How long a statement of the driver may go without an answer, beyond what it waits for on purpose
# (a watermark waiting for senders): far more than any of them takes.
DRIVER_ANSWER_SECONDS = 300.0


def driver_answer_within(waits_seconds: float = 0.0) -> float:
    """The bound of a driver statement that may wait ``waits_seconds`` in the server on purpose."""
    return DRIVER_ANSWER_SECONDS + waits_seconds


def answering_cursors(seconds: float) -> type[Cursor]:
    """A cursor_factory whose every execute() is answered within ``seconds`` (or NoAnswer)."""

    class AnsweringCursor(Cursor):
        def execute(  # type: ignore[override]
            self,
            query: QueryNoTemplate,
            params: Params | None = None,
            *,
            prepare: bool | None = None,
            binary: bool | None = None,
        ) -> AnsweringCursor:
            with cut_if_unanswered(self.connection, seconds):
                return super().execute(query, params, prepare=prepare, binary=binary)

    return AnsweringCursor
