"""The bridges under the least-privilege roles (docs/operations.md, "Database roles"), run as
`pgbroker bridge ...` processes against a private Redis: an inbound bridge only writes into its
queue, so a producer login runs it; an outbound bridge reads, acks and fails, so a consumer login
runs it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgbroker import Broker
from pgbroker._db.install import grant_queue_access
from pgbroker.bridge.core.inbound_targets import InboundTarget, QueueTarget, StreamTarget
from pgbroker.queues._client_async import AsyncBroker
from tests.support.bridge_processes import BridgeProcess, pgbroker, wait_for
from tests.support.roles import role_logins
from tests.support.servers import PrivateServer

Conn = psycopg.Connection[Any]


@pytest.fixture
def logins(dsn: str, conn: Conn, pg_admin_dsn: str) -> Iterator[dict[str, str]]:
    with role_logins(dsn, conn, pg_admin_dsn) as dsns:
        yield dsns


def run_bridge(*args: str, dsn: str, logs: Path) -> BridgeProcess:
    process = BridgeProcess(*args, dsn=dsn, logs=logs, env={})
    try:
        wait_for(process.started, "bridge started", 60)
    except BaseException:
        if process.process.poll() is None:
            process.kill()
        raise
    return process


def depth(conn: Conn, queue: str) -> int:
    row = conn.execute("SELECT queue_length FROM pgmq.metrics(%s)", (queue,)).fetchone()
    return int(row[0]) if row else 0


def stream_length(conn: Conn, stream: str) -> int:
    query = sql.SQL("SELECT count(*) FROM pgbroker.{}").format(sql.Identifier(f"s_{stream}"))
    row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def receive(
    into: tuple[str, str], count: int, arrived: Callable[[], int], *, dsn: str, port: int, logs: Path
) -> None:
    """Run `bridge in` as ``dsn`` from a new Redis stream ``into`` ("--queue", name) or
    ("--stream", name), publish ``count`` messages there, wait until ``arrived()`` counts them,
    and stop the bridge, which must exit 0."""
    name = f"in-{uuid.uuid4().hex[:8]}"
    url = f"redis://127.0.0.1:{port}?stream={name}"
    bridge = run_bridge("bridge", "in", "--from", url, *into, "--declare", dsn=dsn, logs=logs)
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        for n in range(count):
            client.xadd(
                name, {"body": f'{{"n": {n}}}', "content_type": "application/json", "message_id": f"m{n}"}
            )
        wait_for(lambda: arrived() == count, f"{count} messages received", 60)
    finally:
        client.close()
        code, log = bridge.stop()
    assert code == 0, log


def prune_as(dsn: str, target: Callable[[AsyncBroker], InboundTarget]) -> int:
    """One pruning, as the bridge makes every minute, by ``dsn``, with a window of a minute."""

    async def prune() -> int:
        async with AsyncBroker(dsn) as broker:
            return await target(broker).prune(60)

    return asyncio.run(prune())


def test_an_inbound_bridge_runs_under_a_producer_login(
    dsn: str, conn: Conn, logins: dict[str, str], redis_server: PrivateServer, tmp_path: Path
) -> None:
    # It checked its queue at the start with pgbroker.policy, a consumer's function: a login with
    # only the producer role (which receive_many and prune_inbound_seen are granted to, for it)
    # exited at once with "permission denied for function policy".
    conn.execute("SELECT pgmq.create('inbox')")
    arrived = partial(depth, conn, "inbox")
    receive(("--queue", "inbox"), 3, arrived, dsn=logins["producer"], port=redis_server.port, logs=tmp_path)
    messages = conn.execute("SELECT message FROM pgmq.q_inbox ORDER BY msg_id").fetchall()
    assert [m[0] for m in messages] == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_an_inbound_bridge_into_a_stream_runs_under_a_producer_login(
    dsn: str, conn: Conn, logins: dict[str, str], redis_server: PrivateServer, tmp_path: Path
) -> None:
    # It checked the stream with stream_groups (a consumer's), and stream_receive_many and
    # prune_stream_inbound_seen were granted to no role: only the owner could run it.
    conn.execute("SELECT pgbroker.create_stream('mirror', 1)")
    arrived = partial(stream_length, conn, "mirror")
    receive(("--stream", "mirror"), 2, arrived, dsn=logins["producer"], port=redis_server.port, logs=tmp_path)
    conn.execute("UPDATE pgbroker.stream_inbound_seen SET seen_at = now() - interval '2 minutes'")
    assert prune_as(logins["producer"], lambda broker: StreamTarget(broker, "mirror")) == 2


def test_an_inbound_bridge_runs_under_a_producer_granted_its_queue_only(
    dsn: str,
    conn: Conn,
    logins: dict[str, str],
    redis_server: PrivateServer,
    tmp_path: Path,
    pg_admin_dsn: str,
) -> None:
    # It received, but its pruning (of every queue's ids, which no queue grant covers) was refused
    # every minute (bridge.in.prune_failed), and its queue's ids piled up.
    conn.execute("SELECT pgmq.create('inbox')")
    user = f"t{uuid.uuid4().hex[:10]}_inbox_only"  # a queue grant needs the roles (logins) made
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(user)))
    try:
        assert grant_queue_access(conn, "producer", user, "inbox")
        scoped = make_conninfo(dsn, user=user)
        arrived = partial(depth, conn, "inbox")
        receive(("--queue", "inbox"), 1, arrived, dsn=scoped, port=redis_server.port, logs=tmp_path)
        conn.execute("UPDATE pgbroker.inbound_seen SET seen_at = now() - interval '2 minutes'")
        assert prune_as(scoped, lambda broker: QueueTarget(broker, "inbox")) == 1
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(user)))
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(user)))


def test_an_inbound_bridge_refuses_at_the_start_a_queue_the_login_may_not_write(
    dsn: str, conn: Conn, logins: dict[str, str], redis_server: PrivateServer, tmp_path: Path
) -> None:
    # The start's check is the bridge's own write (of no message): a consumer login is told at once.
    conn.execute("SELECT pgmq.create('inbox')")
    url = f"redis://127.0.0.1:{redis_server.port}?stream=in-{uuid.uuid4().hex[:8]}"
    done = pgbroker("bridge", "in", "--from", url, "--queue", "inbox", "--declare", dsn=logins["consumer"])
    try:
        _, err = done.communicate(timeout=60)  # it ran on, to fail at its first batch
    finally:
        if done.poll() is None:
            done.kill()
            done.communicate()
    assert done.returncode == 5, err
    assert "permission denied for function receive_many" in err


def test_an_outbound_bridge_runs_under_a_consumer_login(
    dsn: str, conn: Conn, logins: dict[str, str], redis_server: PrivateServer, tmp_path: Path
) -> None:
    # Enabling notify on the queue is the owner's: the bridge logs that it polls instead, as a
    # worker does (it exited with "permission denied for table notify_insert_throttle").
    with Broker(dsn) as broker:
        broker.create_queue("outbox")
        broker.queue("outbox").send_many([{"n": n} for n in range(3)])
    name = f"out-{uuid.uuid4().hex[:8]}"
    url = f"redis://127.0.0.1:{redis_server.port}?stream={name}"
    bridge = run_bridge(
        "bridge", "out", "--queue", "outbox", "--to", url, dsn=logins["consumer"], logs=tmp_path
    )
    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    try:
        wait_for(lambda: client.xlen(name) == 3 and depth(conn, "outbox") == 0, "3 messages published", 60)
    finally:
        client.close()
        code, log = bridge.stop()
    assert code == 0, log
    assert "bridge.out.notify_unavailable" in log
