"""The demo's worker stage: a Worker consumes a queue of tasks
with several in flight, and the one poison task among them goes to the dead-letter queue after
its last allowed delivery, with the delivery count and the error in its headers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from pgbroker import _event_loop as event_loop
from pgbroker.demo.stage import Demo
from pgbroker.queues._records import Message
from pgbroker.runtime._app import serve
from pgbroker.runtime._worker import Worker

__all__ = ["workers_stage"]

QUEUE = "demo_tasks"
DEAD_LETTER_QUEUE = "demo_tasks_dlq"
TASKS = 2_000
POISON = 1_234  # the task that always fails
MAX_DELIVERIES = 3
CONCURRENCY = 8
TIMEOUT_SECONDS = 60.0


class PoisonError(RuntimeError):
    """What the poison task raises, every time."""


def handle(message: Message) -> None:
    """A task handler: the poison task fails; every other one just succeeds."""
    if message.message["task"] == POISON:
        raise PoisonError(f"task {POISON} cannot be processed (it is the poison one)")


def workers_stage(demo: Demo) -> None:
    broker = demo.broker
    queue = broker.create_queue(QUEUE)
    dead_letters = broker.create_queue(DEAD_LETTER_QUEUE)
    leftover = queue.purge() + dead_letters.purge()
    # Retry at once (fixed back-off of 0 s), so that the tour need not wait for the back-off.
    queue.set_policy(
        max_deliveries=MAX_DELIVERIES,
        backoff="fixed",
        backoff_base_seconds=0,
        dead_letter_queue=DEAD_LETTER_QUEUE,
    )
    demo.say(
        "workers",
        f"{QUEUE}: at most {MAX_DELIVERIES} deliveries, then to {DEAD_LETTER_QUEUE} (pgbroker policy show)"
        + (f"; purged {leftover:,} messages left from an earlier run" if leftover else ""),
    )
    queue.send_many([{"task": n} for n in range(1, TASKS + 1)])
    worker = Worker(QUEUE, handle, concurrency=CONCURRENCY)
    dsn = demo.dsn()
    started = time.perf_counter()
    # The stage tells what happens; the worker's own log lines would only repeat it.
    worker_log = logging.getLogger("pgbroker.worker")
    level = worker_log.level
    worker_log.setLevel(logging.ERROR)
    try:
        event_loop.run(_run(demo, worker, dsn))
    finally:
        worker_log.setLevel(level)
    elapsed = time.perf_counter() - started
    demo.end_progress()
    stats = worker.stats
    demo.say(
        "",
        f"a Worker, {CONCURRENCY} in flight, handled {stats.completed:,} of {TASKS:,} tasks "
        f"in {elapsed:.2f} s ({stats.completed / elapsed:,.0f} msg/s)",
    )
    letters = queue.dead_letters()
    for letter in letters:
        why = (letter.headers or {}).get("x-pgbroker-dead-letter", {})
        demo.say(
            "",
            f"task {letter.message['task']} failed on every delivery and went to {DEAD_LETTER_QUEUE} "
            f"(pgbroker dlq list {QUEUE}):",
        )
        demo.say(
            "", f"  x-pgbroker-dead-letter: {json.dumps({k: why.get(k) for k in ('deliveries', 'error')})}"
        )
    waiting = queue.metrics().queue_length
    ok = (
        stats.completed == TASKS - 1
        and [letter.message for letter in letters] == [{"task": POISON}]
        and (letters[0].headers or {}).get("x-pgbroker-dead-letter", {}).get("deliveries") == MAX_DELIVERIES
        and waiting == 0
    )
    demo.ok = demo.ok and ok
    demo.say(
        "check",
        f"handled {stats.completed:,} + dead-lettered {len(letters)} + still queued {waiting} = {TASKS:,}: "
        + ("OK" if ok else "FAILED"),
    )


async def _run(demo: Demo, worker: Worker, dsn: str) -> None:
    async def watch() -> None:
        deadline = time.monotonic() + TIMEOUT_SECONDS
        stats = worker.stats
        while stats.completed + stats.dead_lettered < TASKS and time.monotonic() < deadline:
            demo.progress("workers", f"{stats.completed:,} / {TASKS:,}")
            await asyncio.sleep(0.05)
        worker.stop()

    watcher = asyncio.create_task(watch())
    await serve([worker], dsn=dsn, handle_signals=False)
    await watcher
