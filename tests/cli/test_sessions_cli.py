"""`pgbroker sessions`: the operator's way to find a client that called pgmq.set_vt or a stream read
inside an explicit transaction and left it open (idle in transaction), which holds what it locked
from the other consumers, the stream's tables from its retention, and dead tuples from vacuum."""

from __future__ import annotations

import json

import psycopg

from tests.support.cli import Cli


def test_sessions_names_the_clients_left_idle_in_transaction_and_what_they_hold(cli: Cli, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgmq.create('jobs')")
        conn.execute("SELECT pgmq.send('jobs', '{}')")
        conn.execute("SELECT pgbroker.create_stream('events', 2)")
        conn.execute("SELECT pgbroker.create_stream_group('events', 'g', 'start')")
        conn.execute("SELECT pgbroker.stream_send('events', '{}')")
    assert "no transaction open longer than 0s holds" in cli.ok("sessions", "--older-than", "0")

    with (
        psycopg.connect(dsn, application_name="billing-worker") as queue_client,
        psycopg.connect(dsn, application_name="audit-reader") as stream_client,
    ):
        queue_client.execute("SELECT * FROM pgmq.set_vt('jobs', 1, 30)")
        stream_client.execute("SELECT * FROM pgbroker.stream_read('events', 'g', 'audit', 10, 30)")
        pids = {
            "billing-worker": queue_client.info.backend_pid,
            "audit-reader": stream_client.info.backend_pid,
        }

        listed = json.loads(cli.ok("--json", "sessions", "--older-than", "0"))
        text = cli.ok("sessions", "--older-than", "0")
        assert json.loads(cli.ok("--json", "sessions", "--older-than", "1h")) == []

    by_application = {s["application_name"]: s for s in listed}
    assert set(by_application) == set(pids)
    for application, pid in pids.items():
        session = by_application[application]
        assert session["pid"] == pid
        assert session["state"] == "idle in transaction"
        assert session["holds_horizon"] is True
        assert str(pid) in text
    assert "pgmq.q_jobs" in by_application["billing-worker"]["tables"]
    assert "set_vt" in by_application["billing-worker"]["query"]
    assert "pgbroker.stream_cursor" in by_application["audit-reader"]["tables"]
    assert "pgbroker.s_events_0" in by_application["audit-reader"]["tables"]  # the child table it read
    assert "idle in transaction" in text
    assert "pg_terminate_backend(PID)" in text
