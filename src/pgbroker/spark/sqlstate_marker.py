"""The SQLSTATE of a database error the data source raises, carried through Spark to the job.

An error raised in a Spark task, or in the Python process of a streaming source, reaches the job's
driver only as text: Spark's exception (a PythonException, a StreamingQueryException) quotes the
Python traceback, whose last line is the error's class and str(). A DatabaseError's class does not
say what Postgres refused: a deadlock and a permission denied are both DatabaseError, and their
messages are in the server's lc_messages. So the data source (pgbroker.spark.connect) ends the
message of each DatabaseError with the SQLSTATE the server sent, ``[SQLSTATE 40P01]``, and
``marked_sqlstate`` reads it back from the error's line: this module alone writes and reads it.
pgbroker's own errors (QueueNotFound, ...) are told by their class name and are not marked.
"""

from __future__ import annotations

import re

import psycopg

from pgbroker.errors import DatabaseError, PgbrokerError, from_postgres

__all__ = ["database_error", "marked_sqlstate"]

_MARKED = re.compile(r" \[SQLSTATE ([0-9A-Z]{5})\]$")


def database_error(exc: psycopg.Error) -> PgbrokerError:
    """``from_postgres(exc)``, a DatabaseError's message ending with its SQLSTATE's marker."""
    error = from_postgres(exc)
    # Only the plain DatabaseError: pgbroker's own errors, and a lost connection, say it by class.
    if type(error) is DatabaseError and error.sqlstate:
        error.message = f"{error.message} [SQLSTATE {error.sqlstate}]"
        error.args = (error.message,)
    return error


def marked_sqlstate(message: str) -> str | None:
    """The SQLSTATE ``message`` (an error's message, or its first line) ends with, if marked."""
    found = _MARKED.search(message.rstrip())
    return found[1] if found else None
