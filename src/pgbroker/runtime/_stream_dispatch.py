"""The batches a StreamWorker holds and the keys that order their messages.

A key's messages run one after another, in the log's order, across batches: a message whose key
is still running (or waiting) from an earlier batch waits behind it. Different keys run side by
side, so a batch read ahead starts on its other keys while the one before finishes its last
keys (the model of Confluent's parallel consumer): no barrier between batches, and a slow message
holds up its own key only. A message without a key has no order to keep and runs beside any
other. Batches complete in any order but are acked in the order read, since an ack moves each
partition's cursor past the whole batch.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

from pgbroker.streams._records import StreamBatch, StreamMessage


@dataclass(eq=False)
class HeldBatch:
    """A batch in hand: its partitions' epochs as read, and what is left to handle."""

    batch: StreamBatch
    epochs: dict[int, int]  # partition -> the lease epoch the batch was read under
    remaining: int
    lost: set[int] = field(default_factory=set)  # partitions taken since: the rest is dropped
    dropped: int = 0  # messages dropped for them


Handle = Callable[[StreamMessage, HeldBatch], Awaitable[None]]


class KeyedDispatch:
    """Messages waiting per key, and the slots that take them. ``changed`` is set when a batch's
    last message is done, and when the keys waiting for a slot fall below ``low_water``."""

    def __init__(self, low_water: int = 1) -> None:
        self.held: deque[HeldBatch] = deque()
        self.changed = asyncio.Event()
        self.low_water = low_water
        self._chains: dict[Hashable, deque[tuple[StreamMessage, HeldBatch]]] = {}
        # Keys with messages waiting and no slot on them, and the slots waiting for one: plain
        # deques, where an asyncio.Queue cost 0.9 us a key more (a put and a get).
        self._ready: deque[Hashable] = deque()
        self._idle: deque[asyncio.Future[None]] = deque()

    def add(self, batch: StreamBatch) -> None:
        held = HeldBatch(batch, {m.partition: m.epoch for m in batch}, len(batch))
        self.held.append(held)
        for message in batch:
            key: Hashable = (message.partition, message.id) if message.key is None else message.key
            chain = self._chains.get(key)
            if chain is None:
                self._chains[key] = deque([(message, held)])
                self._ready.append(key)
            else:
                chain.append((message, held))
        for _ in range(min(len(self._ready), len(self._idle))):
            waiter = self._idle.popleft()
            if not waiter.done():  # else its slot was cancelled
                waiter.set_result(None)

    @property
    def in_flight(self) -> int:
        return sum(held.remaining for held in self.held)

    @property
    def slots_short(self) -> bool:
        """Whether fewer keys wait for a slot than low_water."""
        return len(self._ready) < self.low_water

    def take_completed(self) -> list[HeldBatch]:
        """The batches done, in the order read, up to the first one still being handled."""
        done = []
        while self.held and self.held[0].remaining == 0:
            done.append(self.held.popleft())
        return done

    async def slot(self, handle: Handle) -> None:
        """One handler at a time: the next key with messages waiting, its messages one after
        another (more may come meanwhile from a later batch), then the next key."""
        while True:
            while not self._ready:  # another slot may take the key this one was woken for
                waiter = asyncio.get_running_loop().create_future()
                self._idle.append(waiter)
                await waiter
            key = self._ready.popleft()
            if len(self._ready) == self.low_water - 1:
                self.changed.set()
            chain = self._chains[key]
            while chain:
                message, held = chain[0]
                if message.partition in held.lost:
                    held.dropped += 1
                else:
                    await handle(message, held)
                chain.popleft()
                held.remaining -= 1
                if held.remaining == 0:
                    self.changed.set()
            del self._chains[key]


def joined(done: list[HeldBatch]) -> tuple[StreamBatch | None, int]:
    """One ack for the oldest of ``done``: as many of them as were read under the same epoch in
    every partition they share, as one batch (its cursor moves are those of acking them one by
    one), and how many it covers."""
    if not done:
        return None, 0
    epochs = dict(done[0].epochs)
    count = 1
    for held in done[1:]:
        if any(epochs.get(p, e) != e for p, e in held.epochs.items()):
            break
        epochs.update(held.epochs)
        count += 1
    if count == 1:
        return done[0].batch, 1
    messages = [m for held in done[:count] for m in held.batch.messages]
    failures = {i: e for held in done[:count] for i, e in held.batch.failures.items()}
    return StreamBatch(messages, failures), count
