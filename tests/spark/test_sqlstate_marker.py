"""The SQLSTATE of a database error, carried through the text Spark relays it in
(pgbroker.spark.sqlstate_marker): the data source's connections mark it, the jobs read it back and
start their query again on a transient one only. Errors raised by a real server, relayed as a
Python worker relays them (its traceback, inside Spark's message); the end to end runs are in
test_transient.py.
"""

from __future__ import annotations

import traceback

import pytest

from pgbroker.errors import DatabaseError, PgbrokerError, QueueNotFound
from pgbroker.spark.connect import connect, queue_table
from pgbroker.spark.jobs.common import JobFailed, relayed_sqlstate
from pgbroker.spark.jobs.restarts import _database_cause, _server_started_at
from tests.spark.helpers import Conn, create

INSERT = "INSERT INTO pgmq.q_q (message) VALUES ('{}')"


def data_source_error(dsn: str, *statements: str) -> PgbrokerError:
    """What the data source raises when the last of ``statements`` fails."""
    try:
        with connect(dsn, role="test") as conn:
            for statement in statements:
                conn.execute(statement)
    except PgbrokerError as error:
        return error
    raise AssertionError(f"no error from {statements}")


def raising(sqlstate: str, message: str) -> str:
    return f"DO $$ BEGIN RAISE EXCEPTION E'{message}' USING ERRCODE = '{sqlstate}'; END $$"


def relayed(error: BaseException) -> JobFailed:
    """The JobFailed watch() makes of a streaming query that a task raising ``error`` ended."""
    spark_text = (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: Job aborted due to stage "
        "failure: org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        + "".join(traceback.format_exception(error))
        + "\n\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException\n"
    )
    failed = JobFailed("the query failed")
    failed.__cause__ = RuntimeError(spark_text)
    return failed


def test_a_lock_timeout_is_marked_and_restarts_the_job(dsn: str, conn: Conn) -> None:
    create(conn, "q")
    with conn.transaction():
        conn.execute("LOCK TABLE pgmq.q_q IN SHARE MODE")
        error = data_source_error(dsn, "SET lock_timeout = 50", INSERT)
    assert type(error) is DatabaseError
    assert error.message.endswith(" [SQLSTATE 55P03]"), error.message
    assert relayed_sqlstate(relayed(error)) == "55P03"
    assert _database_cause(relayed(error), dsn, _server_started_at(dsn)) == "transient"


def test_a_statement_timeout_restarts_the_job(dsn: str) -> None:
    error = data_source_error(dsn, "SET statement_timeout = 50", "SELECT pg_sleep(10)")
    assert relayed_sqlstate(relayed(error)) == "57014"
    assert _database_cause(relayed(error), dsn, _server_started_at(dsn)) == "transient"


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])
def test_a_deadlock_or_serialization_failure_restarts_the_job(dsn: str, sqlstate: str) -> None:
    error = data_source_error(dsn, raising(sqlstate, "try again"))
    assert relayed_sqlstate(relayed(error)) == sqlstate
    assert _database_cause(relayed(error), dsn, _server_started_at(dsn)) == "transient"


def test_a_permission_denied_ends_the_job(dsn: str, conn: Conn) -> None:
    create(conn, "q")
    error = data_source_error(dsn, "SET ROLE pg_read_all_data", INSERT)
    assert relayed_sqlstate(relayed(error)) == "42501"
    assert _database_cause(relayed(error), dsn, _server_started_at(dsn)) is None


def test_a_job_error_ends_the_job(dsn: str) -> None:
    error = data_source_error(dsn, "SELECT 1 / 0")
    assert relayed_sqlstate(relayed(error)) == "22012"
    assert _database_cause(relayed(error), dsn, _server_started_at(dsn)) is None


def test_pgbroker_errors_are_told_by_their_class_not_marked(dsn: str) -> None:
    with pytest.raises(QueueNotFound) as raised, connect(dsn, role="test") as conn:
        queue_table(conn, "nope")
    assert "SQLSTATE" not in str(raised.value)
    assert relayed_sqlstate(relayed(raised.value)) is None


def test_only_a_pgbroker_error_line_is_read(dsn: str) -> None:
    # A function of the job raising, its message made to look like a marked one: still the job's.
    failed = relayed(ValueError("refused [SQLSTATE 40P01]"))
    assert relayed_sqlstate(failed) is None
    assert _database_cause(failed, dsn, _server_started_at(dsn)) is None


def test_a_marker_on_a_later_line_of_the_message_is_not_read(dsn: str) -> None:
    # The first line of a message is what the jobs read: a marker past it ends the job (safe side).
    error = data_source_error(dsn, raising("40P01", "two\\nlines"))
    assert error.message.endswith(" [SQLSTATE 40P01]")
    assert relayed_sqlstate(relayed(error)) is None
