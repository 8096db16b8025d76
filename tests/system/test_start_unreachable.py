"""The long-running commands (worker, serve, bridge out|in, scheduler) started while the database is
out of reach, as in a restart or a failover: each waits (start.database_unavailable at WARNING each
try), starts once the database answers and does its work, and exits 0 on SIGTERM or SIGINT
meanwhile. They used to exit 5 at once. A role's connection limit reached for now is waited out
too. A refusal that stays (a database that does not exist) still exits 5 at once, and
--wait-for-database bounds the wait. A stop signal at any moment of a start is a clean stop.

The database is out of reach through a link to its server's socket that the test cuts and
restores (tests.support.postgres.socket_link): connecting fails as while a server is down.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgbroker import Broker, Message
from pgbroker._db.install import install
from pgbroker.embedded import EmbeddedPostgres
from tests.support.postgres import scratch_dir
from tests.support.servers import PrivateServer, free_port
from tests.support.tables import Conn, a_rows, q_rows

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=2"
HERE = "tests.system.test_start_unreachable"
NOWHERE = "redis://127.0.0.1:1?stream=s"  # never reached: these commands stop before the broker

# What each long-running command needs besides the database; the queue "jobs" exists.
COMMANDS = {
    "worker": ["worker", f"{HERE}:consume", "--queue", "jobs"],
    "worker --processes 2": ["worker", f"{HERE}:consume", "--queue", "jobs", "--processes", "2"],
    "serve": ["serve", "--port", "0"],
    "bridge out": ["bridge", "out", "--queue", "jobs", "--to", NOWHERE],
    "bridge in": ["bridge", "in", "--from", NOWHERE, "--queue", "jobs"],
    "scheduler": ["scheduler"],
}

Link = tuple[str, Callable[[], None], Callable[[], None]]


def consume(message: Message) -> None:
    """The workers' handler: the message is archived once it returns."""


class Command:
    """`pgbroker --dsn DSN ARGS...` in the background, its stderr in a file (a pipe could fill)."""

    def __init__(self, dsn: str, args: list[str], logs: Path, python: tuple[str, ...] = ()) -> None:
        self.log = logs / f"command-{time.monotonic_ns()}.err"
        # Its processes, and theirs, carry this in their environment.
        self.mark = uuid.uuid4().hex
        with self.log.open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, *python, "-m", "pgbroker.cli", "--dsn", dsn, *args],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**os.environ, "DATABASE_URL": UNREACHABLE, "PGBROKER_TEST_COMMAND": self.mark},
            )

    def processes(self) -> list[int]:
        """The pids of the processes that carry its mark (itself, its children, theirs)."""
        found = []
        for environ in Path("/proc").glob("[0-9]*/environ"):
            try:
                if f"PGBROKER_TEST_COMMAND={self.mark}".encode() in environ.read_bytes().split(b"\0"):
                    found.append(int(environ.parent.name))
            except (OSError, ValueError):
                continue
        return found

    def said(self) -> str:
        return self.log.read_text()

    def waiting(self) -> bool:
        """Whether it said it waits for the database; it must not have exited."""
        if self.process.poll() is not None:
            raise AssertionError(f"exited {self.process.returncode} while it should wait:\n{self.said()}")
        return "start.database_unavailable error=" in self.said() and "retry_in=" in self.said()

    def started(self) -> bool:
        assert self.process.poll() is None, f"exited {self.process.returncode}:\n{self.said()}"
        return "started" in self.said()

    def stop(self, signum: int = signal.SIGTERM) -> int:
        self.process.send_signal(signum)
        return self.process.wait(timeout=60)


Run = Callable[..., Command]


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    started: list[Command] = []

    def start(dsn: str, args: list[str], python: tuple[str, ...] = ()) -> Command:
        started.append(Command(dsn, args, tmp_path, python))
        return started[-1]

    yield start
    for command in started:
        if command.process.poll() is None:
            command.process.kill()
            command.process.wait()


@pytest.fixture
def jobs(dsn: str) -> None:
    with Broker(dsn) as broker:
        broker.create_queue("jobs")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout} s")
        time.sleep(0.1)


def started_while_away(run: Callable[[str, list[str]], Command], link: Link, args: list[str]) -> Command:
    """The command started with the database out of reach, seen waiting, then the database back."""
    linked, cut, restore = link
    cut()
    command = run(linked, args)
    wait_for(command.waiting, "the command waiting for the database")
    restore()
    return command


def test_a_worker_started_while_the_database_is_away_consumes_once_it_is_back(
    dsn: str, conn: Conn, jobs: None, socket_link: Link, run: Callable[[str, list[str]], Command]
) -> None:
    worker = started_while_away(run, socket_link, COMMANDS["worker"])
    with Broker(dsn) as broker:
        broker.queue("jobs").send({"n": 1})
    wait_for(lambda: len(a_rows(conn, "jobs")) == 1, "the message consumed")
    assert q_rows(conn, "jobs") == []
    assert worker.stop() == 0, worker.said()


def test_serve_started_while_the_database_is_away_answers_once_it_is_back(
    socket_link: Link, run: Callable[[str, list[str]], Command]
) -> None:
    port = free_port()
    server = started_while_away(run, socket_link, ["serve", "--port", str(port)])

    def answers() -> bool:
        assert server.process.poll() is None, server.said()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(answers, "an answer to GET /healthz")
    assert server.stop() == 0, server.said()


def test_bridges_started_while_the_database_is_away_move_messages_once_it_is_back(
    dsn: str,
    conn: Conn,
    socket_link: Link,
    redis_server: PrivateServer,
    run: Callable[[str, list[str]], Command],
) -> None:
    """outbox -> bridge out -> a Redis stream -> bridge in -> inbox, both bridges started while away."""
    with Broker(dsn) as broker:
        broker.create_queue("outbox")
        broker.create_queue("inbox")
    url = f"redis://127.0.0.1:{redis_server.port}?stream=relay"
    linked, cut, restore = socket_link
    cut()
    bridges = [
        run(linked, ["-v", "bridge", "out", "--queue", "outbox", "--to", url]),
        run(linked, ["-v", "bridge", "in", "--from", url, "--queue", "inbox", "--declare"]),
    ]
    wait_for(lambda: all(bridge.waiting() for bridge in bridges), "both bridges waiting for the database")
    restore()
    # (bridge in reads the entries added after it has started: none is sent before)
    try:
        wait_for(lambda: all(bridge.started() for bridge in bridges), "both bridges started")
        with Broker(dsn) as broker:
            broker.queue("outbox").send({"n": 1})
        wait_for(lambda: [row[3] for row in q_rows(conn, "inbox")] == [{"n": 1}], "the message bridged")
    except TimeoutError:
        raise AssertionError("\n".join(bridge.said() for bridge in bridges)) from None
    for bridge in bridges:
        assert bridge.stop() == 0, bridge.said()


@pytest.mark.slow
def test_a_scheduler_started_while_the_database_is_away_ticks_once_it_is_back(
    dsn: str, conn: Conn, jobs: None, socket_link: Link, run: Callable[[str, list[str]], Command]
) -> None:
    with Broker(dsn) as broker:
        broker.add_schedule("every-minute", queue="jobs", cron="* * * * *", message={"tick": True})
    scheduler = started_while_away(run, socket_link, ["scheduler"])
    wait_for(lambda: len(q_rows(conn, "jobs")) >= 1, "a tick sent", timeout=120)  # the next minute
    assert scheduler.stop() == 0, scheduler.said()


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_while_waiting_for_the_database_exits_0(
    name: str, signum: int, jobs: None, socket_link: Link, run: Callable[[str, list[str]], Command]
) -> None:
    linked, cut, _ = socket_link
    cut()
    command = run(linked, COMMANDS[name])
    wait_for(command.waiting, "the command waiting for the database")
    assert command.stop(signum) == 0, command.said()


@pytest.mark.parametrize("name", COMMANDS)
def test_a_database_that_does_not_exist_still_fails_at_once(dsn: str, name: str) -> None:
    missing = make_conninfo(dsn, dbname="pgbroker_no_such_database")
    done = subprocess.run(
        [sys.executable, "-m", "pgbroker.cli", "--dsn", missing, *COMMANDS[name]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "DATABASE_URL": UNREACHABLE},
        timeout=60,
        check=False,
    )
    assert done.returncode == 5, done.stderr
    assert 'database "pgbroker_no_such_database" does not exist' in done.stderr
    assert "start.database_unavailable" not in done.stderr


def test_wait_for_database_bounds_the_wait(
    jobs: None, socket_link: Link, run: Callable[[str, list[str]], Command]
) -> None:
    linked, cut, _ = socket_link
    cut()
    began = time.monotonic()
    command = run(linked, [*COMMANDS["worker"], "--wait-for-database", "2s"])
    assert command.process.wait(timeout=60) == 5, command.said()
    assert time.monotonic() - began >= 2
    assert "start.database_unavailable error=" in command.said()
    assert "pgbroker: error: cannot connect to the database" in command.said()
    instantly = run(linked, [*COMMANDS["serve"], "--wait-for-database", "0"])
    assert instantly.process.wait(timeout=60) == 5, instantly.said()
    assert "start.database_unavailable" not in instantly.said()


@pytest.fixture
def german_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """DSN of a private cluster, pgbroker installed, whose server speaks German (lc_messages):
    its refusals are in words that no English pattern matches. The locale is compiled into a
    directory of the test's (localedef, LOCPATH): the machine's locales are left alone."""
    localedef = shutil.which("localedef")
    catalogs = list(Path("/usr/share/locale/de/LC_MESSAGES").glob("postgres-*.mo"))
    if localedef is None or not Path("/usr/share/i18n/locales/de_DE").is_file() or not catalogs:
        pytest.skip("a German server needs localedef, glibc's de_DE source and PostgreSQL's German catalog")
    locales = scratch_dir("pgbroker-locales-")
    directory = scratch_dir("pgbroker-german-")
    pg = EmbeddedPostgres(directory / "pg")
    try:
        subprocess.run([localedef, "-i", "de_DE", "-f", "UTF-8", str(locales / "de_DE.UTF-8")], check=False)
        monkeypatch.setenv("LOCPATH", str(locales))  # the server's environment is the test's
        dsn = pg.start()
        with psycopg.connect(dsn, autocommit=True) as conn:
            install(conn)
            conn.execute("ALTER SYSTEM SET lc_messages = 'de_DE.UTF-8'")
            conn.execute("SELECT pg_reload_conf()")
        with pytest.raises(psycopg.OperationalError, match="existiert nicht"):
            psycopg.connect(make_conninfo(dsn, dbname="keine"))
        yield dsn
    finally:
        pg.stop()
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(locales, ignore_errors=True)


@pytest.mark.parametrize("language", ["English", "German"])
def test_a_connection_limit_reached_at_the_start_is_waited_out(
    language: str, request: pytest.FixtureRequest, run: Callable[[str, list[str]], Command]
) -> None:
    """Another transient refusal, from a live server: the role's connection limit is reached
    (`too many connections for role`, 53300) by other sessions; the scheduler waits until they
    end. Told by its SQLSTATE: a German server's `zu viele Verbindungen von Rolle` made it exit 5
    at once, unknown words."""
    dsn: str = request.getfixturevalue("dsn" if language == "English" else "german_server")
    role = f"limited_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 5").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT postgres TO {}").format(sql.Identifier(role)))  # pgbroker's rights
    as_role = make_conninfo(dsn, user=role)
    holders = [psycopg.connect(as_role) for _ in range(5)]
    try:
        scheduler = run(as_role, ["scheduler", "-v"])
        wait_for(scheduler.waiting, "the scheduler waiting for a free connection")
        limit = "too many connections for role" if language == "English" else "zu viele Verbindungen"
        assert limit in scheduler.said()
    finally:
        for holder in holders:
            holder.close()
    # Its loop's own line, not the command's announcement: the stop signals are handled from
    # then on (a SIGTERM between the two found the default action: exit -15).
    wait_for(lambda: "scheduler.started" in scheduler.said(), "the scheduler's loop started")
    assert scheduler.stop() == 0, scheduler.said()


def test_a_refusal_that_stays_fails_at_once_whatever_its_words(
    dsn: str, german_server: str, run: Callable[[str, list[str]], Command]
) -> None:
    """A database that does not exist (3D000) exits 5 at once, in any language, and even when its
    name holds words of a passing refusal: matched on the message, 'too many clients' waited."""
    for missing in (
        make_conninfo(german_server, dbname="pgbroker_no_such_database"),
        make_conninfo(dsn, dbname="too many clients"),
    ):
        command = run(missing, COMMANDS["worker"])
        assert command.process.wait(timeout=60) == 5, command.said()
        assert "does not exist" in command.said() or "existiert nicht" in command.said()
        assert "start.database_unavailable" not in command.said()


def stop_signal_while_starting(
    dsn: str, conn: Conn, run: Callable[[str, list[str]], Command], args: list[str], at_start_line: bool
) -> Command:
    """The command started, and SIGTERM sent at once when its first session shows on the server
    (its start has begun: it connected, and goes on to set up and announce), or when its start
    line is out (``at_start_line``)."""
    name = f"pgbroker-stop-{uuid.uuid4().hex[:12]}"
    command = run(make_conninfo(dsn, application_name=name), args)

    def connected() -> bool:
        assert command.process.poll() is None, f"exited {command.process.returncode}:\n{command.said()}"
        found = conn.execute("SELECT 1 FROM pg_stat_activity WHERE application_name = %s", [name])
        return found.fetchone() is not None

    def announced() -> bool:
        assert command.process.poll() is None, f"exited {command.process.returncode}:\n{command.said()}"
        lines = command.said().splitlines()
        return any(line.startswith("pgbroker: ") and " started" in line for line in lines)

    wait_for(announced if at_start_line else connected, "the command starting")
    command.process.send_signal(signal.SIGTERM)
    return command


# Each command but the bridges (below), stopped once connected, and at its start line when that
# comes before its loop handles the signals (serve and the bridges print theirs after).
STOPPED_WHILE_STARTING = [
    pytest.param(name, at_start_line, id=f"{name}-{'start-line' if at_start_line else 'connected'}")
    for name in COMMANDS
    if not name.startswith("bridge")
    for at_start_line in ([False] if name == "serve" else [False, True])
]


@pytest.mark.parametrize(("name", "at_start_line"), STOPPED_WHILE_STARTING)
def test_a_stop_signal_at_any_moment_of_the_start_exits_0(
    dsn: str,
    conn: Conn,
    jobs: None,
    name: str,
    at_start_line: bool,
    run: Callable[[str, list[str]], Command],
) -> None:
    """SIGTERM between the command's first connection (or its start line) and its loop's own
    handlers met the default action: exit -15 (1 of 2,340 in a full run on 6581f9c). Three in a row."""
    for _ in range(3):
        command = stop_signal_while_starting(dsn, conn, run, COMMANDS[name], at_start_line)
        assert command.process.wait(timeout=60) == 0, command.said()


@pytest.mark.parametrize("direction", ["out", "in"])
def test_a_stop_signal_at_any_moment_of_a_bridge_start_exits_0(
    dsn: str,
    conn: Conn,
    jobs: None,
    direction: str,
    redis_server: PrivateServer,
    run: Callable[[str, list[str]], Command],
) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}?stream=stop-{uuid.uuid4().hex[:8]}"
    args = {
        "out": ["bridge", "out", "--queue", "jobs", "--to", url],
        "in": ["bridge", "in", "--from", url, "--queue", "jobs", "--declare"],
    }[direction]
    for _ in range(3):
        command = stop_signal_while_starting(dsn, conn, run, args, at_start_line=False)
        assert command.process.wait(timeout=60) == 0, command.said()


# A module the command imports in the first half of its start: its line of `python -X importtime`
# (written once it is imported) says the start is under way, and far from over.
MID_START = re.compile(r"^import time: .*\| +psycopg$", re.MULTILINE)


@pytest.mark.parametrize("name", ["worker --processes 2", "scheduler"])
def test_a_stop_signal_while_the_command_still_imports_exits_0(
    dsn: str, jobs: None, name: str, run: Run
) -> None:
    """SIGTERM while the command imports what it needs: the entry blocked it from its first line
    (pgbroker.cli.entry), and the command stops cleanly once it holds its stop signals, leaving
    no process behind. It met the default action (exit -15, 143 from a shell: 1 of 3 supervisors
    under load), since the command held the signals only once it had parsed its arguments."""
    for _ in range(3):
        command = run(dsn, COMMANDS[name], ("-X", "importtime"))
        deadline = time.monotonic() + 60
        while not MID_START.search(command.said()):
            assert command.process.poll() is None, f"exited {command.process.returncode}:\n{command.said()}"
            assert time.monotonic() < deadline, "psycopg never imported"
            time.sleep(0.005)
        command.process.send_signal(signal.SIGTERM)
        assert command.process.wait(timeout=60) == 0, command.said()[-3000:]
        wait_for(partial(gone, command), "its processes gone", timeout=30)


def gone(command: Command) -> bool:
    return not command.processes()
