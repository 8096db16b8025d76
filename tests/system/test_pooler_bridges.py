"""The RabbitMQ bridges behind pgbouncer in transaction pooling mode (Debian's 1.18), run as a user
runs them (`pgbroker bridge out|in` processes) with ``PGBROKER_POOLER=transaction``: no error,
nothing lost, nothing published or stored twice. The outbound bridge waits by polling there (no
LISTEN through the pooler) or, given ``PGBROKER_LISTEN_DSN``, on a direct connection.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections import Counter

import psycopg
import pytest

from pgbroker import Broker
from pgbroker._db.dsn import LISTEN_DSN_ENV
from tests.support.bridge_processes import pgbroker
from tests.support.rabbit import Rabbit

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("pooler_mode")]

BEFORE = 3000  # waiting when the bridge starts
WHILE = 1000  # sent in small batches while it runs (it idles between them)


def _stop(bridge: subprocess.Popen[str]) -> str:
    """SIGTERM, as an operator stops a bridge; what it wrote to stderr, which must be nothing bad."""
    bridge.send_signal(signal.SIGTERM)
    _, err = bridge.communicate(timeout=60)
    assert bridge.returncode == 0, err
    for bad in ("Traceback", "prepared statement", "error"):
        assert bad not in err, err
    return err


@pytest.mark.parametrize("listen", [False, True], ids=["polling", "listen-dsn"])
def test_bridge_out_through_the_pooler(
    pooled_dsn: str,
    dsn: str,
    amqp: str,
    listen: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if listen:
        monkeypatch.setenv(LISTEN_DSN_ENV, dsn)
    with Broker(dsn) as direct:
        outbox = direct.create_queue("outbox")
        outbox.send_many([{"n": n} for n in range(BEFORE)])

        async def scenario() -> list[int]:
            async with Rabbit(amqp) as rabbit:
                target = await rabbit.queue()
                bridge = pgbroker(
                    "bridge", "out", "--queue", "outbox", "--amqp", amqp, "--routing-key", target,
                    dsn=pooled_dsn,
                )  # fmt: skip
                try:
                    for start in range(BEFORE, BEFORE + WHILE, 50):
                        outbox.send_many([{"n": n} for n in range(start, start + 50)])
                        await asyncio.sleep(0.02)
                    got = await rabbit.drain(target, expect=BEFORE + WHILE, timeout=90)
                finally:
                    _stop(bridge)
                assert all(m.header.properties.message_id for m in got)
                return [json.loads(m.body)["n"] for m in got]

        published = asyncio.run(scenario())
        assert sorted(published) == list(range(BEFORE + WHILE)), "lost or published twice"
        assert direct.metrics("outbox").queue_length == 0
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pgmq.a_outbox WHERE headers ? 'x-pgbroker-published'"
        ).fetchone()
    assert row == (BEFORE + WHILE,)


def test_bridge_in_through_the_pooler(
    pooled_dsn: str,
    dsn: str,
    amqp: str,
) -> None:
    with Broker(dsn) as direct:
        direct.create_queue("inbox")

        async def scenario() -> None:
            async with Rabbit(amqp) as rabbit:
                source = await rabbit.queue()
                for i in range(BEFORE):
                    await rabbit.publish(source, b'{"n": %d}' % i, message_id=f"m-{i}")
                bridge = pgbroker(
                    "bridge", "in", "--amqp", amqp, "--from", source, "--queue", "inbox",
                    dsn=pooled_dsn,
                )  # fmt: skip
                try:
                    for i in range(BEFORE, BEFORE + WHILE):
                        await rabbit.publish(source, b'{"n": %d}' % i, message_id=f"m-{i}")
                        if i % 50 == 0:
                            await asyncio.sleep(0.02)
                    # A publisher's retries: the same message_ids again, to be acked, not stored.
                    for i in range(0, BEFORE + WHILE, 10):
                        await rabbit.publish(source, b'{"n": %d}' % i, message_id=f"m-{i}")
                    deadline = time.monotonic() + 90
                    while time.monotonic() < deadline and (
                        await rabbit.count(source) or direct.metrics("inbox").queue_length < BEFORE + WHILE
                    ):
                        await asyncio.sleep(0.2)
                    await asyncio.sleep(0.5)  # a late second store would show now
                finally:
                    _stop(bridge)
                assert await rabbit.count(source) == 0

        asyncio.run(scenario())
    with psycopg.connect(dsn) as conn:
        stored = Counter(int(n) for (n,) in conn.execute("SELECT message->>'n' FROM pgmq.q_inbox"))
    assert sorted(stored) == list(range(BEFORE + WHILE)), "lost"
    assert max(stored.values()) == 1, "stored twice"
