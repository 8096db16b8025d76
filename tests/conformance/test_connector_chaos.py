"""Chaos for every connector beyond RabbitMQ (whose own is test_chaos.py): a `pgbroker bridge`
process is SIGKILLed mid-run and the broker restarted once, and still

  out  every message arrives; a message arrives twice only if it was read more than once (the
       killed bridge's window, or a window cut off by the restart), with the same message id and
       body;
  in   the pgbroker queue holds each message exactly once.

The broker is a private server the test starts (tests/support/servers.py), restarted gracefully
with its data kept. moto's SQS endpoint keeps everything in memory, so a restart would lose the
queue itself: the SQS runs kill the bridge and leave the endpoint alone.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pgbroker import Broker
from pgbroker.queues._records import message_identity
from tests.support.bridge_processes import BridgeProcess, wait_for
from tests.support.postgres import scratch_dir
from tests.support.probes import Probe, body_of, probe, unique
from tests.support.servers import CONNECTORS, KINDS, PrivateServer
from tests.support.services import service_params

pytestmark = pytest.mark.slow

MESSAGES = 3000
# moto's SQS slows down as a queue grows (about 20 sends a second with 2,000 messages in it).
MESSAGES_OF = {"sqs": 400}
CHUNK = 25
RESTARTABLE = {"redis", "nats", "mqtt"}  # moto would come back empty


@pytest.fixture(params=service_params(*CONNECTORS))
def private(request: pytest.FixtureRequest) -> Iterator[PrivateServer]:
    base = scratch_dir(f"pgbroker-{request.param}-")
    node = PrivateServer(KINDS[request.param], base)
    node.start()
    try:
        yield node
    finally:
        node.close()


@pytest.fixture
def bridges() -> Iterator[list[BridgeProcess]]:
    """The test's bridge processes; any still running at its end (a failed test) is killed."""
    started: list[BridgeProcess] = []
    yield started
    for bridge in started:
        if bridge.process.poll() is None:
            bridge.kill()


def restart_bridge(
    killed: BridgeProcess, options: list[str], dsn: str, logs: Path, env: dict[str, str]
) -> BridgeProcess:
    """SIGKILL a bridge mid-run and start another in its place."""
    killed.kill()
    return BridgeProcess(*options, dsn=dsn, logs=logs, env=env)


class Chaos:
    """Kill the bridge once 30 % of the messages went through it, and restart the broker at
    60 %: checked while messages come (step), and waited for after (finish)."""

    def __init__(
        self, progress: Callable[[], int], total: int, server: PrivateServer, *, restart: bool
    ) -> None:
        self.progress = progress
        self.total = total
        self.server = server
        self.restart = restart
        self.killed = self.restarted = False

    def step(self, kill: Callable[[], None]) -> None:
        done = self.progress()
        if not self.killed and done >= 0.3 * self.total:
            kill()
            self.killed = True
        elif self.killed and self.restart and not self.restarted and done >= 0.6 * self.total:
            self.server.restart()
            self.restarted = True

    def finish(self, kill: Callable[[], None]) -> None:
        wait_for(lambda: self.killed or self.progress() >= 0.3 * self.total, "30 % through", 45)
        self.step(kill)
        if self.restart:
            wait_for(lambda: self.restarted or self.progress() >= 0.6 * self.total, "60 % through", 45)
            self.step(kill)
        assert self.killed
        assert self.restarted or not self.restart


def count(dsn: str, sql: str) -> int:
    with Broker(dsn) as broker, broker.connection() as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return int(row[0])


def test_out_delivers_every_message_through_a_sigkill_and_a_broker_restart(
    dsn: str, private: PrivateServer, tmp_path: Path, bridges: list[BridgeProcess]
) -> None:
    kind = private.kind.name
    total = MESSAGES_OF.get(kind, MESSAGES)
    check: Probe = probe(kind, private.port)
    target = unique("chaos")
    asyncio.run(check.prepare_out(target))
    with Broker(dsn) as broker:
        outbox = broker.create_queue("outbox")
        outbox.set_policy(backoff_base_seconds=1, backoff_max_seconds=2)
    options = ["bridge", "out", "--queue", "outbox", "--to", check.url(target)]
    options += ["--lease", "3", "--batch-size", "50", "--confirm-timeout", "5"]
    bridges.append(BridgeProcess(*options, dsn=dsn, logs=tmp_path, env=check.env))
    wait_for(bridges[0].started, "the bridge started", 20)
    published = "SELECT count(*) FROM pgmq.a_outbox"
    chaos = Chaos(lambda: count(dsn, published), total, private, restart=kind in RESTARTABLE)
    with Broker(dsn) as broker:
        outbox = broker.queue("outbox")
        for start in range(0, total, CHUNK):
            outbox.send_many([{"n": n} for n in range(start, start + CHUNK)])
            time.sleep(0.03)
            chaos.step(lambda: bridges.append(restart_bridge(bridges[-1], options, dsn, tmp_path, check.env)))
    chaos.finish(lambda: bridges.append(restart_bridge(bridges[-1], options, dsn, tmp_path, check.env)))
    wait_for(lambda: count(dsn, published) == total, "all published", 45)
    code, err = bridges[-1].stop()
    assert code == 0, err

    got = asyncio.run(check.published(target, expect=total))
    with Broker(dsn) as broker, broker.connection() as conn:
        archive = {
            message_identity(str(m), at): (r, msg["n"])
            for m, at, r, msg in conn.execute(
                "SELECT msg_id, enqueued_at, read_ct, message FROM pgmq.a_outbox"
            )
        }
    seen = Counter(mid for mid, _ in got)
    missing = set(archive) - set(seen)
    assert not missing, f"every message arrives, with its identity: {len(missing)} of {total} missing"
    assert set(seen) <= set(archive)
    duplicates = {mid for mid, n in seen.items() if n > 1}
    assert all(archive[str(m)][0] > 1 for m in duplicates), "a duplicate only for one read more than once"
    for mid, body in got:
        assert json.loads(body) == {"n": archive[str(mid)][1]}
    print(f"{kind} out: {len(got)} received, {len(seen)} distinct, {len(duplicates)} duplicated,"
          f" {sum(1 for r, _ in archive.values() if r > 1)} read more than once")  # fmt: skip


def test_in_stores_each_message_once_through_a_sigkill_and_a_broker_restart(
    dsn: str, private: PrivateServer, tmp_path: Path, bridges: list[BridgeProcess]
) -> None:
    kind = private.kind.name
    total = MESSAGES_OF.get(kind, MESSAGES)
    check: Probe = probe(kind, private.port)
    source = unique("chaos")
    asyncio.run(check.prepare_in(source))
    with Broker(dsn) as broker:
        broker.create_queue("inbox")
    options = ["bridge", "in", "--from", check.url(source), "--queue", "inbox", "--declare"]
    options += ["--batch-size", "50", "--ack-wait", "3", "--progress", "0.5"]
    bridges.append(BridgeProcess(*options, dsn=dsn, logs=tmp_path, env=check.env))
    wait_for(bridges[0].started, "the bridge subscribed", 20)
    stored = "SELECT count(*) FROM pgmq.q_inbox"
    chaos = Chaos(lambda: count(dsn, stored), total, private, restart=kind in RESTARTABLE)

    def kill() -> None:
        bridges.append(restart_bridge(bridges[-1], options, dsn, tmp_path, check.env))

    async def publish_all() -> None:
        for start in range(0, total, CHUNK):
            chunk = [(f"m-{n}", body_of(n)) for n in range(start, start + CHUNK)]
            deadline = time.monotonic() + 30
            while True:  # the broker may be restarting: publish the chunk again (same ids)
                try:
                    await check.publish(source, chunk)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.3)
            await asyncio.sleep(0.03)
            chaos.step(kill)

    asyncio.run(publish_all())
    chaos.finish(kill)
    wait_for(lambda: count(dsn, stored) >= total, "all stored", 45)
    time.sleep(2)  # a second copy would come now
    code, err = bridges[-1].stop()
    assert code == 0, err
    with Broker(dsn) as broker, broker.connection() as conn:
        ns = [m["n"] for (m,) in conn.execute("SELECT message FROM pgmq.q_inbox")]
    assert sorted(ns) == list(range(total)), "each message exactly once"
    last = [line for line in err.splitlines() if line.startswith("progress ")][-1:]
    print(f"{kind} in: {len(ns)} stored; the last bridge: {last}")
