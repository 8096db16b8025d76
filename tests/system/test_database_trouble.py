"""A long-running command stopped (SIGTERM) while its database is in trouble: its server stopped,
its login refused (a password rotated), or its sessions hung (a frozen server or pooler). The stop
must be prompt whatever the database does: Kubernetes kills 30 s after SIGTERM (systemd after
90 s), and a stop cut off so leaves what it held half done.

With nothing in flight, `pgbroker worker` took 42-53 s to exit 0: its read waited for the pool
(30 s, the pool timeout) or for the hung server (30 s, the lease), then its deregistration waited
for the pool again (30 s) or the server (15 s). Each such call now gives up STOP_PATIENCE (3 s)
after the stop (pgbroker._db.liveness.stops_with).

While their login is refused, `serve`, `scheduler` and the bridges said nothing at ERROR (a worker
has since c761386): each now says so, as the worker does (pgbroker.queues._refusal_watch).

The cluster is a private one that asks the command's role for a password (scram-sha-256), found in
a passfile; the command's sessions carry the application_name that sessions_frozen freezes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import httpx
import psycopg
import pytest

from pgbroker import App, Broker, Message, Stream, StreamMessage
from pgbroker.embedded import EmbeddedPostgres
from tests.support.faults import freezable, sessions_frozen, table_locked
from tests.support.passwords import refuse_login, with_passwords, write_passfile
from tests.support.processes import worker_processes
from tests.support.servers import PrivateServer

ROOT = Path(__file__).resolve().parents[2]
HERE = "tests.system.test_database_trouble"
ROLE = "app"
# A generous bound for a loaded machine (the stop takes about STOP_PATIENCE here), well under the
# 42-53 s it took and under Kubernetes' 30 s.
PROMPT = 20.0
# How long the database is in trouble before the stop: a poll (--poll-max 1s) then waits on it.
SETTLE = 3.0

WORKER = ["worker", f"{HERE}:consume", "--queue", "jobs", "--poll-max", "1s"]
# Each command's arguments, and the line it logs (-v) once its loop runs, its pool open (an
# announcement comes before: trouble then fails the start), once a process.
COMMANDS = {
    "worker": (WORKER, "worker.started"),
    "worker --processes 2": ([*WORKER, "--processes", "2"], "worker.started"),
    "worker of a stream": (["worker", f"{HERE}:streams"], "stream_worker.started"),
    "scheduler": (["scheduler"], "scheduler.started"),
    "serve": (["serve", "--port", "0"], "serving the API"),
}
# The bridges' commands, given a Redis stream's URL.
BRIDGES: dict[str, Callable[[str], tuple[list[str], str]]] = {
    "bridge out": lambda url: (["bridge", "out", "--queue", "jobs", "--to", url], "bridge started"),
    "bridge in": lambda url: (
        ["bridge", "in", "--from", url, "--queue", "jobs", "--declare"],
        "bridge started",
    ),
}


def consume(message: Message) -> None:
    """The workers' handler: the message is archived once it returns."""


streams = App()


@streams.stream_handler("clicks", "g")
def on_click(message: StreamMessage) -> None:
    """The stream worker's handler."""


@contextmanager
def server_stopped(cluster: EmbeddedPostgres) -> Iterator[None]:
    cluster.stop()
    try:
        yield
    finally:
        cluster.start()


@contextmanager
def login_refused(cluster: EmbeddedPostgres) -> Iterator[None]:
    refuse_login(cluster, ROLE, "rotated")
    yield


@contextmanager
def sessions_hung(cluster: EmbeddedPostgres) -> Iterator[None]:
    with sessions_frozen(cluster.dsn()):
        yield


TROUBLES: dict[str, Callable[[EmbeddedPostgres], AbstractContextManager[None]]] = {
    "server stopped": server_stopped,
    "login refused": login_refused,
    "sessions hung": sessions_hung,
}


class Command:
    """`pgbroker -v --dsn DSN ARGS...` in the background, its stderr in a file (a pipe could fill)."""

    def __init__(self, dsn: str, args: list[str], running: str, logs: Path, passfile: Path) -> None:
        self.running = running
        self.log = logs / f"command-{time.monotonic_ns()}.err"
        # Each worker process opens its pool once started: trouble before that fails its start.
        self.processes = int(args[args.index("--processes") + 1]) if "--processes" in args else 1
        with self.log.open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pgbroker.cli", "-v", "--dsn", dsn, *args],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, "PGPASSFILE": str(passfile)},
            )

    def said(self) -> str:
        return self.log.read_text()

    def logged(self) -> list[dict[str, object]]:
        """Its log records (with --log-format json)."""
        return [json.loads(line) for line in self.said().splitlines() if line.startswith("{")]

    def wait_started(self) -> None:
        deadline = time.monotonic() + 60
        while self.said().count(self.running) < self.processes:
            assert self.process.poll() is None, f"exited {self.process.returncode}:\n{self.said()}"
            assert time.monotonic() < deadline, f"not started after 60 s:\n{self.said()}"
            time.sleep(0.1)

    def stop(self) -> tuple[int, float]:
        """SIGTERM; the exit code and the seconds it took (at most 120: then killed)."""
        asked = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"still running 120 s after SIGTERM:\n{self.said()}") from None
        return code, time.monotonic() - asked


@pytest.fixture
def start(cluster: EmbeddedPostgres, tmp_path: Path) -> Iterator[Callable[[tuple[list[str], str]], Command]]:
    """Starts a command as ROLE (its password in a passfile), its sessions freezable; the queue
    "jobs" and the stream "clicks" with its group "g" exist."""
    passfile = tmp_path / "pgpass"
    write_passfile(passfile, ROLE, "first")
    dsn = freezable(with_passwords(cluster, ROLE, "first"))
    with Broker(cluster.dsn()) as broker:
        broker.create_queue("jobs")
        clicks = Stream(broker, "clicks")
        clicks.create(partitions=2)
        clicks.create_group("g", start="start")
    started: list[Command] = []

    def run(command: tuple[list[str], str]) -> Command:
        started.append(Command(dsn, *command, tmp_path, passfile))
        started[-1].wait_started()
        return started[-1]

    yield run
    for command in started:
        if command.process.poll() is None:
            command.process.kill()
            command.process.wait()


@pytest.mark.parametrize("trouble", TROUBLES)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_stop_with_nothing_in_flight_is_prompt_whatever_the_database_does(
    cluster: EmbeddedPostgres, start: Callable[[tuple[list[str], str]], Command], command: str, trouble: str
) -> None:
    stopped_promptly(cluster, start(COMMANDS[command]), trouble)


@pytest.mark.parametrize("trouble", TROUBLES)
@pytest.mark.parametrize("bridge", BRIDGES)
def test_a_bridge_s_stop_is_prompt_whatever_the_database_does(
    cluster: EmbeddedPostgres,
    start: Callable[[tuple[list[str], str]], Command],
    redis_server: PrivateServer,
    bridge: str,
    trouble: str,
) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}?stream=relay"
    stopped_promptly(cluster, start(BRIDGES[bridge](url)), trouble)


def stopped_promptly(cluster: EmbeddedPostgres, running: Command, trouble: str) -> None:
    """The database in ``trouble`` for SETTLE seconds, then SIGTERM: exit 0 within PROMPT seconds."""
    with TROUBLES[trouble](cluster):
        time.sleep(SETTLE)
        code, took = running.stop()
    assert code == 0, running.said()
    assert took < PROMPT, f"{took:.1f} s from SIGTERM to exit:\n{running.said()[-3000:]}"


@pytest.mark.parametrize("command", ["scheduler", "serve", "bridge out"])
def test_a_command_says_at_error_that_its_login_is_refused_while_it_runs(
    cluster: EmbeddedPostgres,
    start: Callable[[tuple[list[str], str]], Command],
    redis_server: PrivateServer,
    command: str,
) -> None:
    """As a worker does (tests/runtime/test_worker_refused_login.py): the refusal in the server's
    words, at ERROR, where they said only that no connection came, or nothing at all."""
    url = f"redis://127.0.0.1:{redis_server.port}?stream=relay"
    args, running_line = COMMANDS[command] if command in COMMANDS else BRIDGES[command](url)
    running = start(([*args, "--log-format", "json"], running_line))
    refuse_login(cluster, ROLE, "rotated")

    def refused() -> list[dict[str, object]]:
        event = f"{command.split()[0]}.database_refused"
        return [r for r in running.logged() if r.get("event") == event and r["level"] == "error"]

    deadline = time.monotonic() + 120  # a scheduler calls every 30 s when it has nothing to send
    while not refused():
        assert running.process.poll() is None, running.said()
        assert time.monotonic() < deadline, f"no ERROR naming the refusal:\n{running.said()[-3000:]}"
        time.sleep(0.5)
    assert 'password authentication failed for user "app"' in str(refused()[0]["error"]), refused()
    assert running.stop()[0] == 0, running.said()


# The table each command reads just before it used to print its start line (command.started).
READ_BEFORE_THE_LINE = {"scheduler": "pgbroker.schedules", "worker --processes 2": "pgmq.meta"}


@pytest.mark.parametrize("command", READ_BEFORE_THE_LINE)
def test_a_login_refused_before_the_pool_opens_fails_the_start_unannounced(
    cluster: EmbeddedPostgres, tmp_path: Path, command: str
) -> None:
    """The start line says the command runs: it used to come before the command's own pool (the
    scheduler's, each worker process's) was open, so a login refused in between exited 5 after
    'started'. The command is held on its last read before that point (the table locked), the
    login refused meanwhile: it exits 5 and never said it started."""
    passfile = tmp_path / "pgpass"
    write_passfile(passfile, ROLE, "first")
    dsn = with_passwords(cluster, ROLE, "first")
    with Broker(cluster.dsn()) as broker:
        broker.create_queue("jobs")
    with table_locked(cluster.dsn(), READ_BEFORE_THE_LINE[command]):
        running = Command(dsn, COMMANDS[command][0], "", tmp_path, passfile)
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND wait_event_type = 'Lock'"
            deadline = time.monotonic() + 60
            while conn.execute(waiting, [ROLE]).fetchone() == (0,):
                assert running.process.poll() is None, running.said()
                assert time.monotonic() < deadline, f"never waited on the lock:\n{running.said()}"
                time.sleep(0.05)
            conn.execute(f"ALTER ROLE {ROLE} PASSWORD 'rotated'")  # its session waiting on the lock stays
    code = running.process.wait(timeout=120)
    assert code == 5, running.said()
    assert 'password authentication failed for user "app"' in running.said()
    assert " started" not in running.said().replace("supervisor.started", ""), running.said()


def test_serve_starts_with_fewer_connections_than_its_pool_when_its_role_is_limited(
    cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    """A role's CONNECTION LIMIT (3) below serve's --connections (10): serve answers with the
    connections it gets, as a worker does, where its start waited for all ten, then exited 3 (a
    stale receipt, by pgbroker's exit codes) after 30 s with uvicorn's 'Application startup
    failed'."""
    passfile = tmp_path / "pgpass"
    write_passfile(passfile, ROLE, "first")
    dsn = with_passwords(cluster, ROLE, "first")
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(f"ALTER ROLE {ROLE} CONNECTION LIMIT 3")
    running = Command(
        dsn, ["serve", "--port", "0", "--connections", "10"], "serving the API", tmp_path, passfile
    )
    try:
        running.wait_started()
        url = running.said().split("serving the API at ", 1)[1].split("/v1", 1)[0]
        assert httpx.get(f"{url}/healthz", timeout=60).status_code == 200, running.said()
        assert running.stop()[0] == 0, running.said()
    finally:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait()


def test_a_replacement_worker_process_waits_while_the_login_is_refused(
    cluster: EmbeddedPostgres, start: Callable[[tuple[list[str], str]], Command], tmp_path: Path
) -> None:
    """Under --processes 2, the login refused (a password rotated), then one worker process killed:
    its replacement waits for the login, as the running one does (start.database_unavailable, the
    server's words), and starts once the passfile has the new password. It exited 5, and the
    supervisor stopped every worker process for good, exit 5."""
    running = start(COMMANDS["worker --processes 2"])
    refuse_login(cluster, ROLE, "rotated")
    killed = sorted(worker_processes(running.process.pid))
    assert len(killed) >= 2, killed
    os.kill(killed[0], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while "password authentication failed" not in running.said().split("supervisor.restarting", 1)[-1]:
        assert running.process.poll() is None, running.said()
        assert time.monotonic() < deadline, running.said()
        time.sleep(0.2)
    time.sleep(3.0)  # a replacement that exits, exits at once: the supervisor would be gone now
    assert running.process.poll() is None, running.said()
    write_passfile(tmp_path / "pgpass", ROLE, "rotated")
    deadline = time.monotonic() + 60
    while running.said().count("worker.started") < 3:
        assert running.process.poll() is None, running.said()
        assert time.monotonic() < deadline, f"the replacement never started:\n{running.said()[-3000:]}"
        time.sleep(0.2)
    assert running.stop()[0] == 0, running.said()
