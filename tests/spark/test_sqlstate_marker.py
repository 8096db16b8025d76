"""The SQLSTATE of a database error, carried through the text Spark relays it in
(pgbroker.spark.sqlstate_marker): the data source's connections mark it, the jobs read it back and
start their query again on a transient one only. Errors raised by a real server, relayed as a
Python worker relays them (its traceback, inside Spark's message); the end to end runs are in
test_transient.py.
"""

from __future__ import annotations

import traceback
import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgbroker.errors import DatabaseError, PgbrokerError, QueueNotFound
from pgbroker.spark.connect import CANNOT_CONNECT, connect, queue_table
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


def test_a_message_of_several_lines_is_marked_on_its_first(dsn: str) -> None:
    # The line Spark's text shows after the error's class, and the one the jobs read.
    error = data_source_error(dsn, raising("40P01", "two\\nlines"))
    assert error.message == "two [SQLSTATE 40P01]\nlines"
    assert relayed_sqlstate(relayed(error)) == "40P01"


def test_no_connection_slot_left_restarts_the_job(dsn: str, conn: Conn) -> None:
    role = f"t{uuid.uuid4().hex[:10]}_one_slot"  # roles belong to the server: a name of its own
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 1").format(sql.Identifier(role)))
    try:
        one_slot = make_conninfo(dsn, user=role)
        with psycopg.connect(one_slot):  # the role's only slot, taken
            error = data_source_error(one_slot)
    finally:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    assert error.message.startswith(CANNOT_CONNECT), error.message
    assert relayed_sqlstate(relayed(error)) == "53300", error.message
    assert _database_cause(relayed(error), dsn, _server_started_at(dsn)) == "transient"


def test_a_connection_refused_for_good_is_not_transient(dsn: str) -> None:
    error = data_source_error(make_conninfo(dsn, dbname=f"missing_{uuid.uuid4().hex[:10]}"))
    assert relayed_sqlstate(relayed(error)) == "3D000", error.message
