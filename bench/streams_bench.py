"""Streams against pgmq's queues, side by side on one server in one run.

    python -m bench.streams_bench [--rounds 2] [--seconds 4] [--backlog 1000000] [--dsn DSN]
                                  [--method pgbench|python] [--clients 15] [--consumers 1]

By default the consume and send steps run pgbench scripts (bench/streams_pgbench.py): C clients
that cost the machine almost nothing, so the rates are the database's work, as in
docs/performance.md's queue scenarios. --method python runs them as below with Python processes.

Steps (each in alternating rounds, A B then B A, so that the machine's load weighs on both):
- consume: one consumer process draining a backlog for --seconds. pgbroker: one consumer of
  one group, pgbroker.stream_consume with batches of 100 (the previous batch acked in the same
  call); pgmq: pgmq.read of 10 then pgmq.delete of their ids (two calls, as its clients do).
- fan-out: four groups on the same stream, one consumer process each, at the same time; each
  group's rate against the single group's of the same round.
- send: four producer processes for --seconds; pgbroker.stream_send_many of 10 against
  pgmq.send_batch of 10; messages a second.
- latency: an idle stream made with notify; a consumer waiting in StreamConsumer.read(wait=...)
  (LISTEN, polling as the fallback); one message sent every 50 ms; time from just before the
  send to the read returning it, p50 and p99.
With no --dsn a private cluster is made in a temporary directory on disk (initdb defaults,
synchronous_commit on), and removed at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import Any

from bench import streams_pgbench
from bench.harness import Server, alternating_rounds, connect, mean_rate, percentile
from pgbroker import Broker
from pgbroker._db.install import install
from pgbroker.streams._client import Stream

PAYLOAD = '{"order": 12345, "note": "x"}'
ctx = multiprocessing.get_context("spawn")


# -- the processes (module level, for spawn) --------------------------------------------------------


def _stream_consumer(dsn: str, stream: str, group: str, seconds: float, out: Any) -> None:
    with connect(dsn, prepare=True) as conn:
        done, pending_count, last = 0, 0, time.perf_counter() + seconds
        pending: tuple[list[int] | None, list[int] | None, list[int] | None] = (None, None, None)
        started = time.perf_counter()
        while time.perf_counter() < last:
            rows = conn.execute(
                "SELECT partition, id, epoch FROM pgbroker.stream_consume(%s, %s, 'c', 100, 30,"
                " %s::integer[], %s::bigint[], %s::bigint[])",
                (stream, group, *pending),
            ).fetchall()
            done += pending_count  # acked by this call
            if not rows:
                break
            top: dict[int, tuple[int, int]] = {}
            for partition, msg_id, epoch in rows:
                top[partition] = (epoch, max(msg_id, top.get(partition, (0, 0))[1]))
            keys = sorted(top)
            pending = (keys, [top[k][0] for k in keys], [top[k][1] for k in keys])
            pending_count = len(rows)
        out.put(done / (time.perf_counter() - started))


def _pgmq_consumer(dsn: str, queue: str, seconds: float, out: Any) -> None:
    with connect(dsn, prepare=True) as conn:
        done, last = 0, time.perf_counter() + seconds
        started = time.perf_counter()
        while time.perf_counter() < last:
            ids = [r[0] for r in conn.execute("SELECT msg_id FROM pgmq.read(%s, 30, 10)", (queue,))]
            if not ids:
                break
            conn.execute("SELECT pgmq.delete(%s, %s::bigint[])", (queue, ids))
            done += len(ids)
        out.put(done / (time.perf_counter() - started))


# The send of each system, a batch of 10 (the stream's and pgmq's, as their clients call them).
_SENDS = {
    "stream": "SELECT pgbroker.stream_send_many(%s, %s::jsonb[])",
    "pgmq": "SELECT pgmq.send_batch(%s, %s::jsonb[])",
}


def _producer(dsn: str, system: str, name: str, seconds: float, out: Any) -> None:
    with connect(dsn, prepare=True) as conn:
        batch = [PAYLOAD] * 10
        sent, last = 0, time.perf_counter() + seconds
        while time.perf_counter() < last:
            conn.execute(_SENDS[system], (name, batch))
            sent += 10
        out.put(sent / seconds)


def _in_processes(target: Callable[..., None], args_each: list[tuple[Any, ...]]) -> list[float]:
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, out)) for args in args_each]
    for p in procs:
        p.start()
    rates = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return rates


# -- the steps --------------------------------------------------------------------------------------


def _fill_stream(dsn: str, stream: str, groups: list[str], backlog: int) -> None:
    with connect(dsn) as conn:
        conn.execute("SELECT pgbroker.create_stream(%s, 4)", (stream,))
        for group in groups:
            conn.execute("SELECT pgbroker.create_stream_group(%s, %s, 'start')", (stream, group))
        for _ in range(0, backlog, 10_000):
            conn.execute(
                "SELECT count(*) FROM pgbroker.stream_send_many(%s, array_fill(%s::jsonb, ARRAY[10000]))",
                (stream, PAYLOAD),
            )
        conn.execute("VACUUM ANALYZE")


def _fill_pgmq(dsn: str, queue: str, backlog: int) -> None:
    with connect(dsn) as conn:
        conn.execute("SELECT pgmq.create(%s)", (queue,))
        conn.execute(
            f"INSERT INTO pgmq.q_{queue} (vt, message) SELECT now(), %s::jsonb FROM generate_series(1, %s)",  # noqa: S608 - a name made here
            (PAYLOAD, backlog),
        )
        conn.execute("VACUUM ANALYZE")


def consume_step(broker_dsn: str, pgmq_dsn: str, args: argparse.Namespace) -> dict[str, float | None]:
    rates: dict[str, list[float | None]] = {
        "pgbroker stream, 1 group": [],
        "pgmq read 10 + delete": [],
        "pgbroker stream, each of 4 groups": [],
    }
    for n, system in alternating_rounds(["stream", "pgmq", "fanout"], args.rounds):
        if system == "stream":
            _fill_stream(broker_dsn, f"c{n}", ["g"], args.backlog)
            (rate,) = _in_processes(_stream_consumer, [(broker_dsn, f"c{n}", "g", args.seconds)])
            rates["pgbroker stream, 1 group"].append(rate)
        elif system == "pgmq":
            _fill_pgmq(pgmq_dsn, f"c{n}", args.backlog)
            (rate,) = _in_processes(_pgmq_consumer, [(pgmq_dsn, f"c{n}", args.seconds)])
            rates["pgmq read 10 + delete"].append(rate)
        else:
            groups = [f"g{i}" for i in range(4)]
            _fill_stream(broker_dsn, f"f{n}", groups, args.backlog)
            each = _in_processes(_stream_consumer, [(broker_dsn, f"f{n}", g, args.seconds) for g in groups])
            rate = sum(each) / len(each)
            rates["pgbroker stream, each of 4 groups"].append(rate)
        print(f"  consume round {n + 1}: {system:<8} {rate:10.0f} msg/s", flush=True)
    return {k: mean_rate(v) for k, v in rates.items()}


def consume_step_pgbench(broker_dsn: str, pgmq_dsn: str, args: argparse.Namespace) -> dict[str, float | None]:
    """As consume_step, with pgbench clients (bench/streams_pgbench.py) in place of Python processes."""
    rates: dict[str, list[float | None]] = {
        "pgbroker stream, 1 group": [],
        "pgmq read 10 + delete": [],
        "pgbroker stream, each of 4 groups": [],
    }
    per_group = args.consumers
    for n, system in alternating_rounds(["stream", "pgmq", "fanout"], args.rounds):
        if system == "pgmq":
            _fill_pgmq(pgmq_dsn, f"c{n}", args.backlog)
            streams_pgbench.run_pgbench(
                pgmq_dsn, streams_pgbench.pgmq_consume_script(f"c{n}"), 1, args.seconds
            )
            rate = (args.backlog - streams_pgbench.pgmq_length(pgmq_dsn, f"c{n}")) / args.seconds
            rates["pgmq read 10 + delete"].append(rate)
        else:
            groups = 1 if system == "stream" else 4
            prefix = "one" if groups == 1 else "g"
            names = [f"{prefix}{i}" for i in range(groups)]
            _fill_stream(broker_dsn, f"{system}{n}", names, args.backlog)
            script = streams_pgbench.stream_consume_script(f"{system}{n}", prefix, groups)
            streams_pgbench.run_pgbench(broker_dsn, script, groups * per_group, args.seconds)
            each = [streams_pgbench.stream_acked(broker_dsn, f"{system}{n}", g) for g in names]
            if max(each) >= args.backlog:
                print(f"  warning: a group drained the whole backlog ({args.backlog:,}): raise --backlog")
            rate = sum(each) / len(each) / args.seconds
            rates["pgbroker stream, 1 group" if groups == 1 else "pgbroker stream, each of 4 groups"].append(
                rate
            )
        print(f"  consume round {n + 1}: {system:<8} {rate:10.0f} msg/s", flush=True)
    return {k: mean_rate(v) for k, v in rates.items()}


def send_step_pgbench(broker_dsn: str, pgmq_dsn: str, args: argparse.Namespace) -> dict[str, float | None]:
    """As send_step, with --clients pgbench clients sending batches of 10."""
    rates: dict[str, list[float | None]] = {
        "pgbroker stream_send_many of 10": [],
        "pgmq send_batch of 10": [],
    }
    for n, system in alternating_rounds(["stream", "pgmq"], args.rounds):
        dsn = broker_dsn if system == "stream" else pgmq_dsn
        create = "SELECT pgbroker.create_stream(%s, 4)" if system == "stream" else "SELECT pgmq.create(%s)"
        with connect(dsn) as conn:
            conn.execute(create, (f"s{n}",))
        script = streams_pgbench.send_script(system, f"s{n}", PAYLOAD)
        rate = streams_pgbench.run_pgbench(dsn, script, args.clients, args.seconds) * 10 / args.seconds
        rates["pgbroker stream_send_many of 10" if system == "stream" else "pgmq send_batch of 10"].append(
            rate
        )
        print(f"  send round {n + 1}: {system:<8} {rate:10.0f} msg/s", flush=True)
    return {k: mean_rate(v) for k, v in rates.items()}


def send_step(broker_dsn: str, pgmq_dsn: str, args: argparse.Namespace) -> dict[str, float | None]:
    rates: dict[str, list[float | None]] = {
        "pgbroker stream_send_many of 10": [],
        "pgmq send_batch of 10": [],
    }
    for n, system in alternating_rounds(["stream", "pgmq"], args.rounds):
        if system == "stream":
            with connect(broker_dsn) as conn:
                conn.execute("SELECT pgbroker.create_stream(%s, 4)", (f"s{n}",))
            rate = sum(
                _in_processes(_producer, [(broker_dsn, "stream", f"s{n}", args.seconds)] * args.producers)
            )
            rates["pgbroker stream_send_many of 10"].append(rate)
        else:
            with connect(pgmq_dsn) as conn:
                conn.execute("SELECT pgmq.create(%s)", (f"s{n}",))
            rate = sum(_in_processes(_producer, [(pgmq_dsn, "pgmq", f"s{n}", args.seconds)] * args.producers))
            rates["pgmq send_batch of 10"].append(rate)
        print(f"  send round {n + 1}: {system:<8} {rate:10.0f} msg/s", flush=True)
    return {k: mean_rate(v) for k, v in rates.items()}


def latency_step(broker_dsn: str, samples: int) -> tuple[float | None, float | None]:
    with Broker(broker_dsn, max_connections=4) as broker:
        stream = Stream(broker, "idle")
        stream.create(partitions=1, notify=True)
        stream.create_group("g")
        consumer = stream.consumer("g")
        consumer.read()  # takes the partition
        sent_at: dict[int, float] = {}
        latencies: list[float] = []
        stop = threading.Event()

        def consume() -> None:
            while not stop.is_set():
                batch = consumer.read(10, wait=1.0)
                now = time.perf_counter()
                for m in batch:
                    latencies.append(now - sent_at[m.message["n"]])
                if batch:
                    consumer.ack(batch)

        reader = threading.Thread(target=consume)
        reader.start()
        time.sleep(0.5)
        for n in range(samples):
            sent_at[n] = time.perf_counter()
            stream.send({"n": n})
            time.sleep(0.05)
        time.sleep(1.0)
        stop.set()
        reader.join()
    ms = [s * 1000 for s in latencies]
    return percentile(ms, 50), percentile(ms, 99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--producers", type=int, default=4, help="producer processes of the send step (4)")
    parser.add_argument(
        "--method", choices=["pgbench", "python"], default="pgbench",
        help="clients: pgbench scripts (default; the server's work) or Python processes (the client's too)",
    )  # fmt: skip
    parser.add_argument("--clients", type=int, default=15, help="pgbench clients of the send step (15)")
    parser.add_argument("--consumers", type=int, default=1, help="pgbench consumers per group (1)")
    parser.add_argument("--dsn", help="a server to run on (a superuser); default: a private cluster")
    args = parser.parse_args()
    with Server(args.dsn, None) as server:
        with connect(server.admin_dsn) as admin:
            for db in ("streams_bench_pgbroker", "streams_bench_pgmq"):
                admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
                admin.execute(f"CREATE DATABASE {db}")
        broker_dsn, pgmq_dsn = server.dsn_for("streams_bench_pgbroker"), server.dsn_for("streams_bench_pgmq")
        from tests.compat.reference import install_reference

        with connect(broker_dsn) as conn:
            install(conn)
        with connect(pgmq_dsn) as conn:
            install_reference(conn)
        settings = server.settings()
        print(
            f"server: {server.description}; {settings.get('version', '')[:40]}; "
            f"synchronous_commit={settings.get('synchronous_commit')} fsync={settings.get('fsync')}"
        )
        with open("/proc/loadavg") as f:
            print(f"load average at start: {f.read().split()[:3]}")
        print(f"consume (backlog of {args.backlog:,})")
        pgbench = args.method == "pgbench"
        consume = (consume_step_pgbench if pgbench else consume_step)(broker_dsn, pgmq_dsn, args)
        senders = f"{args.clients} pgbench clients" if pgbench else f"{args.producers} producer processes"
        print(f"send ({senders})")
        send = (send_step_pgbench if pgbench else send_step)(broker_dsn, pgmq_dsn, args)
        print("latency (idle stream, notify)")
        p50, p99 = latency_step(broker_dsn, args.samples)
        with connect(server.admin_dsn) as admin:
            for db in ("streams_bench_pgbroker", "streams_bench_pgmq"):
                admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a and b else "-"

    one, pgmq_read = consume["pgbroker stream, 1 group"], consume["pgmq read 10 + delete"]
    four = consume["pgbroker stream, each of 4 groups"]
    sent, pgmq_sent = send["pgbroker stream_send_many of 10"], send["pgmq send_batch of 10"]
    print("\n| measure | pgbroker | reference | ratio | target |")
    print("|---|---|---|---|---|")
    print(
        f"| consume, one group, batch 100 vs pgmq read 10 + delete (msg/s) | {one or 0:,.0f} | "
        f"{pgmq_read or 0:,.0f} | {ratio(one, pgmq_read)} | >= 5x |"
    )
    print(
        f"| consume, each of four groups vs one group (msg/s) | {four or 0:,.0f} | {one or 0:,.0f} | "
        f"{ratio(four, one)} | >= 0.8x |"
    )
    print(
        f"| send, {senders}, batches of 10 vs pgmq send_batch of 10 (msg/s) | "
        f"{sent or 0:,.0f} | "
        f"{pgmq_sent or 0:,.0f} | {ratio(sent, pgmq_sent)} | >= 1.3x |"
    )
    print(
        f"| send -> read, idle stream, p50 / p99 (ms) | {p50 or 0:.1f} / {p99 or 0:.1f} | | | p50 < 20 ms |"
    )


if __name__ == "__main__":
    main()
