"""The least-privilege roles of ``pgbroker install --roles``, used by real LOGIN users that are
members of them: each can do its operations and nothing else, on queues made before and after."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgbroker import Broker, StreamMessage, StreamWorker, Worker
from pgbroker._db.install import install, install_roles
from pgbroker.streams._client import Stream
from tests.support.roles import KINDS, role_logins
from tests.support.worker import run_until

Conn = psycopg.Connection[Any]


@pytest.fixture
def users(dsn: str, conn: Conn, pg_admin_dsn: str) -> Iterator[dict[str, str]]:
    """A DSN per role kind, for a LOGIN user that is a member of that role (and nothing else)."""
    with role_logins(dsn, conn, pg_admin_dsn) as dsns:
        yield dsns


def denied(dsn: str, statement: str) -> bool:
    """Whether ``statement`` fails for lack of privilege (any other outcome is not a denial)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        try:
            c.execute(statement.encode())
        except psycopg.errors.InsufficientPrivilege:
            return True
    return False


@pytest.fixture
def jobs(conn: Conn) -> str:
    conn.execute("SELECT pgmq.create('jobs')")
    conn.execute("""SELECT pgmq.send('jobs', '{"secret": "payload"}')""")
    return "jobs"


def test_producer_sends_but_cannot_read(users: dict[str, str], jobs: str) -> None:
    with Broker(users["producer"]) as producer:
        assert producer.queue(jobs).send_many([{"n": 1}, {"n": 2}], headers=[{"h": 1}, None])
        assert producer.queue(jobs).send({"n": 3}, delay=5)
    for statement in (
        "SELECT * FROM pgmq.read('jobs', 30, 1)",
        "SELECT * FROM pgbroker.read('jobs', 30, 1)",
        "SELECT * FROM pgmq.pop('jobs')",
        "SELECT pgmq.delete('jobs', 1::bigint)",
        "SELECT pgmq.archive('jobs', 1::bigint)",
        "SELECT * FROM pgbroker.peek('jobs')",
        "SELECT message FROM pgmq.q_jobs",
        "SELECT pgmq.purge_queue('jobs')",
    ):
        assert denied(users["producer"], statement), statement


def test_consumer_reads_and_acks_but_cannot_create_drop_or_purge(
    users: dict[str, str], jobs: str, conn: Conn
) -> None:
    with Broker(users["consumer"]) as consumer:
        queue = consumer.queue(jobs)
        [message] = queue.read_many(10, vt=30)
        assert message.message == {"secret": "payload"}
        queue.ack(message)
        assert queue.read_many(10, wait=0.3) == []  # the long poll (LISTEN, then a read) works too
    assert conn.execute("SELECT count(*) FROM pgmq.a_jobs").fetchone() == (1,)
    # consume: the ack of one batch and the read of the next in one call.
    conn.execute("""SELECT pgmq.send('jobs', '{"n": 2}')""")
    with psycopg.connect(users["consumer"], autocommit=True) as consumer_conn:
        row = consumer_conn.execute(
            "SELECT message, receipt FROM pgbroker.consume('jobs', 30, 10)"
        ).fetchone()
        assert row is not None
        assert row[0] == {"n": 2}
        consumer_conn.execute("SELECT pgbroker.consume('jobs', 30, 10, ARRAY[%s])", (row[1],))
    assert conn.execute("SELECT count(*) FROM pgmq.a_jobs").fetchone() == (2,)
    for statement in (
        "SELECT pgmq.drop_queue('jobs')",
        "SELECT pgmq.create('other')",
        "SELECT pgmq.purge_queue('jobs')",
        "SELECT pgmq.send('jobs', '{}')",
        "DELETE FROM pgmq.q_jobs",
        "DROP TABLE pgmq.q_jobs",
    ):
        assert denied(users["consumer"], statement), statement
    assert conn.execute("SELECT queue_name FROM pgmq.list_queues()").fetchall() == [("jobs",)]


def test_monitor_sees_metrics_but_no_payloads(users: dict[str, str], jobs: str, conn: Conn) -> None:
    conn.execute("SELECT pgmq.archive('jobs', 1::bigint)")
    conn.execute("""SELECT pgmq.send('jobs', '{"secret": "second"}')""")
    with psycopg.connect(users["monitor"], autocommit=True) as monitor:
        assert monitor.execute("SELECT queue_length FROM pgmq.metrics('jobs')").fetchone() == (1,)
        assert monitor.execute("SELECT count(*) FROM pgmq.metrics_all()").fetchone() == (1,)
        assert monitor.execute("SELECT queue_name FROM pgmq.list_queues()").fetchall() == [("jobs",)]
        row = monitor.execute(
            "SELECT queue_length, total_sent FROM pgbroker.queue_stats() WHERE queue_name = 'jobs'"
        ).fetchone()
        assert row == (1, 2)
    for statement in (
        "SELECT message FROM pgmq.q_jobs",
        "SELECT message FROM pgmq.a_jobs",
        "SELECT msg_id FROM pgmq.q_jobs",
        "SELECT * FROM pgmq.read('jobs', 0, 1)",
        "SELECT * FROM pgbroker.peek('jobs')",
        "SELECT * FROM pgbroker.dead_letters('jobs')",
        "SELECT * FROM pgmq.set_vt('jobs', 2::bigint, 0)",
    ):
        assert denied(users["monitor"], statement), statement


def test_queues_created_after_the_roles_are_usable(users: dict[str, str], conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('later')")
    with Broker(users["producer"]) as producer:
        producer.queue("later").send({"late": True})
    with Broker(users["consumer"]) as consumer:
        [message] = consumer.queue("later").read_many(5)
        consumer.queue("later").ack(message, archive=False)
    assert denied(users["monitor"], "SELECT message FROM pgmq.q_later")
    assert denied(users["producer"], "SELECT * FROM pgmq.read('later', 30, 1)")


def test_roles_are_idempotent_and_survive_an_upgrade(users: dict[str, str], jobs: str, conn: Conn) -> None:
    prefix = users["producer"].split("user=")[1].split("_producer")[0]
    first = install_roles(conn, prefix)
    assert install_roles(conn, prefix) == first
    assert set(first) == {f"{prefix}_{kind}" for kind in KINDS}
    # Function files that redefine an entry point reset it to SECURITY INVOKER: the producer
    # loses sending (and gains nothing); the install that applies them grants it again. Here the
    # database last ran other function files (another package version's).
    conn.execute("ALTER FUNCTION pgmq.send(text, jsonb) SECURITY INVOKER")
    conn.execute("UPDATE pgbroker.schema_functions SET checksum = 'another version'")
    assert denied(users["producer"], "SELECT pgmq.send('jobs', '{}')")
    install(conn)
    assert not denied(users["producer"], "SELECT pgmq.send('jobs', '{}')")


def test_grants_are_exactly_the_listed_entry_points(users: dict[str, str], conn: Conn) -> None:
    prefix = users["producer"].split("user=")[1].split("_producer")[0]
    listed = {
        kind: {row[0] for row in conn.execute("SELECT pgbroker._role_procs(%s)::regprocedure::text", (kind,))}
        for kind in KINDS
    }
    definers = {
        row[0]
        for row in conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname IN ('pgmq', 'pgbroker') AND p.prosecdef"
        )
    }
    # Two internal definers rewrite the routes (90_routes.sql) whoever creates a queue; no role
    # may call them (checked with the rest below).
    internal = {"pgbroker._write_routes()", "pgbroker._routes_changed()"}
    assert definers == set().union(*listed.values()) | internal
    assert "pgmq.send(text,jsonb)" in listed["producer"]
    assert "pgmq.metrics(text)" in listed["monitor"]
    for kind in KINDS:
        role = f"{prefix}_{kind}"
        callable_definers = {
            name
            for name in definers
            if conn.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')", (role, name)).fetchone()
            == (True,)
        }
        assert callable_definers == listed[kind], kind
        tables = conn.execute(
            "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname IN ('pgmq', 'pgbroker') AND c.relkind IN ('r', 'p', 'v', 'S')"
            " AND (has_table_privilege(%s, c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE')"
            "      OR (c.relkind = 'S' AND has_sequence_privilege(%s, c.oid, 'USAGE, SELECT, UPDATE')))",
            (role, role),
        ).fetchall()
        assert tables == [], kind


def test_entry_points_are_not_open_to_public(users: dict[str, str], conn: Conn, dsn: str) -> None:
    stranger = f"t{uuid.uuid4().hex[:10]}_stranger"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(stranger)))
    try:
        conn.execute("SELECT pgmq.create('jobs')")
        for statement in ("SELECT pgmq.send('jobs', '{}')", "SELECT * FROM pgmq.metrics('jobs')"):
            assert denied(make_conninfo(dsn, user=stranger), statement), statement
        reachable = conn.execute(
            "SELECT p::regprocedure::text FROM pgbroker._role_procs(NULL) p"
            " WHERE has_function_privilege(%s, p, 'EXECUTE')",
            (stranger,),
        ).fetchall()
        assert reachable == []
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(stranger)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(stranger)))


def test_the_roles_use_the_job_features(users: dict[str, str], jobs: str, conn: Conn) -> None:
    """A producer's first prioritized send builds the priority index (as the installer), a dedup
    key holds for it, a consumer's reads follow the limits, and the monitor sees the pause flag
    the /metrics gauge reports (pgbroker.is_paused)."""
    conn.execute("SELECT pgbroker.set_policy('jobs', max_in_flight => 2)")
    with psycopg.connect(users["producer"], autocommit=True) as producer:
        producer.execute("""SELECT pgmq.send('jobs', '{"n": 9}', '{"x-pgbroker-priority": 9}'::jsonb)""")
        first = producer.execute("""SELECT pgmq.send('jobs', '{}', '{"x-pgbroker-dedup-key": "k"}'::jsonb)""")
        again = producer.execute("""SELECT pgmq.send('jobs', '{}', '{"x-pgbroker-dedup-key": "k"}'::jsonb)""")
        assert first.fetchone() == again.fetchone()
    with psycopg.connect(users["consumer"], autocommit=True) as consumer:
        got = consumer.execute("SELECT message FROM pgbroker.read('jobs', 30, 10)").fetchall()
        assert len(got) == 2
        assert got[0] == ({"n": 9},)
    conn.execute("SELECT pgbroker.pause('jobs')")
    with psycopg.connect(users["monitor"], autocommit=True) as monitor:
        assert monitor.execute("SELECT pgbroker.is_paused('jobs')").fetchone() == (True,)


def test_a_stream_worker_runs_under_the_consumer_role(dsn: str, users: dict[str, str]) -> None:
    """The consumer role runs a StreamWorker as it comes: it looks up its group's retry queue
    (stream_groups) and whether the stream notifies (streams) at its start, reads and acks the
    group, and handles a failed message again through the retry queue's worker."""
    with Broker(dsn) as owner:
        clicks = Stream(owner, "clicks")
        clicks.create(partitions=2, notify=True)
        clicks.create_group("g", start="start")
        clicks.send_many([{"n": n} for n in range(20)], keys=[str(n % 3) for n in range(20)])
    handled: list[int] = []
    failed_once: list[int] = []

    async def handle(message: StreamMessage) -> None:
        n = message.message["n"]
        if n == 7 and not failed_once:
            failed_once.append(n)
            raise RuntimeError("once")
        handled.append(n)

    worker = StreamWorker("clicks", "g", handle, concurrency=4)
    asyncio.run(run_until(users["consumer"], [worker], lambda: len(handled) == 20, timeout=60))
    assert sorted(handled) == list(range(20))
    assert failed_once == [7]


def test_workers_under_the_consumer_role_say_once_that_they_may_not_maintain(
    dsn: str, users: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Maintenance (a queue's archive retention, a stream's) is the owner's: a Worker and a
    StreamWorker told to maintain under the consumer role each log a warning once, naming the
    owner's command, and go on handling their messages (the StreamWorker's maintenance used to
    end with the permission error unseen)."""
    caplog.set_level(logging.WARNING, logger="pgbroker.worker")
    with Broker(dsn) as owner:
        owner.create_queue("jobs").send_many(list(range(10)))
        clicks = Stream(owner, "clicks")
        clicks.create(partitions=1)
        clicks.create_group("g", start="start")
        clicks.send_many([{"n": n} for n in range(10)])
    jobs: list[int] = []
    clicked: list[int] = []

    async def handle(message: StreamMessage) -> None:
        clicked.append(message.message["n"])

    workers: list[Worker | StreamWorker] = [
        Worker("jobs", lambda message: jobs.append(message.message), maintain_every=0.05),
        StreamWorker("clicks", "g", handle, retries=False, maintain_every=0.05),
    ]
    told: list[float] = []

    def events() -> list[str]:
        return [record.getMessage() for record in caplog.records]

    def done() -> bool:  # both said so, then ten more rounds came and went
        if not told and sum("maintenance_off" in e for e in events()) == 2:
            told.append(time.monotonic())
        return bool(told) and time.monotonic() > told[0] + 0.5 and len(jobs) == len(clicked) == 10

    asyncio.run(run_until(users["consumer"], workers, done, timeout=60))
    logged = events()
    maintenance = sorted(e.split(" ", 1)[0] for e in logged if "maintenance" in e)
    assert maintenance == ["stream_worker.maintenance_off", "worker.maintenance_off"]
    assert any("pgbroker maintain jobs" in e for e in logged)
    assert any("pgbroker stream maintain clicks" in e for e in logged)
