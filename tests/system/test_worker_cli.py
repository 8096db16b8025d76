"""`pgbroker worker`, `dlq`, `policy` and `maintain` as a shell sees them: real processes, signals,
output and exit codes; and the demo's worker stage.

The worker processes import their handlers from this module (``tests.system.test_worker_cli:...``)
and find the database in $WORKER_TEST_DSN.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgbroker import Broker, Message, Queue, Stream
from pgbroker._event_loop import LOOP_ENV
from pgbroker.demo.stage import Demo
from pgbroker.demo.workers import workers_stage
from tests.support.postgres import server_socket
from tests.support.processes import worker_processes
from tests.support.roles import role_logins
from tests.support.tables import Conn, a_rows, q_rows

ROOT = Path(__file__).resolve().parents[2]
UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=2"
HERE = "tests.system.test_worker_cli"


# -- handlers, run inside the worker processes ----------------------------------------------------


def record(message: Message) -> None:
    """Note the delivery (msg_id, delivery, pid) in table ``handled``, then sleep as the message asks."""
    with psycopg.connect(os.environ["WORKER_TEST_DSN"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO handled (msg_id, read_ct, pid) VALUES (%s, %s, %s)",
            [message.msg_id, message.read_ct, os.getpid()],
        )
    time.sleep(message.message.get("sleep", 0) if isinstance(message.message, dict) else 0)


def out_of_stock(message: Message) -> None:
    raise ValueError(f"no stock for {message.message}")


# -- running the command --------------------------------------------------------------------------


def _env(dsn: str, handler_dsn: str | None = None) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": UNREACHABLE, "WORKER_TEST_DSN": handler_dsn or dsn}


def cli(dsn: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgbroker.cli", "--dsn", dsn, *args],
        capture_output=True,
        text=True,
        env=_env(dsn),
        cwd=cwd,
        timeout=120,
        check=False,
    )


def ok(dsn: str, *args: str) -> str:
    res = cli(dsn, *args)
    assert res.returncode == 0, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    return res.stdout


def assert_error(res: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert res.returncode == code, f"exit {res.returncode}\nstdout: {res.stdout}\nstderr: {res.stderr}"
    assert res.stderr.startswith("pgbroker: error: "), res.stderr
    assert "Traceback" not in res.stderr
    for fragment in fragments:
        assert fragment in res.stderr


class WorkerProcess:
    """`pgbroker worker ...` running in the background; its handlers reach ``handler_dsn`` (by
    default the worker's DSN)."""

    def __init__(self, dsn: str, *args: str, verbose: bool = True, handler_dsn: str | None = None) -> None:
        verbosity = ["-v"] if verbose else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pgbroker.cli", "--dsn", dsn, *verbosity, "worker", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(dsn, handler_dsn),
            cwd=ROOT,
        )

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        _, stderr = self.process.communicate(timeout=timeout)
        return self.process.returncode, stderr

    def children(self) -> set[int]:
        """The pids of its worker processes."""
        return worker_processes(self.process.pid)

    def kill(self) -> None:
        if self.process.poll() is None:
            for child in self.children():
                os.kill(child, signal.SIGKILL)
            self.process.kill()
            self.process.communicate()


@pytest.fixture
def workers() -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(dsn: str, *args: str, verbose: bool = True, handler_dsn: str | None = None) -> WorkerProcess:
        started.append(WorkerProcess(dsn, *args, verbose=verbose, handler_dsn=handler_dsn))
        return started[-1]

    yield start
    for process in started:
        process.kill()


@pytest.fixture
def broker(dsn: str) -> Iterator[Broker]:
    with Broker(dsn, max_connections=2) as b:
        yield b


@pytest.fixture
def jobs(broker: Broker, conn: Conn) -> Queue:
    conn.execute(
        "CREATE TABLE handled (msg_id bigint, read_ct int, pid int, at timestamptz DEFAULT clock_timestamp())"
    )
    return broker.create_queue("jobs")


def wait_for(condition: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.05)


def handled(conn: Conn) -> list[tuple[int, int, int]]:
    return [(r[0], r[1], r[2]) for r in conn.execute("SELECT msg_id, read_ct, pid FROM handled ORDER BY at")]


# -- worker ---------------------------------------------------------------------------------------


def test_a_worker_consumes_the_queue_and_exits_0_on_sigterm(
    dsn: str, conn: Conn, jobs: Queue, workers: Callable[..., WorkerProcess]
) -> None:
    sent = jobs.send_many([{"n": n} for n in range(30)])
    worker = workers(dsn, f"{HERE}:record", "--queue", "jobs", "--concurrency", "4", "--progress", "0.2")
    wait_for(lambda: len(a_rows(conn, "jobs")) == 30, what="30 messages archived")
    # 30 messages can be done before the first progress tick: let two ticks pass.
    time.sleep(0.5)
    worker.signal(signal.SIGTERM)
    code, stderr = worker.finish()
    assert code == 0, stderr
    # Printed, not logged at INFO: shown without -v too.
    assert "pgbroker: worker started: 1 process consuming jobs (concurrency 4) from " in stderr
    assert "worker.started queue=jobs concurrency=4" in stderr
    assert "progress queue=jobs completed=" in stderr
    assert "worker.stopped queue=jobs completed=30 retried=0 dead_lettered=0 stale=0 released=0" in stderr
    assert sorted(r[0] for r in handled(conn)) == sent


def test_a_worker_runs_as_a_login_of_the_consumer_role(
    dsn: str, conn: Conn, jobs: Queue, workers: Callable[..., WorkerProcess], pg_admin_dsn: str
) -> None:
    # The role docs/security.md gives a worker. Its check before the start-up line listed every
    # queue (pgmq.list_queues, the monitor's): it failed with "permission denied for function
    # list_queues" and a hint to GRANT pgbroker_consumer, which the login had (exit 5).
    sent = jobs.send_many([{"n": n} for n in range(3)])
    with role_logins(dsn, conn, pg_admin_dsn) as logins:
        worker = workers(logins["consumer"], f"{HERE}:record", "--queue", "jobs", handler_dsn=dsn)
        wait_for(
            lambda: len(a_rows(conn, "jobs")) == 3 or worker.process.poll() is not None,
            what="3 messages archived, or the worker's exit",
        )
        worker.signal(signal.SIGTERM)
        code, stderr = worker.finish()
    assert code == 0, stderr
    assert "pgbroker: worker started: 1 process consuming jobs" in stderr
    assert sorted(r[0] for r in handled(conn)) == sent


def test_a_worker_runs_on_uvloop_unless_told_otherwise(
    dsn: str, conn: Conn, jobs: Queue, workers: Callable[..., WorkerProcess]
) -> None:
    jobs.send_many([{"n": n} for n in range(4)])
    loops = {}
    for choice in (None, "asyncio"):
        worker = workers(dsn, f"{HERE}:record", "--queue", "jobs", *(["--loop", choice] if choice else []))
        wait_for(lambda: bool(handled(conn)), what="a message handled")
        worker.signal(signal.SIGTERM)
        code, stderr = worker.finish()
        assert code == 0, stderr
        started = [line for line in stderr.splitlines() if "worker.started" in line]
        loops[choice] = [line.rsplit("loop=", 1)[1] for line in started]
        conn.execute("DELETE FROM handled")
        jobs.send({"n": 4})
    assert loops == {None: ["uvloop"], "asyncio": ["asyncio"]}
    for command in (["worker", f"{HERE}:record", "--queue", "jobs"], ["scheduler"]):
        wrong = cli(dsn, *command, "--loop", "trio")
        assert wrong.returncode == 2
        assert "argument --loop: invalid choice: 'trio'" in wrong.stderr
    os.environ[LOOP_ENV] = "tokio"
    try:
        assert_error(
            cli(dsn, "worker", f"{HERE}:record", "--queue", "jobs"),
            2,
            f"${LOOP_ENV} must be one of auto, asyncio, uvloop, got 'tokio'",
        )
    finally:
        del os.environ[LOOP_ENV]


def test_sigterm_lets_a_slow_handler_finish_and_ack(
    dsn: str, conn: Conn, jobs: Queue, workers: Callable[..., WorkerProcess]
) -> None:
    jobs.send({"sleep": 1.5})
    worker = workers(dsn, f"{HERE}:record", "--queue", "jobs")
    wait_for(lambda: bool(handled(conn)), what="the handler to start")
    worker.signal(signal.SIGTERM)
    code, stderr = worker.finish()
    assert code == 0, stderr
    assert "worker.draining queue=jobs in_flight=1" in stderr
    assert [r[1] for r in a_rows(conn, "jobs")] == [1]


def test_sigint_twice_gives_back_what_is_in_flight_at_once(
    dsn: str, conn: Conn, jobs: Queue, workers: Callable[..., WorkerProcess]
) -> None:
    sent = jobs.send({"sleep": 60})
    worker = workers(dsn, f"{HERE}:record", "--queue", "jobs", "--vt", "300")
    wait_for(lambda: bool(handled(conn)), what="the handler to start")
    started = time.monotonic()
    worker.signal(signal.SIGINT)
    time.sleep(0.3)
    worker.signal(signal.SIGINT)
    code, stderr = worker.finish()
    assert code == 0, stderr
    assert time.monotonic() - started < 10
    assert "worker.released queue=jobs messages=1" in stderr
    [(msg_id, read_ct, _, _, _)] = q_rows(conn, "jobs")
    assert (msg_id, read_ct) == (sent, 1)
    assert jobs.read() is not None  # visible again now, not in 300 s


def test_a_stop_that_waits_for_a_running_handler_says_so_at_once_without_v(
    dsn: str, conn: Conn, jobs: Queue, workers: Callable[..., WorkerProcess]
) -> None:
    """Ctrl-C with a handler running: the worker waits up to its grace period (30 s), and says so
    at once, by default, with how to stop now; it said nothing until the grace period ended."""
    jobs.send({"sleep": 60})
    worker = workers(dsn, f"{HERE}:record", "--queue", "jobs", "--vt", "300", verbose=False)
    assert worker.process.stderr is not None
    assert "worker started" in worker.process.stderr.readline()
    wait_for(lambda: bool(handled(conn)), what="the handler to start")
    started = time.monotonic()
    worker.signal(signal.SIGINT)
    said = worker.process.stderr.readline()
    assert time.monotonic() - started < 10, said
    assert said.startswith("pgbroker: worker.stopping in_flight=1 grace_period=30.0 "), said
    assert "Ctrl-C again" in said
    worker.signal(signal.SIGINT)
    code, stderr = worker.finish()
    assert code == 0, stderr
    assert "worker.released queue=jobs messages=1" in stderr


def test_the_supervisor_restarts_a_killed_worker_process_and_stops_them_all(
    dsn: str, conn: Conn, jobs: Queue, workers: Callable[..., WorkerProcess]
) -> None:
    jobs.send_many([{"sleep": 0.05} for _ in range(100)])
    supervisor = workers(dsn, f"{HERE}:record", "--queue", "jobs", "--processes", "2", "--vt", "2")
    wait_for(lambda: len(supervisor.children()) == 2, what="two worker processes")
    wait_for(lambda: len({r[2] for r in handled(conn)}) == 2, what="both worker processes handling")
    first = supervisor.children()
    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(supervisor.children() - first) == 1, what="a new worker process")
    wait_for(lambda: q_rows(conn, "jobs") == [], timeout=60, what="the queue to drain")
    supervisor.signal(signal.SIGTERM)
    code, stderr = supervisor.finish()
    assert code == 0, stderr
    assert f"supervisor.restarting pid={victim} signal=9" in stderr
    assert supervisor.children() == set()
    assert len(a_rows(conn, "jobs")) == 100


def test_a_worker_process_restarted_while_the_database_is_out_of_reach_waits_for_it(
    dsn: str,
    conn: Conn,
    jobs: Queue,
    workers: Callable[..., WorkerProcess],
    socket_link: tuple[str, Callable[[], None], Callable[[], None]],
) -> None:
    """A worker process the supervisor starts again (one was killed) while the database is away
    (restarting, failing over) waits for it, as the running ones do: the supervisor used to stop
    every worker process and exit 5 then, for good."""
    linked, cut, restore = socket_link
    jobs.send_many([{"sleep": 0.05} for _ in range(100)])
    supervisor = workers(
        linked, f"{HERE}:record", "--queue", "jobs", "--processes", "2", "--vt", "2", handler_dsn=dsn
    )
    wait_for(lambda: len({r[2] for r in handled(conn)}) == 2, what="both worker processes handling")
    said: list[str] = []
    stderr = supervisor.process.stderr
    assert stderr is not None
    reader = threading.Thread(target=lambda: said.extend(iter(stderr.readline, "")))
    reader.start()
    first = supervisor.children()
    cut()
    os.kill(min(first), signal.SIGKILL)

    def replacement_waits() -> bool:  # (the running worker's own line names its queue, not a pause)
        return any("start.database_unavailable error=" in line and "retry_in=" in line for line in said)

    wait_for(
        lambda: replacement_waits() or supervisor.process.poll() is not None, timeout=60, what="a replacement"
    )
    assert supervisor.process.poll() is None, "".join(said)
    restore()
    jobs.send_many([{"sleep": 0.05} for _ in range(100)])
    replacement = supervisor.children() - first
    wait_for(lambda: replacement <= {r[2] for r in handled(conn)}, timeout=60, what="the replacement working")
    wait_for(lambda: q_rows(conn, "jobs") == [], timeout=60, what="the queue to drain")
    supervisor.signal(signal.SIGTERM)
    code, _ = supervisor.finish()
    reader.join(30)
    assert code == 0, "".join(said)
    assert len(a_rows(conn, "jobs")) == 200


@pytest.fixture
def two_hosts(dsn: str) -> Iterator[tuple[str, Callable[[], None]]]:
    """A multi-host DSN (two socket directories, the first answering) on the test's server, and
    a failover: the first host goes, the second answers. The sockets are links to the server's."""
    target = server_socket(dsn)
    scratch = Path(tempfile.mkdtemp(prefix="pgb-hosts-"))  # short: a socket path has a size limit
    first, second = scratch / "first", scratch / "second"
    first.mkdir()
    second.mkdir()
    (first / target.name).symlink_to(target)

    def fail_over() -> None:
        (first / target.name).unlink()
        (second / target.name).symlink_to(target)

    try:
        yield make_conninfo(dsn, host=f"{first},{second}"), fail_over
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_a_worker_on_a_multi_host_dsn_follows_a_failover(
    dsn: str,
    conn: Conn,
    jobs: Queue,
    workers: Callable[..., WorkerProcess],
    two_hosts: tuple[str, Callable[[], None]],
) -> None:
    multi_host, fail_over = two_hosts
    before = jobs.send_many([{"n": n} for n in range(5)])
    worker = workers(multi_host, f"{HERE}:record", "--queue", "jobs")
    wait_for(lambda: len(handled(conn)) == 5, what="5 messages handled before the failover")
    fail_over()
    conn.execute(  # every other session ends, as with a crashed primary
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
        [conn.info.dbname, conn.info.backend_pid],
    )
    after = jobs.send_many([{"n": n} for n in range(5, 25)])
    wait_for(lambda: len(handled(conn)) == 25, timeout=90, what="25 messages handled after the failover")
    assert sorted(r[0] for r in handled(conn)) == before + after
    worker.signal(signal.SIGTERM)
    code, stderr = worker.finish()
    assert code == 0, stderr


def test_log_format_json_writes_every_line_of_the_supervisor_and_its_processes_as_one_object(
    dsn: str, conn: Conn, jobs: Queue, workers: Callable[..., WorkerProcess]
) -> None:
    """A log pipeline takes JSON lines: the events with their fields as values (msg_id a number),
    the traceback of a failure in its own field, and the command's own start line too."""
    sent = jobs.send({"sku": 7})
    supervisor = workers(
        dsn,
        f"{HERE}:out_of_stock",
        "--queue",
        "jobs",
        "--processes",
        "2",
        "--max-deliveries",
        "1",
        "--log-format",
        "json",
    )
    wait_for(lambda: len(a_rows(conn, "jobs")) == 1, what="the dead letter in the archive")
    supervisor.signal(signal.SIGTERM)
    code, stderr = supervisor.finish()
    assert code == 0, stderr
    entries = [json.loads(line) for line in stderr.splitlines()]  # each line one object
    by_event = {entry.get("event"): entry for entry in entries}
    assert by_event["command.started"]["command"] == "worker"
    dead = by_event["worker.dead_lettered"]
    assert (dead["level"], dead["queue"], dead["msg_id"]) == ("warning", "jobs", sent)
    assert "ValueError: no stock for {'sku': 7}" in by_event["worker.handler_failed"]["exception"]
    assert {entry["logger"] for entry in entries} >= {"pgbroker", "pgbroker.worker"}


def test_a_log_format_the_environment_names_must_be_known(dsn: str) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "pgbroker.cli", "--dsn", dsn, "list"],
        capture_output=True,
        text=True,
        env={**_env(dsn), "PGBROKER_LOG_FORMAT": "yaml"},
        timeout=120,
        check=False,
    )
    assert_error(res, 2, "$PGBROKER_LOG_FORMAT must be one of text, json, got 'yaml'")


def test_worker_mistakes_exit_with_the_cli_codes(dsn: str, jobs: Queue) -> None:
    assert_error(cli(dsn, "worker", f"{HERE}:record"), 2, "say which queue it consumes", "--queue")
    assert_error(cli(dsn, "worker", "tests.system.nothing_here:handler", "--queue", "jobs"), 2, "cannot load")
    assert_error(cli(dsn, "worker", f"{HERE}:no_such_handler", "--queue", "jobs"), 2, "cannot load")
    assert_error(cli(dsn, "worker", f"{HERE}:ROOT", "--queue", "jobs"), 2, "neither a pgbroker.App")
    # pgmq's own words ('Queue "nope" does not exist. Create it first ...'), pgmq's SQLSTATE, and
    # a hint that names the command as well as the SQL.
    assert_error(
        cli(dsn, "worker", f"{HERE}:record", "--queue", "nope"),
        4,
        '"nope" does not exist',
        "hint: Create it first: SELECT pgmq.create('nope'); or: pgbroker create nope",
    )


def test_an_app_without_handlers_is_a_usage_error_before_any_start_up_line(
    dsn: str, jobs: Queue, tmp_path: Path
) -> None:
    # It printed "worker started: ... consuming  from ..." (nothing named), then
    # "no workers to run" with a hint for the Python API ("pass a Worker").
    (tmp_path / "shop_jobs.py").write_text("from pgbroker import App\napp = App()\n")
    res = cli(dsn, "worker", "shop_jobs:app", cwd=tmp_path)
    assert_error(res, 2, "shop_jobs:app has no handlers", '@app.handler("QUEUE")')
    assert "worker started" not in res.stderr


def test_a_stream_handler_s_missing_stream_or_group_is_said_before_any_start_up_line(
    dsn: str, broker: Broker, tmp_path: Path
) -> None:
    # As for a missing queue: it printed "worker started: ... consuming clicks/billing ...", then
    # the error.
    (tmp_path / "shop_streams.py").write_text(
        "from pgbroker import App\napp = App()\n"
        "@app.stream_handler('clicks', 'billing')\ndef handle(m): pass\n"
    )
    missing = [("stream", 'stream "clicks" does not exist'), ("group", 'no consumer group "billing"')]
    for what, said in missing:
        res = cli(dsn, "worker", "shop_streams:app", cwd=tmp_path)
        assert_error(res, 4, said)
        assert "worker started" not in res.stderr, what
        Stream(broker, "clicks").create(partitions=1)


@pytest.mark.parametrize(
    ("source", "error", "line"),
    [
        ("def handle(:\n    pass\n", "SyntaxError: invalid syntax", "def handle(:"),
        ('SETTINGS = {}\nTOKEN = SETTINGS["token"]\n', "KeyError: 'token'", 'TOKEN = SETTINGS["token"]'),
        (
            "from pgbroker import App\napp = App()\n"
            "@app.handler('jobs', concurency=4)\ndef handle(m): pass\n",
            "TypeError: Worker.__init__() got an unexpected keyword argument 'concurency'",
            "@app.handler('jobs', concurency=4)",
        ),
    ],
    ids=["syntax", "import-time", "misspelt-option"],
)
def test_a_mistake_in_the_user_s_module_is_theirs_with_their_frame(
    dsn: str, jobs: Queue, tmp_path: Path, source: str, error: str, line: str
) -> None:
    # Not "a bug in pgbroker" (exit 70): a usage error that points into the user's file.
    (tmp_path / "shop_jobs.py").write_text(source)
    res = cli(dsn, "worker", "shop_jobs:app", "--queue", "jobs", cwd=tmp_path)
    assert_error(res, 2, f"cannot load shop_jobs:app: {error}", str(tmp_path / "shop_jobs.py"), line)
    assert "importlib" not in res.stderr


# -- dead letters, policies, maintenance ----------------------------------------------------------


def test_policy_set_creates_the_dead_letter_queue_it_names(dsn: str, jobs: Queue, broker: Broker) -> None:
    out = ok(dsn, "policy", "set", "jobs", "--dead-letter-queue", "jobs_dlq")
    assert 'created dead-letter queue "jobs_dlq"' in out
    assert "jobs_dlq" in {q.queue_name for q in broker.list_queues()}
    # --json: the record alone on stdout.
    (policy,) = json.loads(ok(dsn, "policy", "set", "jobs", "--max-deliveries", "4", "--json"))
    shown = (policy["queue_name"], policy["max_deliveries"], policy["dead_letter_queue"])
    assert shown == ("jobs", 4, "jobs_dlq")
    # A missing queue is reported, and no dead-letter queue made for it.
    assert_error(cli(dsn, "policy", "set", "nope", "--dead-letter-queue", "nope_dlq"), 4, '"nope"')
    assert "nope_dlq" not in {q.queue_name for q in broker.list_queues()}


def test_policy_set_and_show(dsn: str, jobs: Queue, broker: Broker) -> None:
    broker.create_queue("jobs_dlq")
    out = ok(
        dsn,
        "policy",
        "set",
        "jobs",
        "--max-deliveries",
        "5",
        "--backoff-base",
        "2s",
        "--backoff-max",
        "10m",
        "--no-jitter",
        "--dead-letter-queue",
        "jobs_dlq",
        "--max-depth",
        "1000",
        "--archive-retention",
        "7d",
    )
    assert 'policy of queue "jobs" changed' in out
    assert "exponential 2s..10m" in out
    policy = jobs.policy()
    assert (policy.max_deliveries, policy.backoff_base_seconds, policy.backoff_max_seconds) == (5, 2, 600)
    assert (policy.backoff_jitter, policy.dead_letter_queue, policy.max_depth) == (False, "jobs_dlq", 1000)
    assert policy.archive_retention_seconds == 7 * 86400
    table = ok(dsn, "policy", "show")
    assert table.splitlines()[0].split()[:3] == ["QUEUE", "MAX", "DELIVERIES"]
    assert "jobs_dlq" in table
    assert "7d" in table
    [shown] = json.loads(ok(dsn, "policy", "show", "jobs", "--json"))
    assert shown["max_depth"] == 1000
    ok(dsn, "policy", "set", "jobs", "--no-dead-letter-queue", "--max-depth", "0")
    assert (jobs.policy().dead_letter_queue, jobs.policy().max_depth) == (None, None)
    assert_error(cli(dsn, "policy", "set", "jobs"), 2, "nothing to change")
    assert_error(
        cli(dsn, "policy", "set", "jobs", "--backoff-base", "9", "--backoff-max", "3"), 2, "must be >="
    )
    assert_error(cli(dsn, "policy", "set", "nope", "--max-depth", "1"), 4, "does not exist")
    assert "msgpack" in ok(dsn, "policy", "set", "jobs", "--codec", "msgpack").splitlines()[-1]
    assert jobs.policy().codec == "msgpack"
    assert_error(cli(dsn, "policy", "set", "jobs", "--codec", "xml"), 2, "codec must be")
    assert cli(dsn, "policy", "set", "jobs", "--backoff-base", "soon").returncode == 2


def test_dlq_list_replay_and_purge(dsn: str, jobs: Queue, conn: Conn) -> None:
    jobs.set_policy(max_deliveries=1)
    jobs.send_many([{"n": 1}, {"n": 2}, {"n": 3}])
    for message in jobs.read_many(3):
        jobs.fail(message, error=f"no stock for {message.message['n']}")
    table = ok(dsn, "dlq", "list", "jobs")
    assert "no stock for 2" in table
    assert table.splitlines()[0].split() == ["MSG_ID", "DELIVERIES", "DEAD-LETTERED", "ERROR", "MESSAGE"]
    letters = [json.loads(line) for line in ok(dsn, "dlq", "list", "jobs", "--json").splitlines()]
    assert [letter["message"] for letter in letters] == [{"n": 1}, {"n": 2}, {"n": 3}]
    first, second, _ = (letter["msg_id"] for letter in letters)
    assert "replayed 1 dead letter" in ok(dsn, "dlq", "replay", "jobs", str(first))
    assert [r[3] for r in q_rows(conn, "jobs")] == [{"n": 1}]
    assert_error(cli(dsn, "dlq", "replay", "jobs", str(first)), 1, f"no dead letter {first}")
    assert_error(cli(dsn, "dlq", "purge", "jobs"), 2, "--yes")
    assert "purged 1 dead letter" in ok(dsn, "dlq", "purge", "jobs", str(second), "--yes")
    assert "replayed 1 dead letter" in ok(dsn, "dlq", "replay", "jobs")
    assert [r[3] for r in q_rows(conn, "jobs")] == [{"n": 1}, {"n": 3}]
    assert ok(dsn, "dlq", "list", "jobs").strip() == 'no dead letters from queue "jobs"'
    assert 'no dead letters from queue "jobs"; nothing to replay' in ok(dsn, "dlq", "replay", "jobs")
    assert_error(cli(dsn, "dlq", "list", "nope"), 4)


def test_dlq_show_and_replay_take_the_msg_id_the_worker_logged(dsn: str, jobs: Queue, broker: Broker) -> None:
    dlq = broker.create_queue("jobs_dlq")
    dlq.send_many(["the dead-letter queue's own"] * 4)  # its ids run ahead of the queue's
    jobs.set_policy(max_deliveries=2, backoff="fixed", backoff_base_seconds=0, dead_letter_queue="jobs_dlq")
    sent = jobs.send({"order": 7})
    for delivery in (1, 2):
        [message] = jobs.read_many(1)
        trace = f'File "shop.py", line {delivery}'
        jobs.fail(message, error=f"KeyError: 'sku' ({delivery})", traceback=trace)
    assert ok(dsn, "dlq", "list", "jobs").splitlines()[1].split()[0] == str(sent)
    shown = ok(dsn, "dlq", "show", "jobs", str(sent))
    assert f'dead letter {sent} of queue "jobs"' in shown
    for delivery in (1, 2):
        assert f"attempt {delivery} at " in shown
        assert f"KeyError: 'sku' ({delivery})" in shown
        assert f'    File "shop.py", line {delivery}' in shown
    [letter] = [json.loads(ok(dsn, "dlq", "show", "jobs", str(sent), "--json"))]
    assert letter["msg_id"] == sent
    assert len(letter["headers"]["x-pgbroker-attempts"]) == 2
    assert_error(cli(dsn, "dlq", "show", "jobs", str(sent + 100)), 1, f"no dead letter {sent + 100}")
    assert "replayed 1 dead letter" in ok(dsn, "dlq", "replay", "jobs", str(sent))
    assert [m.message for m in jobs.peek()] == [{"order": 7}]


def test_maintain_applies_archive_retention_in_batches(dsn: str, jobs: Queue, broker: Broker) -> None:
    assert "no queue has an archive retention" in ok(dsn, "maintain")
    for msg_id in jobs.send_many(list(range(5))):
        jobs.archive(msg_id)  # one by one: rows archived together share archived_at, and ties are kept
    jobs.set_policy(archive_max_rows=2)
    broker.create_queue("other").set_policy(archive_retention_seconds=3600)
    out = ok(dsn, "-v", "maintain", "--batch-size", "2")
    assert 'queue "jobs": deleted 3 archived messages' in out
    assert 'queue "other": deleted 0 archived messages' in out
    assert 'queue "jobs": deleted 0 archived messages' in ok(dsn, "maintain", "jobs")


# -- the demo -------------------------------------------------------------------------------------


def test_the_demo_worker_stage_dead_letters_the_poison_task(dsn: str) -> None:
    out = io.StringIO()
    with Broker(dsn) as broker:
        demo = Demo(broker, out)
        workers_stage(demo)
    text = out.getvalue()
    assert demo.ok, text
    assert "handled 1,999 + dead-lettered 1 + still queued 0 = 2,000: OK" in text
    assert '"deliveries": 3' in text
    assert "PoisonError" in text
