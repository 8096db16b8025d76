"""A worker on a host whose clock differs from the server's (a VM resumed from sleep, a container
without NTP): the server sets a lease's end on its own clock, so the worker times its leases from
when it asked for them, on its own monotonic clock, never by comparing the two wall clocks.

The skew is made by shifting this process's ``time.time``, which is what another host's wall
clock is to the server; the server and its leases are real."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from pgbroker import Broker, Message, Worker
from tests.support.tables import Conn, a_rows
from tests.support.worker import run_until

HOUR = 3600.0


def _skew_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


def test_a_worker_whose_clock_runs_ahead_handles_every_message(
    broker: Broker, dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Judged by a clock an hour ahead, every lease the server hands out has already ended: a
    worker that trusted it took every message it read for expired and handled none, for good."""
    queue = broker.create_queue("jobs")
    sent = queue.send_many([{"n": n} for n in range(200)])
    handled: list[int] = []

    async def handle(message: Message) -> None:
        handled.append(message.msg_id)

    _skew_clock(monkeypatch, HOUR)
    worker = Worker("jobs", handle, vt=10, concurrency=2)
    asyncio.run(run_until(dsn, [worker], lambda: len(a_rows(conn, "jobs")) == len(sent)))

    assert sorted(handled) == sent
    assert worker.stats.stale == 0


def test_a_worker_whose_clock_runs_behind_keeps_a_long_handler_s_lease(
    broker: Broker, dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Judged by a clock an hour behind, a lease looks an hour away from its end: a worker that
    trusted it never extended one, and a handler longer than vt lost its message to a read
    (handled twice, its ack refused)."""
    queue = broker.create_queue("jobs")
    [msg_id] = queue.send_many([{"slow": True}])
    calls: Counter[int] = Counter()

    async def handle(message: Message) -> None:
        calls[message.msg_id] += 1
        await asyncio.sleep(7)  # over two leases of 3 s

    _skew_clock(monkeypatch, -HOUR)
    worker = Worker("jobs", handle, vt=3)
    asyncio.run(run_until(dsn, [worker], lambda: len(a_rows(conn, "jobs")) == 1))

    assert calls == {msg_id: 1}
    assert worker.stats.stale == 0
    [(archived_id, read_ct, *_)] = a_rows(conn, "jobs")
    assert (archived_id, read_ct) == (msg_id, 1)
