"""The StreamWorker's dispatch (pgbroker.runtime._stream_dispatch): a key's messages in the log's
order across batches, other keys beside them, batches acked in the order read."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from pgbroker.runtime._stream_dispatch import HeldBatch, KeyedDispatch, joined
from pgbroker.streams._records import StreamBatch, StreamMessage


def batch(*items: tuple[int, int, str | None], epoch: int = 1) -> StreamBatch:
    """Messages (partition, id, key)."""
    return StreamBatch(
        [StreamMessage("s", p, i, epoch, k, datetime.now(UTC), None, {"id": i}) for p, i, k in items]
    )


def test_a_key_waits_behind_its_earlier_batch_and_the_others_go_ahead() -> None:
    async def main() -> tuple[list[int], list[list[HeldBatch]]]:
        dispatch = KeyedDispatch(low_water=2)
        order: list[int] = []
        release = asyncio.Event()
        taken: list[list[HeldBatch]] = []

        async def handle(message: StreamMessage, held: HeldBatch) -> None:
            if message.id == 1:
                await release.wait()  # the first batch's slow message
            order.append(message.id)

        dispatch.add(batch((0, 1, "slow"), (0, 2, "a")))
        dispatch.add(batch((0, 3, "b"), (0, 4, None)))
        dispatch.add(batch((0, 5, "slow")))
        slots = [asyncio.create_task(dispatch.slot(handle)) for _ in range(2)]
        for _ in range(20):
            await asyncio.sleep(0)
        taken.append(dispatch.take_completed())  # the second batch is done, the first is not
        release.set()
        for _ in range(20):
            await asyncio.sleep(0)
        taken.append(dispatch.take_completed())
        for slot in slots:
            slot.cancel()
        return order, taken

    order, taken = asyncio.run(main())
    assert order == [2, 3, 4, 1, 5]  # the other keys overtook the slow one, which kept its order
    assert [[h.batch.messages[0].id for h in t] for t in taken] == [[], [1, 3, 5]]  # in the order read


def test_a_lost_partition_s_rest_is_dropped_and_counted() -> None:
    async def main() -> tuple[list[int], HeldBatch]:
        dispatch = KeyedDispatch()
        order: list[int] = []

        async def handle(message: StreamMessage, held: HeldBatch) -> None:
            order.append(message.id)
            if message.id == 1:
                held.lost.add(0)

        dispatch.add(batch((0, 1, "k"), (0, 2, "k"), (1, 3, "j")))
        slot = asyncio.create_task(dispatch.slot(handle))
        for _ in range(20):
            await asyncio.sleep(0)
        (held,) = dispatch.take_completed()
        slot.cancel()
        return order, held

    order, held = asyncio.run(main())
    assert order == [1, 3]
    assert (held.remaining, held.dropped) == (0, 1)


def test_done_batches_are_acked_as_one_while_their_epochs_agree() -> None:
    def held(b: StreamBatch) -> HeldBatch:
        return HeldBatch(b, {m.partition: m.epoch for m in b}, 0)

    first = held(batch((0, 1, "k"), (1, 2, "j")))
    first.batch.fail(2, "boom")
    second = held(batch((0, 5, "k")))
    third = held(batch((1, 7, "j"), epoch=2))  # partition 1 changed hands in between
    acked, count = joined([first, second, third])
    assert count == 2
    assert acked is not None
    assert [m.id for m in acked] == [1, 2, 5]
    assert acked.failures == {2: "boom"}
    assert acked.ack_ranges() == ([0, 1], [1, 1], [5, 2])
    assert joined([third]) == (third.batch, 1)
    assert joined([]) == (None, 0)


def test_a_slot_woken_for_a_key_another_slot_took_waits_for_the_next() -> None:
    """A batch wakes an idle slot for each new key; a busy slot that finishes first may take the
    key itself. The slot woken for it then waits again, alive: both slots run the next batch."""

    async def main() -> tuple[list[int], set[int]]:
        dispatch = KeyedDispatch()
        order: list[int] = []
        go, hold = asyncio.Event(), asyncio.Event()
        running: set[int] = set()

        async def handle(message: StreamMessage, held: HeldBatch) -> None:
            running.add(message.id)
            if message.id == 1:
                await go.wait()
            elif message.id > 2:
                await hold.wait()
            order.append(message.id)

        dispatch.add(batch((0, 1, "a")))
        slots = [asyncio.create_task(dispatch.slot(handle)) for _ in range(2)]
        for _ in range(5):
            await asyncio.sleep(0)  # one slot on message 1, the other idle
        go.set()  # message 1's slot is woken first ...
        dispatch.add(batch((0, 2, "b")))  # ... so it takes key b before the idle slot it woke
        for _ in range(5):
            await asyncio.sleep(0)
        dispatch.add(batch((0, 3, "c"), (0, 4, "d")))
        for _ in range(5):
            await asyncio.sleep(0)
        both = set(running) & {3, 4}
        hold.set()
        for _ in range(5):
            await asyncio.sleep(0)
        for slot in slots:
            slot.cancel()
        return order, both

    order, both = asyncio.run(main())
    assert both == {3, 4}  # two slots alive, each on a key of the last batch
    assert order[:2] == [1, 2]
    assert sorted(order[2:]) == [3, 4]
