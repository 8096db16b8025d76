"""A stream group's positions and the stream's watermark under a transaction that holds back the
xmin horizon (issue 25): the stream's own tables keep no more dead tuples after 4N messages consumed
than after N, whether a backlog is drained or the consumer keeps up with a producer, and the
positions and watermarks, kept insert-only in a ring of two child tables, survive its rotation."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
from psycopg import sql

from pgbroker._db.install import install
from tests.support.dev_schema import install_dev
from tests.support.streams import Batch, ack, drain, read, send

Conn = psycopg.Connection[Any]


def dead_tuples(conn: Conn, stream: str) -> int:
    """Dead tuples of every table of the stream engine and of the stream's log, counted by pgstattuple
    (every row version a writer replaced or deleted, whether or not vacuum may remove it yet)."""
    row = conn.execute(
        "SELECT sum((pgstattuple(c.oid)).dead_tuple_count) FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'pgbroker' AND c.relkind = 'r'"
        "   AND (c.relname LIKE 'stream%%' OR c.relname LIKE %s)",
        (f"s\\_{stream}%",),
    ).fetchone()
    assert row is not None
    return int(row[0])


def consume(conn: Conn, stream: str, messages: int, batch: Batch | None) -> Batch | None:
    """Read and ack ``messages`` in batches of 100 with stream_consume, as a worker loop does:
    each call acks the previous batch and reads the next."""
    done = 0
    while done < messages:
        parts, epochs, last = batch.ack_args() if batch else (None, None, None)
        batch = Batch(
            conn.execute(
                "SELECT * FROM pgbroker.stream_consume(%s, 'g', 'c', 100, 30, %s, %s, %s)",
                (stream, parts, epochs, last),
            ).fetchall()
        )
        assert batch.rows, f"the stream ran dry after {done} messages"
        done += len(batch.rows)
    return batch


def test_a_pinned_xmin_keeps_dead_tuples_flat_as_messages_are_consumed(dsn: str, conn: Conn) -> None:
    n = 1000
    conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    conn.execute("SELECT pgbroker.create_stream('clicks', 4)")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'g', 'start')")
    send(conn, "clicks", [{"n": i} for i in range(5 * n + 100)], [f"k{i % 50}" for i in range(5 * n + 100)])
    batch = consume(conn, "clicks", 100, None)  # the consumer's lease taken, the safe id advanced
    conn.execute("VACUUM")
    with psycopg.connect(dsn, autocommit=True) as pin:
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT 1")  # the snapshot is taken: its xmin holds every version from here on
        start = dead_tuples(conn, "clicks")
        batch = consume(conn, "clicks", n, batch)
        after_n = dead_tuples(conn, "clicks") - start
        for _ in range(3):  # the ring rotates meanwhile: TRUNCATE leaves no dead tuple either
            batch = consume(conn, "clicks", n, batch)
            assert conn.execute("SELECT pgbroker._stream_positions_rotate(0)").fetchone() == (True,)
        after_4n = dead_tuples(conn, "clicks") - start
        pin.execute("ROLLBACK")
    print(f"dead tuples after {n} messages: {after_n}; after {4 * n}: {after_4n}")
    assert after_4n <= after_n + 2, (after_n, after_4n)  # flat, not 4x


def test_a_pinned_xmin_keeps_dead_tuples_flat_while_a_consumer_keeps_up(dsn: str, conn: Conn) -> None:
    # Every read finds the safe id behind the newest send and moves it: the watermark moves about
    # once a batch (it was a row updated in place: a dead version a batch).
    rounds = 40
    conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    conn.execute("SELECT pgbroker.create_stream('clicks', 4)")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'g', 'start')")
    batch = None

    def keep_up(times: int) -> None:
        nonlocal batch
        for _ in range(times):
            send(conn, "clicks", [{"n": i} for i in range(25)], [f"k{i}" for i in range(25)])
            batch = consume(conn, "clicks", 25, batch)

    keep_up(1)
    conn.execute("VACUUM")
    with psycopg.connect(dsn, autocommit=True) as pin:
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT 1")
        start = dead_tuples(conn, "clicks")
        keep_up(rounds)
        after_n = dead_tuples(conn, "clicks") - start
        for _ in range(3):
            keep_up(rounds)
            assert conn.execute("SELECT pgbroker._stream_positions_rotate(0)").fetchone() == (True,)
        after_4n = dead_tuples(conn, "clicks") - start
        pin.execute("ROLLBACK")
    print(f"dead tuples after {rounds} batches kept up with: {after_n}; after {4 * rounds}: {after_4n}")
    assert after_4n <= after_n + 2, (after_n, after_4n)
    # Nothing was skipped: the next read finds only what is sent after.
    ids = send(conn, "clicks", [{"n": 0}], ["k0"])
    last = consume(conn, "clicks", 1, batch)
    assert last is not None
    assert last.ids == ids


def test_rotation_carries_each_stream_newest_watermark(conn: Conn) -> None:
    for stream in ("clicks", "views"):
        conn.execute("SELECT pgbroker.create_stream(%s, 2)", (stream,))
        conn.execute("SELECT pgbroker.create_stream_group(%s, 'g', 'start')", (stream,))
    for n in range(5):  # a watermark row a read, each read moving the safe id
        send(conn, "clicks", [{"n": n}])
        drain(conn, "clicks", "g", "c")
    assert ring(conn, "stream_watermark") == (7, 0)  # one a stream made, five advances of clicks
    safe = conn.execute("SELECT * FROM pgbroker.spark_stream_bound('clicks')").fetchone()
    assert conn.execute("SELECT pgbroker._stream_positions_rotate(0)").fetchone() == (True,)  # moves on
    send(conn, "views", [{"n": 0}])
    drain(conn, "views", "g", "c")
    assert ring(conn, "stream_watermark") == (7, 1)
    assert conn.execute("SELECT pgbroker._stream_positions_rotate(0)").fetchone() == (True,)
    assert ring(conn, "stream_watermark") == (0, 2)  # clicks' newest carried over, views' already there
    assert conn.execute("SELECT * FROM pgbroker.spark_stream_bound('clicks')").fetchone() == safe
    ids = send(conn, "clicks", [{"n": n} for n in range(3)])
    assert sorted(drain(conn, "clicks", "g", "c")) == ids


def positions(conn: Conn) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT group_name, partition, acked_id, delivered_id FROM pgbroker.stream_lag('clicks')"
    ).fetchall()


def ring(conn: Conn, table: str = "stream_position") -> tuple[int, int]:
    """Rows in each child table of the ring: positions, or watermarks (stream_watermark)."""
    row = conn.execute(
        sql.SQL("SELECT (SELECT count(*) FROM {}), (SELECT count(*) FROM {})").format(
            sql.Identifier("pgbroker", f"{table}_0"), sql.Identifier("pgbroker", f"{table}_1")
        )
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_rotation_carries_every_position_and_empties_the_other_child(conn: Conn) -> None:
    conn.execute("SELECT pgbroker.create_stream('clicks', 4)")
    for group in ("a", "b"):
        conn.execute("SELECT pgbroker.create_stream_group('clicks', %s, 'start')", (group,))
    ids = send(conn, "clicks", [{"n": i} for i in range(1000)])
    seen = drain(conn, "clicks", "a", "c", qty=50)
    held = read(conn, "clicks", "b", "c", qty=40)  # b: read, not acked (delivered ahead of acked)
    before = positions(conn)
    assert ring(conn)[1] == 0
    assert ring(conn)[0] > 8
    # Nothing in the other child: the sequence moves on, new positions go to child 1.
    assert conn.execute("SELECT pgbroker._stream_positions_rotate(0)").fetchone() == (True,)
    assert positions(conn) == before
    assert ring(conn)[1] == 0
    ack(conn, "clicks", "b", "c", held)  # appended to child 1
    assert ring(conn)[1] > 0
    after_ack = positions(conn)
    # Child 0 emptied: each partition's newest row there is carried over first.
    assert conn.execute("SELECT pgbroker._stream_positions_rotate(0)").fetchone() == (True,)
    assert positions(conn) == after_ack
    assert ring(conn)[0] == 0
    assert ring(conn)[1] <= 8  # one row a group and partition
    # Twice more around the ring, and both groups read on from where they were.
    for _ in range(2):
        assert conn.execute("SELECT pgbroker._stream_positions_rotate(0)").fetchone() == (True,)
    assert positions(conn) == after_ack
    more = send(conn, "clicks", [{"n": i} for i in range(100)])
    assert sorted(seen) == ids
    assert sorted(drain(conn, "clicks", "a", "c", qty=50)) == more
    assert sorted(drain(conn, "clicks", "b", "c", qty=50)) == sorted(set(ids + more) - set(held.ids))


def test_rotation_waits_for_no_writer_past_its_lock_timeout(dsn: str, conn: Conn) -> None:
    # A consumer in the middle of a read holds its cursor rows: the rotation gives up (and the
    # consumer's position, written after, is the newest).
    conn.execute("SELECT pgbroker.create_stream('clicks', 2)")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'g', 'start')")
    send(conn, "clicks", [{"n": i} for i in range(100)])
    assert conn.execute("SELECT pgbroker._stream_positions_rotate(0)").fetchone() == (True,)
    first = read(conn, "clicks", "g", "c", qty=10)
    with psycopg.connect(dsn) as reader:
        batch = Batch(
            reader.execute(
                "SELECT * FROM pgbroker.stream_consume('clicks', 'g', 'c', 10, 30, %s, %s, %s)",
                first.ack_args(),
            ).fetchall()
        )
        assert conn.execute("SELECT pgbroker._stream_positions_rotate(0)").fetchone() == (False,)
        reader.commit()
    for _ in range(2):  # child 0 emptied (its rows all older), then child 1, carried into child 0
        assert conn.execute("SELECT pgbroker._stream_positions_rotate(0)").fetchone() == (True,)
    assert ring(conn) == (2, 0)  # the newest of each partition, nothing else
    acked = dict((p, a) for _, p, a, _ in positions(conn))
    parts, _, last = first.ack_args()
    assert [acked[p] for p in parts] == last
    delivered = {p: d for _, p, _, d in positions(conn)}
    bparts, _, blast = batch.ack_args()
    assert [delivered[p] for p in bparts] == blast


def test_an_upgrade_keeps_every_group_position(empty_dsn: str) -> None:
    # A database from before insert-only positions: its cursor rows' positions move to the ring.
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        install_dev(conn)
        conn.execute("SELECT pgbroker.create_stream('clicks', 4)")
        for group in ("a", "b"):
            conn.execute("SELECT pgbroker.create_stream_group('clicks', %s, 'start')", (group,))
        ids = send(conn, "clicks", [{"n": i} for i in range(200)])
        first = read(conn, "clicks", "a", "c", qty=60)
        ack(conn, "clicks", "a", "c", first)
        held = read(conn, "clicks", "a", "c", qty=40)  # delivered, not acked
        before = positions(conn)
        owners = conn.execute(
            "SELECT partition, owner, epoch FROM pgbroker.stream_cursor ORDER BY 1"
        ).fetchall()
        install(conn)
        assert positions(conn) == before
        after = conn.execute(
            "SELECT partition, owner, epoch FROM pgbroker.stream_cursor ORDER BY 1"
        ).fetchall()
        assert after == owners
        assert set(ack(conn, "clicks", "a", "c", held).values()) == {True}
        assert sorted(drain(conn, "clicks", "a", "c")) == sorted(set(ids) - set(first.ids) - set(held.ids))
        assert sorted(drain(conn, "clicks", "b", "c")) == ids


def test_rotations_among_busy_consumers_lose_no_position(dsn: str, conn: Conn) -> None:
    # Four groups, a consumer each, read and ack as fast as they can while the ring rotates over
    # and over: each group handles every message once (a position lost or gone back would hand a
    # batch out again), and the rotations get their lock (the consumers' transactions are short).
    # (A group each: consumers joining one group at once may be handed a batch twice, rotation or
    # not; that is another matter.)
    total = 15_000
    conn.execute("SELECT pgbroker.create_stream('clicks', 4)")
    for i in range(4):
        conn.execute("SELECT pgbroker.create_stream_group('clicks', %s, 'start')", (f"g{i}",))
    ids = send(conn, "clicks", [{"n": i} for i in range(total)], [f"k{i % 100}" for i in range(total)])
    handled: dict[str, list[int]] = {f"g{i}": [] for i in range(4)}
    done = threading.Barrier(5)
    deadline = time.monotonic() + 120  # a partition whose position were lost would never be read again

    errors: list[BaseException] = []

    def consumer(group: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                batch: Batch | None = None
                while len(handled[group]) < total and time.monotonic() < deadline:
                    parts, epochs, last = batch.ack_args() if batch and batch.rows else (None, None, None)
                    batch = Batch(
                        c.execute(
                            "SELECT * FROM pgbroker.stream_consume('clicks', %s, 'c', 50, 30, %s, %s, %s)",
                            (group, parts, epochs, last),
                        ).fetchall()
                    )
                    handled[group].extend(batch.ids)
        except BaseException as exc:  # reported by the test, after the others are done
            errors.append(exc)
        finally:
            done.wait()

    threads = [threading.Thread(target=consumer, args=(group,)) for group in handled]
    for t in threads:
        t.start()
    rotations = []
    while done.n_waiting < 4:
        rotations.append(conn.execute("SELECT pgbroker._stream_positions_rotate(0)").fetchone() == (True,))
        time.sleep(0.005)
    done.wait()
    for t in threads:
        t.join()
    assert not errors, errors
    print(f"{sum(rotations)} of {len(rotations)} rotations had their lock")
    for group, seen in handled.items():
        assert sorted(seen) == ids, group  # each once
    assert sum(rotations) >= len(rotations) // 2
