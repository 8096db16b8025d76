"""Benchmark: what each codec costs, in stored bytes and in client throughput.

For one order-like message (an id, a name, three tags, a price) per codec: the bytes of the
codec's encoding, the size Postgres stores for ``message`` (pg_column_size of the jsonb, envelope
included), the encode and decode time in this process, and the sync client's send and consume
rates (send_many of --batch, then read_many of --batch + ack_many, one connection).

    python -m bench.codecs_bench [--dsn DSN] [--messages 20000] [--batch 100]

Without --dsn the DSN comes from DATABASE_URL, else the embedded cluster is used. The message
types are the tests' (tests/support/codec_types.py), so run it from the repository root.
"""

from __future__ import annotations

import argparse
import time
import timeit
import uuid
from typing import Any

from psycopg import sql
from tests.support.codec_types import AVRO, PROTOBUF, Order

from pgbroker import Broker, codecs
from pgbroker._db.dsn import resolve_dsn

HEADER = (
    f"{'codec':<40} {'bytes':>6} {'stored':>7} {'enc us':>7} {'dec us':>7} {'send/s':>8} {'consume/s':>10}"
)


def sample(name: str, n: int) -> Any:
    fields = {"id": n, "item": f"book-{n:08d}", "tags": ["paper", "fiction", "sale"], "price": 19.5}
    return Order(**fields) if name == PROTOBUF else fields


def measure(broker: Broker, name: str, messages: int, batch: int) -> str:
    codec = codecs.get(name)
    value = sample(name, 12345678)
    data = codec.encode(value)
    stored = codecs.to_stored(value, name)
    encode_us = min(timeit.repeat(lambda: codecs.to_stored(value, name), number=2000, repeat=3)) / 2000 * 1e6
    decode_us = min(timeit.repeat(lambda: codecs.from_stored(stored), number=2000, repeat=3)) / 2000 * 1e6
    queue = broker.create_queue(f"bench_codecs_{uuid.uuid4().hex[:8]}")
    try:
        t0 = time.perf_counter()
        for start in range(0, messages, batch):
            queue.send_many([sample(name, n) for n in range(start, start + batch)], codec=name)
        send_rate = messages / (time.perf_counter() - t0)
        with broker.connection() as conn:
            size = sql.SQL("SELECT avg(pg_column_size(message)) FROM pgmq.{}")
            row = conn.execute(size.format(sql.Identifier(f"q_{queue.name}"))).fetchone()
        stored_bytes = float(row[0]) if row and row[0] is not None else 0.0
        t0 = time.perf_counter()
        consumed = 0
        while found := queue.read_many(batch, vt=60):
            assert all(m.codec == codec.name for m in found)
            consumed += len(queue.ack_many(found, archive=False))
        consume_rate = consumed / (time.perf_counter() - t0)
    finally:
        broker.drop_queue(queue.name)
    return (
        f"{name:<40} {len(data):>6} {stored_bytes:>7.0f} {encode_us:>7.1f} {decode_us:>7.1f} "
        f"{send_rate:>8,.0f} {consume_rate:>10,.0f}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--dsn", help="server to use (default: DATABASE_URL, else the embedded cluster)")
    parser.add_argument("--messages", type=int, default=20_000, help="messages per codec (default 20000)")
    parser.add_argument("--batch", type=int, default=100, help="messages per send and read (default 100)")
    args = parser.parse_args(argv)
    with Broker(resolve_dsn(args.dsn), max_connections=1) as broker:
        broker.install()
        with broker.connection() as conn:
            row = conn.execute(
                "SELECT current_setting('server_version'), current_setting('synchronous_commit'),"
                " current_setting('fsync')"
            ).fetchone()
        print(
            f"PostgreSQL {row[0] if row else '?'}, synchronous_commit={row[1] if row else '?'}, "
            f"fsync={row[2] if row else '?'}; {args.messages:,} messages a codec, batches of {args.batch}"
        )
        measure(broker, "json", min(args.messages, 5_000), args.batch)  # warm-up: plans, pool, caches
        print(HEADER)
        for name in ("json", "msgpack", PROTOBUF, AVRO):
            print(measure(broker, name, args.messages, args.batch))


if __name__ == "__main__":
    main()
