"""`pgbroker scheduler` and `pgbroker schedule ...` as a shell sees them, and the promise of
schedules under real processes on the real clock: 4 scheduler processes on one schedule of
`* * * * *` for 3 minutes send exactly 3 messages, one per tick, even with one of them
SIGKILLed along the way; and a worker runs a scheduler too.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from pgbroker import Broker

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=2"


def _env() -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": UNREACHABLE}


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgbroker.cli", "--dsn", dsn, *args],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def start(dsn: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgbroker.cli", "--dsn", dsn, "-v", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=ROOT,
    )


def sleep_until(moment: datetime) -> None:
    time.sleep(max(0.0, (moment - datetime.now(UTC)).total_seconds()))


def test_schedule_commands(dsn: str) -> None:
    assert cli(dsn, "create", "jobs").returncode == 0
    added = cli(
        dsn,
        "schedule",
        "add",
        "nightly",
        "--queue",
        "jobs",
        "--cron",
        "0 3 * * *",
        "--message",
        '{"task": "report"}',
        "--timezone",
        "Europe/Berlin",
        "--json",
    )
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["timezone"] == "Europe/Berlin"
    again = cli(
        dsn, "schedule", "add", "nightly", "--queue", "jobs", "--cron", "* * * * *", "--message", "{}"
    )
    assert again.returncode == 2
    assert 'schedule "nightly" already exists' in again.stderr
    assert "--replace" in again.stderr
    bad = cli(dsn, "schedule", "add", "x", "--queue", "jobs", "--cron", "0 25 * * *", "--message", "{}")
    assert bad.returncode == 2
    assert "hour: 25 is outside 0-23" in bad.stderr
    missing = cli(dsn, "schedule", "add", "x", "--queue", "nope", "--cron", "* * * * *", "--message", "{}")
    assert missing.returncode == 4
    assert "paused" in cli(dsn, "schedule", "pause", "nightly").stdout
    listed = json.loads(cli(dsn, "schedule", "list", "--json").stdout)
    assert [(s["name"], s["paused"]) for s in listed] == [("nightly", True)]
    assert "next tick" in cli(dsn, "schedule", "resume", "nightly").stdout
    assert "nightly" in cli(dsn, "schedule", "list").stdout
    assert cli(dsn, "schedule", "remove", "nightly").returncode == 0
    assert cli(dsn, "schedule", "remove", "nightly").returncode == 4
    # A name that is not there is "not found" (exit 4) for every command, not a usage error (2).
    for action in ("remove", "pause", "resume"):
        gone = cli(dsn, "schedule", action, "nightly")
        assert gone.returncode == 4, (action, gone.stderr)
        said = 'pgbroker: error: schedule "nightly" does not exist\nhint: List them: pgbroker schedule list\n'
        assert gone.stderr == said
    assert "no schedules" in cli(dsn, "schedule", "list").stdout


def test_peek_command(dsn: str) -> None:
    with Broker(dsn) as broker:
        queue = broker.create_queue("jobs")
        queue.send_many(
            [{"n": n} for n in range(5)], headers=[{"tenant": "a" if n < 2 else "b"} for n in range(5)]
        )
        queue.read_many(1, vt=300)
    peeked = cli(dsn, "peek", "jobs", "--json", "--limit", "2", "--after", "1")
    assert peeked.returncode == 0, peeked.stderr
    lines = [json.loads(line) for line in peeked.stdout.splitlines()]
    assert [(m["msg_id"], m["state"], m["receipt"]) for m in lines] == [
        (2, "waiting", None),
        (3, "waiting", None),
    ]
    table = cli(dsn, "peek", "jobs", "--header", "tenant=a").stdout
    assert "in_flight" in table
    assert len(table.splitlines()) == 3  # header and two messages
    assert cli(dsn, "peek", "jobs", "--state", "dead").stdout.startswith("no messages")
    assert cli(dsn, "peek", "jobs", "--state", "lost").returncode == 2
    # By body fields: the value read as JSON (a number here), else as text.
    by_field = cli(dsn, "peek", "jobs", "--json", "--field", "n=3").stdout.splitlines()
    assert [json.loads(line)["message"] for line in by_field] == [{"n": 3}]
    assert cli(dsn, "peek", "jobs", "--field", "n=3", "--field", "m=1").stdout.startswith("no messages")
    assert cli(dsn, "peek", "jobs", "--field", "n").returncode == 2


def test_a_scheduler_says_it_has_started_without_v(dsn: str) -> None:
    """One line on stderr, as pgbroker worker's and serve's: it printed nothing until stopped."""
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "pgbroker.cli", "--dsn", dsn, "scheduler"],
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    try:
        assert scheduler.stderr is not None
        readable, _, _ = select.select([scheduler.stderr], [], [], 30)
        first = scheduler.stderr.readline() if readable else ""
    finally:
        scheduler.send_signal(signal.SIGTERM)
        _, rest = scheduler.communicate(timeout=30)
    params = conninfo_to_dict(dsn)
    assert first.startswith("pgbroker: scheduler started: no schedules yet (pgbroker schedule add"), first
    assert first.endswith(f" in {params['dbname']} at {params['host']} (stop: Ctrl-C or SIGTERM)\n"), first
    assert "Traceback" not in rest  # (the stop itself, and its exit code, are tested above)


def test_a_scheduler_alone_that_cannot_schedule_fails_with_what_to_do(empty_dsn: str) -> None:
    """`pgbroker scheduler` on a database without pgbroker has nothing to do: it fails (exit 5)
    and says to install, where it logged a warning and exited 0, as if it had been stopped."""
    res = cli(empty_dsn, "scheduler")
    assert res.returncode == 5, res.stderr
    assert "pgbroker: error: pgbroker is not installed" in res.stderr
    assert "hint: Install the schema first: pgbroker install" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_four_schedulers_for_three_minutes_send_exactly_three_messages(dsn: str) -> None:
    with Broker(dsn) as broker:
        queue = broker.create_queue("ticks")
        first = broker.add_schedule("every-minute", "ticks", "* * * * *", {"hello": "cron"}).next_run
        schedulers = [start(dsn, "scheduler") for _ in range(4)]
        try:
            # One of them dies without a word after the first tick: the others carry on.
            sleep_until(first + timedelta(seconds=20))
            schedulers[0].kill()
            # Three ticks (first, +1 min, +2 min), then stop well before the fourth.
            sleep_until(first + timedelta(minutes=2, seconds=30))
        finally:
            for process in schedulers:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            outputs = [process.communicate(timeout=30)[1] for process in schedulers]
        assert [process.returncode for process in schedulers[1:]] == [0, 0, 0], outputs
        messages = queue.peek(100)
    ticks = [m.headers["x-pgbroker-schedule"]["tick"] for m in messages if m.headers]
    expected = [(first + timedelta(minutes=n)).strftime("%Y-%m-%dT%H:%M:%SZ") for n in range(3)]
    assert ticks == expected, outputs
    assert [m.message for m in messages] == [{"hello": "cron"}] * 3
    # Each tick was sent within seconds of its time, by whichever scheduler got it.
    for message, n in zip(messages, range(3), strict=True):
        assert timedelta(0) <= message.enqueued_at - (first + timedelta(minutes=n)) < timedelta(seconds=5)
    assert sum(out.count("schedule.sent") for out in outputs) == 3


@pytest.mark.slow
def test_a_worker_runs_the_scheduler(dsn: str) -> None:
    with Broker(dsn) as broker:
        broker.create_queue("ticks")
        broker.create_queue("work")
        first = broker.add_schedule("every-minute", "ticks", "* * * * *", "tick").next_run
        worker = start(dsn, "worker", "tests.system.test_scheduler_processes:handle", "--queue", "work")
        try:
            sleep_until(first + timedelta(seconds=5))
        finally:
            worker.send_signal(signal.SIGTERM)
            _, stderr = worker.communicate(timeout=30)
        assert worker.returncode == 0, stderr
        assert [m.message for m in broker.queue("ticks").peek()] == ["tick"]


def handle(message: object) -> None:
    """The worker's handler in test_a_worker_runs_the_scheduler (it gets no messages)."""
