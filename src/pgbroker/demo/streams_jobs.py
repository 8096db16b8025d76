"""The demo's stage for streams and job features: one stream read in full by two consumer groups
(fan-out without copies), then a job queue where a high-priority job is read first, a duplicate
send (same dedup key) stores nothing, and a MessagePack body comes back as it went in.
"""

from __future__ import annotations

import time
from collections import Counter

from psycopg import sql

from pgbroker import _sql
from pgbroker.demo.stage import Demo
from pgbroker.streams._client import Stream

__all__ = ["streams_jobs_stage"]

STREAM = "demo_events"
GROUPS = ("billing", "audit")
EVENTS = 2_000
PARTITIONS = 4
READ_BATCH = 500

JOBS_QUEUE = "demo_jobs"
ROUTINE_JOBS = 3
URGENT_PRIORITY = 10
DEDUP_KEY = "invoice-42"
MSGPACK_BODY = {"invoice": 42, "pdf": b"%PDF-1.7\x00\xff"}  # bytes, which JSON cannot carry
_DEMO = _sql.queries("demo")


def streams_jobs_stage(demo: Demo) -> None:
    stream_ok = fan_out(demo)
    jobs_ok = jobs(demo)
    demo.ok = demo.ok and stream_ok and jobs_ok


def fan_out(demo: Demo) -> bool:
    """N events sent once; each group reads all N exactly once; the log holds N rows, not N per group."""
    stream = Stream(demo.broker, STREAM)
    # A stream from an earlier run has groups with cursors at its end: start afresh.
    stream.drop()
    stream.create(partitions=PARTITIONS)
    for group in GROUPS:
        stream.create_group(group, start="start")
    started = time.perf_counter()
    sent = stream.send_many([{"event": n} for n in range(1, EVENTS + 1)])
    elapsed = time.perf_counter() - started
    demo.say(
        "stream",
        f"{STREAM}: {PARTITIONS} partitions, groups {' and '.join(GROUPS)}; sent {len(sent):,} events once "
        f"(send_many) in {elapsed:.2f} s",
    )
    read: dict[str, Counter[int]] = {}
    for group in GROUPS:
        read[group] = _read_all(demo, stream, group)
    with demo.broker.connection() as conn:
        row = conn.execute(
            sql.SQL(_DEMO["demo_stream_stored"]).format(table=sql.Identifier(f"s_{STREAM}"))
        ).fetchone()
    stored = int(row[0]) if row else -1
    lags = {info.name: info.lag for info in stream.groups()}
    expected = Counter(sent)
    duplicates = sum(sum(counts.values()) - len(counts) for counts in read.values())
    ok = (
        stored == EVENTS
        and all(counts == expected for counts in read.values())
        and lags == dict.fromkeys(GROUPS, 0)
    )
    demo.say(
        "check",
        f"each group read all {EVENTS:,} once (duplicates {duplicates}) from {stored:,} stored rows; lag "
        + ", ".join(f"{group} {lags.get(group)}" for group in GROUPS)
        + (": OK" if ok else ": FAILED"),
    )
    return ok


def _read_all(demo: Demo, stream: Stream, group: str) -> Counter[int]:
    """One consumer reads the group to the end, acking each batch with the next read."""
    consumer = stream.consumer(group, name=f"demo-{group}")
    seen: Counter[int] = Counter()
    batches = 0
    started = time.perf_counter()
    # An empty read ends it: every send has committed, so a read finds all that is left.
    batch = consumer.read(READ_BATCH, wait=0.5)
    while batch:
        seen.update(message.id for message in batch)
        batches += 1
        if sum(seen.values()) >= EVENTS:
            consumer.ack(batch)
            break
        batch = consumer.ack_and_read(batch, READ_BATCH, wait=0.5)
    elapsed = time.perf_counter() - started
    consumer.release()
    demo.say(
        "",
        f"group {group} read {sum(seen.values()):,} events in {batches} batches (ack_and_read, "
        f"up to {READ_BATCH}): {elapsed:.2f} s",
    )
    return seen


def jobs(demo: Demo) -> bool:
    """Priorities, a dedup key and a MessagePack body on one queue, counted from its table."""
    broker = demo.broker
    # Dropping the queue frees its dedup keys, which an earlier run holds for 5 minutes.
    broker.drop_queue(JOBS_QUEUE)
    queue = broker.create_queue(JOBS_QUEUE)
    queue.send_many([{"job": "routine", "n": n} for n in range(1, ROUTINE_JOBS + 1)])
    urgent = queue.send({"job": "urgent"}, priority=URGENT_PRIORITY)
    first = queue.send({"invoice": 42}, dedup_key=DEDUP_KEY)
    stored_before = _stored(demo)
    again = queue.send({"invoice": 42}, dedup_key=DEDUP_KEY)
    stored_after = _stored(demo)
    packed = queue.send(MSGPACK_BODY, codec="msgpack")
    demo.say(
        "jobs",
        f"{JOBS_QUEUE}: {ROUTINE_JOBS} routine jobs, then 1 with priority {URGENT_PRIORITY}: msg_id {urgent}",
    )
    demo.say(
        "",
        f"dedup key {DEDUP_KEY} sent twice: msg_id {first}, then {again}; "
        f"{stored_before} queued before the duplicate, {stored_after} after",
    )
    messages = queue.read_many(10)
    queue.ack_many(messages)
    order = [m.msg_id for m in messages]
    body = next((m for m in messages if m.msg_id == packed), None)
    demo.say("", f"read_many(10) returned msg_ids {order}: the urgent one first")
    demo.say(
        "",
        f"msg_id {packed} went as MessagePack (codec='msgpack') and read back "
        + ("equal, bytes and all" if body is not None and body.message == MSGPACK_BODY else f"as {body}"),
    )
    ok = (
        order[:1] == [urgent]
        and order[1:] == sorted(order[1:])
        and again == first
        and stored_after == stored_before
        and len(order) == ROUTINE_JOBS + 3
        and body is not None
        and body.codec == "msgpack"
        and body.message == MSGPACK_BODY
        and _stored(demo) == 0
    )
    demo.say(
        "check",
        f"priority {URGENT_PRIORITY} read first; the duplicate returned msg_id {first} and stored nothing; "
        f"{len(order)} read and acked, 0 left: " + ("OK" if ok else "FAILED"),
    )
    return ok


def _stored(demo: Demo) -> int:
    # Counted straight from the queue table, not through pgbroker, so the check trusts nothing it checks.
    with demo.broker.connection() as conn:
        row = conn.execute(
            sql.SQL(_DEMO["demo_queue_stored"]).format(queue=sql.Identifier(f"q_{JOBS_QUEUE}"))
        ).fetchone()
    return int(row[0]) if row else -1
