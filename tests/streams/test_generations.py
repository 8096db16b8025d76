"""A stream consumer's generations (docs/streams.md, "Generations"): a read sent before the
consumer's rewind and run after it moves nothing, and a consumer that takes a killed one's name
has what that one was handed and did not ack again."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from pgbroker import Broker
from pgbroker._db.liveness import answered_within
from pgbroker.errors import StreamConsumerSuperseded
from pgbroker.queues._client_async import AsyncBroker
from pgbroker.streams._client import Stream
from pgbroker.streams._client_async import AsyncStream
from tests.support.faults import freezable, sessions_frozen


def _gone(dsn: str, pids: list[int]) -> None:
    """Wait until the sessions ``pids`` have ended (what they were sent has run by then)."""
    deadline = time.monotonic() + 60
    left = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)"
    with psycopg.connect(dsn, autocommit=True) as conn:
        while conn.execute(left, (pids,)).fetchone() != (0,):
            assert time.monotonic() < deadline, "the frozen sessions did not end"
            time.sleep(0.05)


def test_a_read_run_after_the_rewind_that_settled_it_moves_nothing(dsn: str, broker: Broker) -> None:
    """The consumer's read goes to a session that has stopped (a hung server or pooler): given up
    unanswered, as the workers give up a call, and settled by a rewind on a new session. The
    stopped session then goes on and runs the read it was sent (a cancel that comes while a
    session waits for a command is ignored). It moved the partition past the three messages, and
    the consumer, owning it still, never had them."""
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")

    async def main() -> list[int]:
        async with AsyncBroker(freezable(dsn), min_connections=1, max_connections=1) as abroker:
            consumer = AsyncStream(abroker, "clicks").consumer("g", name="c")
            assert not (await consumer.read(10)).messages  # registered, the partition taken
            await asyncio.to_thread(clicks.send_many, [{"n": n} for n in range(3)])
            with sessions_frozen(dsn) as frozen:  # the pool's one session
                assert len(frozen) == 1
                with pytest.raises(psycopg.OperationalError):
                    await answered_within(1, consumer.read(10))
                await consumer.rewind()  # on a new session: nothing was handed out yet
            await asyncio.to_thread(_gone, dsn, frozen)  # it ran the read, and ended
            return [m.message["n"] for m in await consumer.read(10)]

    assert asyncio.run(main()) == [0, 1, 2]


def test_a_consumer_that_takes_a_killed_one_s_name_has_what_it_was_handed_again(broker: Broker) -> None:
    """A process killed with a batch in hand, and the next one under the same consumer name (a
    fixed name, as a deployment gives its replicas): the batch is handed out again to it. The
    name was the same consumer's, whose partitions had moved past the batch, and the new process
    read on after it."""
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=2)
    clicks.create_group("g", start="start")
    clicks.send_many([{"n": n} for n in range(5)])
    assert len(clicks.consumer("g", name="replica-0").read(10)) == 5  # never acked: killed
    again = clicks.consumer("g", name="replica-0")
    batch = again.read(10)
    assert sorted(m.message["n"] for m in batch) == [0, 1, 2, 3, 4]
    assert again.ack_and_read(batch, 10).messages == []
    assert clicks.groups()[0].lag == 0


def test_a_second_consumer_reading_under_the_same_name_is_told(broker: Broker) -> None:
    """Two live consumers under one name take each other's reads for stale ones: the one whose
    generation is older is refused with the error that says so, not given rows twice in silence."""
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    clicks.send_many([{"n": n} for n in range(4)])
    first = clicks.consumer("g", name="same")
    assert len(first.read(2)) == 2
    second = clicks.consumer("g", name="same")
    assert sorted(m.message["n"] for m in second.read(10)) == [0, 1, 2, 3]  # rewound: all again
    clicks.send({"n": 4})
    with pytest.raises(StreamConsumerSuperseded) as refused:
        first.read(10)
    assert "give each consumer of a group its own name" in str(refused.value)


def test_a_consumer_made_for_one_call_names_no_generation(broker: Broker) -> None:
    """The HTTP API makes a consumer object for each request; each would otherwise look like a
    newcomer under a taken name and have the group's unacked messages again at every read."""
    clicks = Stream(broker, "clicks")
    clicks.create(partitions=1)
    clicks.create_group("g", start="start")
    clicks.send_many([{"n": n} for n in range(4)])
    assert len(clicks.consumer("g", name="http", fenced=False).read(2)) == 2
    assert [m.message["n"] for m in clicks.consumer("g", name="http", fenced=False).read(10)] == [2, 3]
