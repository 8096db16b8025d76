"""The SQLSTATE of a database error the data source raises, carried through Spark to the job.

An error raised in a Spark task, or in the Python process of a streaming source, reaches the job's
driver only as text: Spark's exception (a PythonException, a StreamingQueryException) quotes the
Python traceback, whose last line is the error's class and str(). A DatabaseError's class does not
say what Postgres refused: a deadlock and a permission denied are both DatabaseError, and their
messages are in the server's lc_messages. So the data source (pgbroker.spark.connect) ends the
first line of the message of each DatabaseError, and of a connection the server refused, with the
SQLSTATE the server sent, ``[SQLSTATE 40P01]``, and ``marked_sqlstate`` reads it back from the
error's line: this module alone writes and reads it. pgbroker's own errors (QueueNotFound, ...)
are told by their class name and are not marked.
"""

from __future__ import annotations

import re

import psycopg

from pgbroker.errors import DatabaseError, PgbrokerError, from_postgres

__all__ = ["database_error", "mark", "marked_sqlstate"]

_MARKED = re.compile(r" \[SQLSTATE ([0-9A-Z]{5})\]$")


def mark(message: str, sqlstate: str | None) -> str:
    """``message`` with the marker of ``sqlstate`` at the end of its first line (the line Spark's
    text shows after the error's class), unchanged without a SQLSTATE."""
    if not sqlstate:
        return message
    first, newline, rest = message.partition("\n")
    return f"{first} [SQLSTATE {sqlstate}]{newline}{rest}"


def database_error(exc: psycopg.Error) -> PgbrokerError:
    """``from_postgres(exc)``, a DatabaseError's message marked with its SQLSTATE."""
    error = from_postgres(exc)
    # Only the plain DatabaseError: pgbroker's own errors, and a lost connection, say it by class.
    if type(error) is DatabaseError:
        error.message = mark(error.message, error.sqlstate)
        error.args = (error.message,)
    return error


def marked_sqlstate(first_line: str) -> str | None:
    """The SQLSTATE the first line of an error's message ends with, if it was marked."""
    found = _MARKED.search(first_line.rstrip())
    return found[1] if found else None
