"""Concurrency and rate limits (56_limits.sql): max_in_flight, max_in_flight_per_key with header
x-pgbroker-concurrency-key, rate_limit_per_second; enforced by every read across consumers,
including three worker processes whose handlers check the per-key limit themselves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest

from pgbroker import Queue
from tests.support.tables import Conn, jsonb_array

CK = "x-pgbroker-concurrency-key"


def _send_keys(conn: Conn, queue: str, keys: Sequence[str | None]) -> None:
    conn.execute(
        "SELECT pgmq.send_batch(%s, %s::jsonb[], %s::jsonb[])",
        [
            queue,
            jsonb_array([{"n": i} for i in range(len(keys))]),
            jsonb_array([{CK: k} if k else {} for k in keys]),
        ],
    )


def _read_keys(conn: Conn, read: str) -> list[str | None]:
    return [(h or {}).get(CK) for (h,) in conn.execute(read).fetchall()]


def test_max_in_flight_caps_every_read_until_messages_are_acked(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('l')")
    conn.execute("SELECT pgbroker.set_policy('l', max_in_flight => 3)")
    _send_keys(conn, "l", [None] * 10)
    first = conn.execute("SELECT msg_id FROM pgmq.read('l', 30, 10)").fetchall()
    assert len(first) == 3
    assert conn.execute("SELECT * FROM pgbroker.read('l', 30, 10)").fetchall() == []
    conn.execute("SELECT pgmq.delete('l', %s::bigint)", [first[0][0]])
    assert len(conn.execute("SELECT * FROM pgbroker.read('l', 30, 10)").fetchall()) == 1
    # A lease that runs out frees its place.
    conn.execute("UPDATE pgmq.q_l SET vt = now() - interval '1 second' WHERE read_ct > 0")
    assert len(conn.execute("SELECT * FROM pgmq.read('l', 30, 10)").fetchall()) == 3


def test_at_most_n_in_flight_per_key_and_no_limit_without_a_key(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('l')")
    conn.execute("SELECT pgbroker.set_policy('l', max_in_flight_per_key => 2)")
    _send_keys(conn, "l", ["a", "a", "a", "b", None, "a", "b", "b", None, None])
    got = _read_keys(conn, "SELECT headers FROM pgmq.read('l', 30, 10)")
    assert Counter(got) == Counter({"a": 2, "b": 2, None: 3})
    assert _read_keys(conn, "SELECT headers FROM pgbroker.read('l', 30, 10)") == []
    # Acking one of a's lets exactly one more of a's go.
    a_id = conn.execute(
        "SELECT msg_id FROM pgmq.q_l WHERE read_ct > 0 AND headers->>%s = 'a' LIMIT 1", [CK]
    ).fetchone()
    assert a_id is not None
    conn.execute("SELECT pgmq.archive('l', %s::bigint)", [a_id[0]])
    assert _read_keys(conn, "SELECT headers FROM pgmq.read('l', 30, 10)") == ["a"]


def test_per_key_reads_keep_msg_id_order_within_the_room(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('l')")
    conn.execute("SELECT pgbroker.set_policy('l', max_in_flight_per_key => 1)")
    _send_keys(conn, "l", ["b", "a", "b", "a", "c"])
    got = conn.execute("SELECT msg_id, headers->>%s FROM pgmq.read('l', 30, 10)", [CK]).fetchall()
    assert got == [(1, "b"), (2, "a"), (5, "c")]


def test_rate_limit_hands_out_at_most_the_bucket(conn: Conn) -> None:
    conn.execute("SELECT pgmq.create('l')")
    conn.execute("SELECT pgbroker.set_policy('l', rate_limit_per_second => 0.5)")
    _send_keys(conn, "l", [None] * 5)
    assert len(conn.execute("SELECT * FROM pgmq.read('l', 30, 5)").fetchall()) == 1  # a bucket holds >= 1
    assert conn.execute("SELECT * FROM pgmq.read('l', 30, 5)").fetchall() == []
    assert conn.execute("SELECT * FROM pgmq.pop('l', 5)").fetchall() == []
    # Two seconds' worth at 0.5/s is one more.
    conn.execute("UPDATE pgbroker.rate_buckets SET refilled_at = refilled_at - interval '2 seconds'")
    assert len(conn.execute("SELECT * FROM pgmq.pop('l', 5)").fetchall()) == 1
    conn.execute("SELECT pgbroker.set_policy('l', rate_limit_per_second => 0)")
    assert len(conn.execute("SELECT * FROM pgmq.pop('l', 5)").fetchall()) == 3


def test_limits_off_give_the_plain_read_back(conn: Conn) -> None:
    index = "SELECT to_regclass('pgmq.q_l_ckey_idx') IS NOT NULL"
    conn.execute("SELECT pgmq.create('l')")
    conn.execute("SELECT pgbroker.set_policy('l', max_in_flight => 1, max_in_flight_per_key => 1)")
    assert conn.execute(index).fetchone() == (True,)
    conn.execute("SELECT pgbroker.set_policy('l', max_in_flight_per_key => 3)")
    assert conn.execute(index).fetchone() == (True,)
    conn.execute("SELECT pgbroker.set_policy('l', max_in_flight => 0, max_in_flight_per_key => 0)")
    assert conn.execute(index).fetchone() == (False,)
    assert conn.execute("SELECT pgbroker._read_mode(p) FROM pgbroker.policy('l') p").fetchone() == ("plain",)
    _send_keys(conn, "l", ["a"] * 4)
    assert len(conn.execute("SELECT * FROM pgmq.read('l', 30, 10)").fetchall()) == 4


@pytest.mark.parametrize(
    ("setting", "value"),
    [("max_in_flight", -1), ("max_in_flight_per_key", -2), ("rate_limit_per_second", -0.5)],
)
def test_bad_limits_are_refused(conn: Conn, setting: str, value: float) -> None:
    conn.execute("SELECT pgmq.create('l')")
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(f"SELECT pgbroker.set_policy('l', {setting} => %s)", [value])
    assert caught.value.sqlstate == "PB007"
    assert setting in str(caught.value)


def test_the_clients_set_limits_and_send_concurrency_keys(queue: Queue) -> None:
    policy = queue.set_policy(max_in_flight=5, max_in_flight_per_key=1, rate_limit_per_second=100.0)
    assert (policy.max_in_flight, policy.max_in_flight_per_key, policy.rate_limit_per_second) == (5, 1, 100.0)
    for _ in range(3):
        queue.send({}, concurrency_key="tenant-1")
    assert len(queue.read_many(3)) == 1


_APP = """
    import os
    import time

    import psycopg

    import pgbroker

    DSN = os.environ["LIMITS_TEST_DSN"]
    app = pgbroker.App()


    @app.handler("tenants", concurrency=4)
    def handle(message):
        key = message.headers["x-pgbroker-concurrency-key"]
        with psycopg.connect(DSN, autocommit=True) as c:
            c.execute("INSERT INTO running VALUES (%s, %s, %s)", [message.msg_id, key, os.getpid()])
            n = c.execute("SELECT count(*) FROM running WHERE key = %s", [key]).fetchone()[0]
            c.execute("INSERT INTO observed VALUES (%s, %s, %s, %s)", [message.msg_id, key, n, os.getpid()])
            time.sleep(0.05)
            c.execute("DELETE FROM running WHERE msg_id = %s", [message.msg_id])
"""


def test_three_worker_processes_never_run_more_than_two_of_one_key(
    dsn: str, conn: Conn, tmp_path: Path
) -> None:
    """3 processes x 4 handlers each could run 12 at once; with max_in_flight_per_key = 2 the
    handlers, which count their own key's running handlers in a table, never see more than 2."""
    conn.execute("SELECT pgmq.create('tenants')")
    conn.execute("SELECT pgbroker.set_policy('tenants', max_in_flight_per_key => 2)")
    conn.execute("CREATE TABLE running (msg_id bigint, key text, pid integer)")
    conn.execute("CREATE TABLE observed (msg_id bigint, key text, running bigint, pid integer)")
    keys = [f"tenant-{i % 3}" for i in range(60)]
    (tmp_path / "limits_app.py").write_text(textwrap.dedent(_APP))
    env = {
        **os.environ,
        "LIMITS_TEST_DSN": dsn,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable,
        "-m",
        "pgbroker",
        "worker",
        "limits_app:app",
        "--dsn",
        dsn,
        "--poll-max",
        "0.2",
    ]
    workers = [
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    try:
        # The messages go out once every process is up: on a loaded machine the first one to start
        # would otherwise handle all 60 before the others are running, and no limit across
        # processes would be tried.
        deadline = time.monotonic() + 90
        started = "SELECT count(DISTINCT pid) FROM pgbroker.queue_workers WHERE queue_name = 'tenants'"
        while conn.execute(started).fetchone() != (3,) and time.monotonic() < deadline:
            for w in workers:
                assert w.poll() is None, w.stderr.read().decode() if w.stderr else ""
            time.sleep(0.1)
        _send_keys(conn, "tenants", keys)
        while time.monotonic() < deadline:
            done = conn.execute("SELECT count(DISTINCT msg_id) FROM observed").fetchone()
            if done and done[0] >= 60:
                break
            for w in workers:
                assert w.poll() is None, w.stderr.read().decode() if w.stderr else ""
            time.sleep(0.2)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(30)
    most = dict(conn.execute("SELECT key, max(running) FROM observed GROUP BY key").fetchall())
    assert set(most) == {"tenant-0", "tenant-1", "tenant-2"}
    assert max(most.values()) <= 2, f"a key ran more than 2 at once: {most}"
    assert max(most.values()) == 2, "the limit was never reached: the test proves nothing"
    pids = conn.execute("SELECT count(DISTINCT pid) FROM observed").fetchone()
    assert pids is not None
    assert pids[0] >= 2, "one process did all the work: the limit across processes was not tried"
    assert conn.execute("SELECT count(DISTINCT msg_id) FROM observed").fetchone() == (60,)
