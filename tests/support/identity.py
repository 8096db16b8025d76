"""A failover's effect on message identity, played against any outbound bridge URL.

An asynchronous standby promoted after a crash has lost the tail of the WAL: sends the old primary
acknowledged are gone, and so are their sequence values, so the new primary hands those msg_ids
out again, to other messages. The scenario makes exactly that state on one server: a message is
sent and bridged out; then its rows are removed and the queue's msg_id sequence is moved back
with setval (what the new primary has), and a new message is sent: it gets the lost one's msg_id.
That new message is then published twice, as a bridge killed between the broker's confirm and
its ack makes it (the lease runs out, the message is read again and published again).

Downstream de-duplication by message id must keep the new message (its id differs from the lost
one's) and recognise its second publish (the same id both times).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from pgbroker import Broker
from pgbroker.bridge import OutboundBridge, OutboundSettings
from pgbroker.bridge.connector import Confirmed
from pgbroker.bridge.core.endpoints import outbound_endpoint
from pgbroker.bridge.core.outbound import out_message
from pgbroker.queues._client_async import AsyncBroker

# What a broker holds: (message id, body) per stored message.
Published = Callable[[int], Coroutine[Any, Any, Sequence[tuple[str | None, bytes]]]]

QUEUE = "outbox"


def msg_id_of(message_id: str | None) -> int:
    """The msg_id in a bridged message's id, ``<msg_id>@<enqueued_at>``."""
    assert message_id is not None
    assert "@" in message_id, f"not a message identity: {message_id!r}"
    return int(message_id.partition("@")[0])


async def drain(dsn: str, url: str, settings: OutboundSettings, timeout: float = 60) -> None:
    """Run an outbound bridge until the queue is empty, then stop it."""
    async with AsyncBroker(dsn) as abroker:
        bridge = OutboundBridge(abroker, QUEUE, url, settings)
        task = asyncio.create_task(bridge.run())
        deadline = time.monotonic() + timeout
        try:
            while (await abroker.metrics(QUEUE)).queue_length:
                if task.done():
                    task.result()
                    raise AssertionError("the bridge returned before it was stopped")
                assert time.monotonic() < deadline, f"the queue not drained after {timeout} s"
                await asyncio.sleep(0.05)
        finally:
            bridge.stop()
            await task


def head_rows(dsn: str) -> int:
    """How many rows the queue's read bounds have had (pgbroker.queue_head is appended to)."""
    with Broker(dsn) as broker, broker.connection() as conn:
        row = conn.execute(
            "SELECT coalesce(max(seq), 0) FROM pgbroker.queue_head WHERE queue_name = %s", (QUEUE,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def lose_the_tail(dsn: str, msg_id: int, head_seq: int) -> None:
    """The new primary's state: no trace of ``msg_id`` nor of what came after it (the queue's
    read bounds as they stood at ``head_seq``: a bound moved past ``msg_id`` was written after it,
    and is lost with it), and its sequence about to give it again."""
    with Broker(dsn) as broker, broker.connection() as conn:
        conn.execute(f"DELETE FROM pgmq.a_{QUEUE} WHERE msg_id >= %s", (msg_id,))  # noqa: S608
        conn.execute(f"DELETE FROM pgmq.q_{QUEUE} WHERE msg_id >= %s", (msg_id,))  # noqa: S608
        conn.execute("DELETE FROM pgbroker.queue_head WHERE queue_name = %s AND seq > %s", (QUEUE, head_seq))
        conn.execute(
            "SELECT setval(pg_get_serial_sequence(%s, 'msg_id'), %s, false)", (f"pgmq.q_{QUEUE}", msg_id)
        )


async def publish_without_ack(dsn: str, url: str, settings: OutboundSettings) -> None:
    """What a bridge killed after the broker's confirm leaves: published, still in the queue,
    its lease (one second) running out."""
    async with AsyncBroker(dsn) as abroker:
        [message] = await abroker.queue(QUEUE).read_many(1, vt=1, decode=False)
        publisher = await outbound_endpoint(url, QUEUE, settings).open()
        try:
            assert all(isinstance(o, Confirmed) for o in await publisher.publish([out_message(message)], 30))
        finally:
            await publisher.close()
    await asyncio.sleep(1.2)  # the lease runs out


def ids_across_a_failover(
    dsn: str, url: str, published: Published, *, broker_deduplicates: bool = False
) -> None:
    """The scenario above; ``broker_deduplicates``: the broker itself drops a message whose id it
    holds already (JetStream), so a redelivery is stored once."""
    settings = OutboundSettings(confirm_timeout=30)
    with Broker(dsn) as broker:
        queue = broker.create_queue(QUEUE)
        lost = queue.send({"n": "lost"})
    head_seq = head_rows(dsn)
    asyncio.run(drain(dsn, url, settings))

    lose_the_tail(dsn, lost, head_seq)
    with Broker(dsn) as broker:
        reissued = broker.queue(QUEUE).send({"n": "new"})
    assert reissued == lost, "the new primary gives the lost msg_id to another message"

    asyncio.run(publish_without_ack(dsn, url, settings))
    asyncio.run(drain(dsn, url, settings))

    expected = 2 if broker_deduplicates else 3
    got = asyncio.run(published(expected))
    by_body: dict[str, list[str | None]] = {}
    for message_id, body in got:
        by_body.setdefault(json.loads(body)["n"], []).append(message_id)
    assert sorted(by_body) == ["lost", "new"], f"downstream de-duplication dropped a message: {got}"
    assert len(by_body["new"]) == expected - 1
    [lost_id] = by_body["lost"]
    assert set(by_body["new"]) != {lost_id}, "the reissued msg_id must not repeat the lost message's id"
    assert len(set(by_body["new"])) == 1, "a redelivery keeps the message's id"
    assert msg_id_of(lost_id) == lost
