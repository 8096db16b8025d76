"""The stream engine's SQL (sql/functions/92_streams.sql), one session or a few interleaved: sends
only insert, groups read every committed message once in order per key, a late commit is never
skipped, acks are fenced by the partition's epoch, failures go to the retry queue under its
policy, retention truncates child tables and leaves no dead tuple."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import random
import signal
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from pgbroker.embedded import EmbeddedPostgres
from tests.support.replication import promote, wait_caught_up
from tests.support.streams import Batch, ack, drain, read, send

Conn = psycopg.Connection[Any]


def make_stream(conn: Conn, name: str = "clicks", partitions: int = 4, **settings: Any) -> None:
    args = ", ".join(f"{k} => %({k})s" for k in settings)
    conn.execute(
        f"SELECT pgbroker.create_stream(%(name)s, %(partitions)s{', ' + args if args else ''})",
        {"name": name, "partitions": partitions, **settings},
    )


def make_group(conn: Conn, group: str, start: str = "start", stream: str = "clicks") -> None:
    conn.execute("SELECT pgbroker.create_stream_group(%s, %s, %s)", (stream, group, start))


def test_a_group_reads_every_message_once_in_order_per_key(conn: Conn) -> None:
    make_stream(conn)
    make_group(conn, "g")
    keys = [f"k{i % 7}" for i in range(300)]
    ids = send(conn, "clicks", [{"n": i, "k": k} for i, k in enumerate(keys)], keys)
    seen = drain(conn, "clicks", "g", "c1", qty=50)
    assert sorted(seen) == ids
    rows = conn.execute("SELECT id, key, partition FROM pgbroker.s_clicks").fetchall()
    by_id = {r[0]: r for r in rows}
    for key in set(keys):  # one partition per key, read in send order
        order = [i for i in seen if by_id[i][1] == key]
        assert order == sorted(order)
        assert len({by_id[i][2] for i in order}) == 1
    assert read(conn, "clicks", "g", "c1").rows == []


def test_sends_carry_headers_and_keys(conn: Conn) -> None:
    make_stream(conn, partitions=1)
    make_group(conn, "g")
    conn.execute(
        "SELECT pgbroker.stream_send('clicks', %s, %s, 'user-1')", (Jsonb({"a": 1}), Jsonb({"h": "v"}))
    )
    (row,) = read(conn, "clicks", "g", "c").rows
    assert (row[3], row[5], row[6]) == ("user-1", {"h": "v"}, {"a": 1})


def test_groups_start_at_the_start_the_end_or_a_time(conn: Conn) -> None:
    make_stream(conn)
    send(conn, "clicks", [{"n": 1}, {"n": 2}])
    conn.execute("SELECT pg_sleep(0.05)")
    middle = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
    conn.execute("SELECT pg_sleep(0.05)")
    send(conn, "clicks", [{"n": 3}])
    make_group(conn, "from_start", "start")
    make_group(conn, "from_end", "end")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'from_time', 'time', %s)", (middle,))
    send(conn, "clicks", [{"n": 4}])

    def numbers(group: str) -> list[int]:
        msgs = [r[6]["n"] for r in read(conn, "clicks", group, "c").rows]
        return sorted(msgs)

    assert numbers("from_start") == [1, 2, 3, 4]
    assert numbers("from_end") == [4]
    assert numbers("from_time") == [3, 4]


def test_a_late_commit_is_never_skipped(dsn: str, conn: Conn) -> None:
    """A send that took a low id and commits after a higher id was committed and could be read:
    reads stop below it until it commits, then deliver it."""
    make_stream(conn, partitions=1)
    make_group(conn, "g")
    with psycopg.connect(dsn) as slow, psycopg.connect(dsn, autocommit=True) as fast:
        (late,) = send(slow, "clicks", [{"n": "late"}])  # open transaction
        (early,) = send(fast, "clicks", [{"n": "early"}])
        assert late < early
        for _ in range(3):
            assert read(conn, "clicks", "g", "c").rows == []
        slow.commit()
    batch = read(conn, "clicks", "g", "c")
    assert batch.ids == [late, early]
    ack(conn, "clicks", "g", "c", batch)
    assert conn.execute("SELECT acked_id FROM pgbroker.stream_lag('clicks')").fetchone() == (early,)


def test_a_rolled_back_send_does_not_hold_the_stream(dsn: str, conn: Conn) -> None:
    make_stream(conn, partitions=1)
    make_group(conn, "g")
    with psycopg.connect(dsn) as other:
        send(other, "clicks", [{"n": "gone"}])
        ids = send(conn, "clicks", [{"n": "kept"}])
        other.rollback()
    assert drain(conn, "clicks", "g", "c") == ids


def test_a_long_transaction_elsewhere_does_not_hold_the_stream(dsn: str, conn: Conn) -> None:
    make_stream(conn, partitions=1)
    make_group(conn, "g")
    conn.execute("CREATE TABLE other (x int)")
    with psycopg.connect(dsn) as other:
        other.execute("INSERT INTO other VALUES (1)")  # holds an xid, writes no stream
        ids = send(conn, "clicks", [{"n": 1}])
        assert drain(conn, "clicks", "g", "c") == ids


def test_reads_outside_read_committed_are_refused(dsn: str, conn: Conn) -> None:
    make_stream(conn)
    make_group(conn, "g")
    with psycopg.connect(dsn) as rr:
        rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.Error, match="READ COMMITTED") as err:
            read(rr, "clicks", "g", "c")
        assert err.value.sqlstate == "PB007"


def test_reading_again_before_acking_hands_out_the_next_messages(conn: Conn) -> None:
    make_stream(conn, partitions=1)
    make_group(conn, "g")
    ids = send(conn, "clicks", [{"n": i} for i in range(10)])
    first = read(conn, "clicks", "g", "c", qty=4)
    second = read(conn, "clicks", "g", "c", qty=4)
    assert first.ids + second.ids == ids[:8]
    ack(conn, "clicks", "g", "c", second)  # acks everything up to its last id
    assert conn.execute("SELECT acked_id FROM pgbroker.stream_lag('clicks')").fetchone() == (ids[7],)


def test_consumers_share_partitions_and_a_dead_ones_batch_is_delivered_again(conn: Conn) -> None:
    make_stream(conn, partitions=4)
    make_group(conn, "g")
    ids = send(conn, "clicks", [{"n": i} for i in range(40)])
    a = read(conn, "clicks", "g", "a", qty=100, lease=1)  # a alone: takes all four
    assert sorted(a.ids) == ids
    conn.execute("SELECT pg_sleep(1.2)")  # a's lease runs out, unacked
    b = read(conn, "clicks", "g", "b", qty=100, lease=30)
    assert sorted(b.ids) == ids  # b took the partitions over and got a's batch again
    assert set(ack(conn, "clicks", "g", "a", a).values()) == {False}  # a's ack is fenced off
    assert set(ack(conn, "clicks", "g", "b", b).values()) == {True}
    # A second live consumer: b gives up what is beyond its share at its next renewal.
    c = read(conn, "clicks", "g", "c", lease=30)
    assert c.rows == []
    conn.execute("UPDATE pgbroker.stream_consumer SET renewed_at = renewed_at - interval '1 minute'")
    read(conn, "clicks", "g", "b", lease=30)
    read(conn, "clicks", "g", "c", lease=30)
    owners = conn.execute(
        "SELECT owner, count(*) FROM pgbroker.stream_cursor GROUP BY owner ORDER BY 1"
    ).fetchall()
    assert owners == [("b", 2), ("c", 2)]


def test_a_consumer_reading_ahead_lets_the_partitions_beyond_its_share_drain(conn: Conn) -> None:
    # A consumer that reads the next batch before acking the one in hand always has something in
    # flight, and a partition in flight cannot change hands. Beyond its share it reads no more
    # from them: the batch in flight is acked, and they go to the newcomer at the next read.
    make_stream(conn, partitions=4)
    make_group(conn, "g")
    ids = send(conn, "clicks", [{"n": i} for i in range(400)], [f"k{i}" for i in range(400)])
    first = read(conn, "clicks", "g", "a", qty=40)  # a alone: all four partitions
    ahead = read(conn, "clicks", "g", "a", qty=40)  # read ahead, first not acked yet
    assert {r[0] for r in ahead.rows} == {0, 1, 2, 3}
    assert read(conn, "clicks", "g", "b").rows == []  # b joins: its share is two, none free
    conn.execute("UPDATE pgbroker.stream_consumer SET renewed_at = renewed_at - interval '1 minute'")
    ack(conn, "clicks", "g", "a", first)
    more = read(conn, "clicks", "g", "a", qty=40)  # in flight on all four: none given up
    assert {r[0] for r in more.rows} == {0, 1}  # and only its share read
    ack(conn, "clicks", "g", "a", ahead)
    last = read(conn, "clicks", "g", "a", qty=40)  # 2 and 3 drained: given up
    assert {r[0] for r in last.rows} == {0, 1}
    owners = conn.execute("SELECT owner, count(*) FROM pgbroker.stream_cursor GROUP BY owner ORDER BY 1")
    assert owners.fetchall() == [("a", 2), (None, 2)]  # b takes them at its next read
    ack(conn, "clicks", "g", "a", more)
    ack(conn, "clicks", "g", "a", last)
    # b reads on from where a's acks left partitions 2 and 3: every message once.
    seen = (
        first.ids
        + ahead.ids
        + more.ids
        + last.ids
        + drain(conn, "clicks", "g", "b")
        + drain(conn, "clicks", "g", "a")
    )
    assert sorted(seen) == ids
    owners = conn.execute("SELECT owner, count(*) FROM pgbroker.stream_cursor GROUP BY owner ORDER BY 1")
    assert owners.fetchall() == [("a", 2), ("b", 2)]


def test_a_heartbeat_keeps_a_consumer_s_partitions_between_reads(conn: Conn) -> None:
    make_stream(conn, partitions=4)
    make_group(conn, "g")
    ids = send(conn, "clicks", [{"n": i} for i in range(40)])
    a = read(conn, "clicks", "g", "a", qty=100, lease=30)
    assert sorted(a.ids) == ids
    # a's lease at its end, as when handling its batch outlasts it: read no more, it beats.
    conn.execute(
        "UPDATE pgbroker.stream_consumer SET expires_at = now(), renewed_at = now() - interval '30 s'"
    )
    beat = "SELECT * FROM pgbroker.stream_heartbeat('clicks', 'g', %s, %s)"
    assert conn.execute(beat, ["a", 30]).fetchall() == [(p, a.rows[0][2]) for p in range(4)]
    lease_left = "SELECT expires_at - now() FROM pgbroker.stream_consumer WHERE consumer = 'a'"
    row = conn.execute(lease_left).fetchone()
    assert row is not None
    assert row[0] > dt.timedelta(seconds=29)
    assert read(conn, "clicks", "g", "b", lease=30).rows == []  # a is live: b waits for its share
    assert set(ack(conn, "clicks", "g", "a", a).values()) == {True}

    # Bad input is refused and changes nothing.
    consumers = "SELECT consumer, expires_at FROM pgbroker.stream_consumer ORDER BY 1"
    before = conn.execute(consumers).fetchall()
    for args, text, sqlstate in [
        (["a", 0], "lease_seconds must be between 1 and 86400", "PB007"),
        (["", 30], "consumer must name the consumer", "PB007"),
    ]:
        with pytest.raises(psycopg.Error, match=text) as err:
            conn.execute(beat, args)
        assert err.value.sqlstate == sqlstate
    with pytest.raises(psycopg.Error, match='no consumer group "nope"') as err:
        conn.execute("SELECT pgbroker.stream_heartbeat('clicks', 'nope', 'a')")
    assert err.value.sqlstate == "PB021"
    assert conn.execute(consumers).fetchall() == before

    # Once the lease is over and another consumer took the partitions, a beat keeps none of them.
    conn.execute(
        "UPDATE pgbroker.stream_consumer SET expires_at = now() - interval '1 s' WHERE consumer = 'a'"
    )
    b = read(conn, "clicks", "g", "b", lease=30)
    assert b.rows == []  # a acked everything: nothing to hand out again
    assert conn.execute(beat, ["a", 30]).fetchall() == []


def test_release_frees_the_partitions_at_once(conn: Conn) -> None:
    make_stream(conn, partitions=2)
    make_group(conn, "g")
    ids = send(conn, "clicks", [{"n": i} for i in range(4)])
    read(conn, "clicks", "g", "a")
    assert conn.execute("SELECT pgbroker.stream_release('clicks', 'g', 'a')").fetchone() == (2,)
    assert sorted(read(conn, "clicks", "g", "b").ids) == ids


def test_failed_messages_go_to_the_retry_queue_with_their_error(conn: Conn) -> None:
    make_stream(conn, partitions=1)
    make_group(conn, "g")
    conn.execute(
        "SELECT pgbroker.set_policy('clicks_g_retry', backoff => 'fixed', backoff_base_seconds => 0)"
    )
    ids = send(conn, "clicks", [{"n": i} for i in range(5)])
    batch = read(conn, "clicks", "g", "c")
    ack(conn, "clicks", "g", "c", batch, failed=[ids[1], ids[3]], errors=["one", "three"])
    rows = conn.execute("SELECT message, headers FROM pgmq.q_clicks_g_retry ORDER BY msg_id").fetchall()
    assert [r[0] for r in rows] == [{"n": 1}, {"n": 3}]
    assert [r[1]["x-pgbroker-stream"]["error"] for r in rows] == ["one", "three"]
    assert [r[1]["x-pgbroker-stream"]["id"] for r in rows] == [ids[1], ids[3]]
    assert read(conn, "clicks", "g", "c").rows == []  # the batch is settled


def groups_and_queues(conn: Conn) -> tuple[list[tuple[str, str, str]], list[str]]:
    groups = conn.execute(
        "SELECT stream_name, group_name, retry_queue FROM pgbroker.stream_group ORDER BY 1, 2"
    ).fetchall()
    return groups, [r[0] for r in conn.execute("SELECT queue_name FROM pgmq.meta ORDER BY 1")]


def test_two_groups_never_share_a_retry_queue(conn: Conn) -> None:
    # Each group's workers hand what they read from its retry queue to that group's handler. Group
    # names keep their case and queue names fold: group Billing took billing's clicks_billing_retry,
    # and the failures of each went to the other's handler. So did group b_c of stream a and group
    # c of stream a_b (a_b_c_retry), and a group named another's queue by hand.
    make_stream(conn, partitions=1)
    make_stream(conn, "a_b", partitions=1)
    make_stream(conn, "a", partitions=1)
    make_group(conn, "billing")
    make_group(conn, "c", stream="a_b")
    before = groups_and_queues(conn)
    for stream, group, retry_queue, taken in [
        ("clicks", "Billing", None, "clicks_Billing_retry"),
        ("clicks", "BILLING", None, "clicks_BILLING_retry"),
        ("a", "b_c", None, "a_b_c_retry"),
        ("a", "mine", "CLICKS_billing_retry", "CLICKS_billing_retry"),
        ("clicks", "other", "a_b_c_retry", "a_b_c_retry"),
    ]:
        with pytest.raises(psycopg.Error) as err:
            conn.execute(
                "SELECT pgbroker.create_stream_group(%s, %s, retry_queue => %s)", (stream, group, retry_queue)
            )
        assert err.value.sqlstate == "PB004", (stream, group)
        diag = err.value.diag
        assert diag.message_primary == f'queue "{taken}" is already the retry queue of another consumer group'
        assert "retry_queue => " in str(diag.message_hint)
        assert groups_and_queues(conn) == before  # nothing made
    # A queue of its own, named by hand, makes the group; an existing group is returned as it was.
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'Billing', retry_queue => 'clicks_b2_retry')")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'billing')")
    groups, _ = groups_and_queues(conn)
    assert [g for g in groups if g[0] == "clicks"] == [
        ("clicks", "Billing", "clicks_b2_retry"),
        ("clicks", "billing", "clicks_billing_retry"),
    ]
    # A plain queue that no group has is still a group's to take, named or by default.
    conn.execute("SELECT pgmq.create('a_x_retry')")
    make_group(conn, "x", stream="a")
    assert groups_and_queues(conn)[0][0] == ("a", "x", "a_x_retry")


def retry_messages(conn: Conn, queue: str) -> list[Any]:
    query = sql.SQL("SELECT message FROM pgmq.{} ORDER BY msg_id").format(sql.Identifier(f"q_{queue}"))
    return [r[0] for r in conn.execute(query)]


def queue_names(conn: Conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT queue_name FROM pgmq.meta ORDER BY 1")]


def test_dropping_a_group_drops_the_retry_queue_made_for_it(conn: Conn) -> None:
    # The retry queue stayed: a group made again under the name took it over, the old group's
    # failures with it, and its worker handed them to the new group's handler.
    make_stream(conn, partitions=1)
    make_group(conn, "g")
    ids = send(conn, "clicks", [{"old": 1}])
    ack(conn, "clicks", "g", "c", read(conn, "clicks", "g", "c"), failed=ids, errors=["old failure"])
    assert retry_messages(conn, "clicks_g_retry") == [{"old": 1}]
    assert conn.execute("SELECT pgbroker.drop_stream_group('clicks', 'g')").fetchone() == (True,)
    make_group(conn, "g")
    assert retry_messages(conn, "clicks_g_retry") == []  # its own, new
    conn.execute("SELECT pgbroker.drop_stream_group('clicks', 'g')")
    assert queue_names(conn) == []
    make_group(conn, "g")
    # So does dropping the stream, for each of its groups.
    assert conn.execute("SELECT pgbroker.drop_stream('clicks')").fetchone() == (True,)
    assert queue_names(conn) == []


def test_dropping_a_group_keeps_a_retry_queue_that_was_there_before_it(conn: Conn) -> None:
    # A queue the group took over was someone's before: it stays, its messages with it, for the
    # group and for the stream alike. One dropped by hand meanwhile is no error.
    make_stream(conn, partitions=1)
    conn.execute("SELECT pgmq.create('shared_failures')")
    conn.execute("SELECT pgmq.send('shared_failures', '{\"mine\": 1}')")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'g', retry_queue => 'Shared_Failures')")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'h', retry_queue => 'clicks_h_failures')")
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'k')")
    conn.execute("SELECT pgmq.drop_queue('clicks_k_retry')")
    assert conn.execute("SELECT pgbroker.drop_stream_group('clicks', 'g')").fetchone() == (True,)
    assert conn.execute("SELECT pgbroker.drop_stream_group('clicks', 'k')").fetchone() == (True,)
    assert conn.execute("SELECT pgbroker.drop_stream_group('clicks', 'k')").fetchone() == (False,)
    assert queue_names(conn) == ["clicks_h_failures", "shared_failures"]
    conn.execute("SELECT pgbroker.create_stream_group('clicks', 'g', retry_queue => 'shared_failures')")
    assert conn.execute("SELECT pgbroker.drop_stream('clicks')").fetchone() == (True,)
    assert queue_names(conn) == ["shared_failures"]
    assert retry_messages(conn, "shared_failures") == [{"mine": 1}]


def test_groups_of_two_streams_made_at_once_never_share_a_retry_queue(dsn: str, conn: Conn) -> None:
    """Group c of stream a_b and group b_c of stream a, made by two sessions at once: each takes
    its own stream's turn, so only the retry queue's turn orders them."""
    make_stream(conn, "a_b", partitions=1)
    make_stream(conn, "a", partitions=1)
    with psycopg.connect(dsn) as first, psycopg.connect(dsn, autocommit=True) as second:
        first.execute("SELECT pgbroker.create_stream_group('a_b', 'c')")  # its transaction stays open
        outcome: list[BaseException | None] = []

        def make_second() -> None:
            try:
                second.execute("SELECT pgbroker.create_stream_group('a', 'b_c')")
                outcome.append(None)
            except psycopg.Error as exc:
                outcome.append(exc)

        thread = threading.Thread(target=make_second)
        thread.start()
        waiting = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"
        while thread.is_alive() and conn.execute(waiting, (second.info.backend_pid,)).fetchone() != (True,):
            time.sleep(0.05)
        first.commit()
        thread.join(60)
    (error,) = outcome
    assert isinstance(error, psycopg.Error), "the second group took the first one's retry queue"
    assert error.sqlstate == "PB004", error
    assert groups_and_queues(conn)[0] == [("a_b", "c", "a_b_c_retry")]


def test_a_retry_queue_with_max_deliveries_1_dead_letters_at_once(conn: Conn) -> None:
    make_stream(conn, partitions=1)
    conn.execute("SELECT pgmq.create('clicks_dlq')")
    make_group(conn, "g")
    conn.execute(
        "SELECT pgbroker.set_policy('clicks_g_retry', max_deliveries => 1, dead_letter_queue => 'clicks_dlq')"
    )
    ids = send(conn, "clicks", [{"n": 1}])
    ack(conn, "clicks", "g", "c", read(conn, "clicks", "g", "c"), failed=ids, errors=["poison"])
    assert conn.execute("SELECT count(*) FROM pgmq.q_clicks_g_retry").fetchone() == (0,)
    (headers,) = conn.execute("SELECT headers FROM pgmq.q_clicks_dlq").fetchone()  # type: ignore[misc]
    assert headers["x-pgbroker-dead-letter"]["error"] == "poison"
    assert headers["x-pgbroker-stream"]["id"] == ids[0]


def test_a_stale_ack_sends_no_failure_to_the_retry_queue(conn: Conn) -> None:
    make_stream(conn, partitions=1)
    make_group(conn, "g")
    ids = send(conn, "clicks", [{"n": 1}])
    stale = read(conn, "clicks", "g", "a", lease=1)
    conn.execute("SELECT pg_sleep(1.2)")
    read(conn, "clicks", "g", "b")
    assert ack(conn, "clicks", "g", "a", stale, failed=ids, errors=["x"]) == {0: False}
    assert conn.execute("SELECT count(*) FROM pgmq.q_clicks_g_retry").fetchone() == (0,)


def group_state(conn: Conn) -> tuple[Any, ...]:
    """All an ack may change: the positions (every row appended), the cursors and the retry queue."""
    return (
        conn.execute("SELECT * FROM pgbroker.stream_position ORDER BY seq").fetchall(),
        conn.execute("SELECT partition, owner, epoch FROM pgbroker.stream_cursor ORDER BY 1").fetchall(),
        retry_messages(conn, "clicks_g_retry"),
    )


def test_an_ack_made_again_changes_nothing_and_errs_nothing(conn: Conn) -> None:
    """An ack whose answer was lost may be made again (a bridge tries it again after a database
    fault): the same positions and failures again append no position, copy no failure twice, and
    say the partitions held while they do. Once the partitions moved on (a later ack, another
    consumer after a lease loss, a rebalance back to the first), the old ack is fenced: it says
    False where the partition changed hands and moves nothing back."""
    make_stream(conn, partitions=2)
    make_group(conn, "g")
    ids = send(conn, "clicks", [{"n": i} for i in range(6)])
    first = read(conn, "clicks", "g", "a", lease=1)
    assert ack(conn, "clicks", "g", "a", first, failed=ids[:1], errors=["x"]) == {0: True, 1: True}
    once = group_state(conn)
    assert len(once[2]) == 1
    assert ack(conn, "clicks", "g", "a", first, failed=ids[:1], errors=["x"]) == {0: True, 1: True}
    assert group_state(conn) == once
    # The consumer moved on: the old ack again moves nothing back.
    send(conn, "clicks", [{"n": i} for i in range(6, 12)])
    second = read(conn, "clicks", "g", "a", lease=1)
    ack(conn, "clicks", "g", "a", second)
    moved_on = group_state(conn)
    assert ack(conn, "clicks", "g", "a", first, failed=ids[:1], errors=["x"]) == {0: True, 1: True}
    assert group_state(conn) == moved_on
    # Its lease lost, another consumer took the partitions over and acked: both old acks are fenced.
    send(conn, "clicks", [{"n": i} for i in range(12, 18)])
    unacked = read(conn, "clicks", "g", "a", lease=1)
    conn.execute("SELECT pg_sleep(1.2)")
    ack(conn, "clicks", "g", "b", read(conn, "clicks", "g", "b", lease=1))
    taken = group_state(conn)
    for batch in (first, unacked):
        assert ack(conn, "clicks", "g", "a", batch, failed=ids[:1], errors=["x"]) == {0: False, 1: False}
        assert group_state(conn) == taken
    # b's lease over too, a takes the partitions back under new epochs: its old acks stay fenced.
    conn.execute("SELECT pg_sleep(1.2)")
    assert read(conn, "clicks", "g", "a").rows == []
    back = group_state(conn)
    assert {owner for _, owner, _ in back[1]} == {"a"}
    for batch in (first, unacked):
        assert ack(conn, "clicks", "g", "a", batch, failed=ids[:1], errors=["x"]) == {0: False, 1: False}
        assert group_state(conn) == back


def test_lag_per_group(conn: Conn) -> None:
    make_stream(conn, partitions=2)
    make_group(conn, "fast")
    make_group(conn, "slow")
    send(conn, "clicks", [{"n": i} for i in range(10)])
    drain(conn, "clicks", "fast", "c")
    lags = {r[0]: r[1] for r in conn.execute("SELECT * FROM pgbroker.stream_groups('clicks')")}
    assert lags == {"fast": 0, "slow": 10}


def sizes_and_dead(conn: Conn, stream: str = "clicks") -> tuple[int, int]:
    conn.execute("SELECT pg_stat_force_next_flush()")
    row = conn.execute(
        "SELECT coalesce(sum(n_dead_tup), 0), count(*) FROM pg_stat_user_tables "
        "WHERE schemaname = 'pgbroker' AND relname LIKE %s",
        (f"s\\_{stream}\\_%",),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_retention_truncates_what_every_group_passed_and_leaves_no_dead_tuples(conn: Conn) -> None:
    make_stream(conn, partitions=2, segment_rows=1000, segments=4)
    make_group(conn, "a")
    make_group(conn, "b")
    for _ in range(30):  # 30,000 messages: seven and a half laps of the ring
        send(conn, "clicks", [{"n": i} for i in range(1000)])
        drain(conn, "clicks", "a", "c", qty=500)
        drain(conn, "clicks", "b", "c", qty=500)
        conn.execute("SELECT pgbroker.maintain_stream('clicks')")
    kept = conn.execute("SELECT count(*) FROM pgbroker.s_clicks").fetchone()[0]  # type: ignore[index]
    assert kept <= 2000  # the current segment and at most one more
    dead, tables = sizes_and_dead(conn)
    assert tables == 4
    assert dead == 0
    small = conn.execute(
        "SELECT max(pg_total_relation_size(c)) FROM unnest(ARRAY['pgbroker.stream_cursor', "
        "'pgbroker.stream_consumer', 'pgbroker.stream_watermark', 'pgbroker.stream_group']::regclass[]) c"
    ).fetchone()[0]  # type: ignore[index]
    assert small < 1024 * 1024


def test_retention_keeps_what_a_group_has_not_read(conn: Conn) -> None:
    make_stream(conn, partitions=1, segment_rows=100, segments=3)
    make_group(conn, "reader")
    make_group(conn, "laggard")
    ids = send(conn, "clicks", [{"n": i} for i in range(1000)])
    drain(conn, "clicks", "reader", "c")
    assert conn.execute("SELECT pgbroker.maintain_stream('clicks')").fetchone() == (0,)
    assert drain(conn, "clicks", "laggard", "c", qty=1000) == ids


def test_retention_by_time_and_by_size(conn: Conn) -> None:
    make_stream(conn, "old", partitions=1, segment_rows=100, segments=3, retention_seconds=1)
    send(conn, "old", [{"n": i} for i in range(150)])
    conn.execute("SELECT pg_sleep(1.1)")
    assert conn.execute("SELECT pgbroker.maintain_stream('old')").fetchone() == (2,)
    assert conn.execute("SELECT count(*) FROM pgbroker.s_old").fetchone() == (0,)

    make_stream(conn, "big", partitions=1, segment_rows=1000, segments=4, retention_bytes=1)
    send(conn, "big", [{"n": i} for i in range(2500)])
    conn.execute("SELECT pgbroker.maintain_stream('big')")
    # Everything but the current segment goes, oldest first; what stays is the newest.
    left = [r[0] for r in conn.execute("SELECT id FROM pgbroker.s_big ORDER BY id")]
    assert left == list(range(2000, 2501))


def test_bad_input_names_the_problem(conn: Conn) -> None:
    with pytest.raises(psycopg.Error, match='stream "nope" does not exist') as err:
        conn.execute("SELECT pgbroker.stream_send('nope', '{}')")
    assert err.value.sqlstate == "PB020"
    make_stream(conn)
    with pytest.raises(psycopg.Error, match='no consumer group "g"') as err:
        read(conn, "clicks", "g", "c")
    assert err.value.sqlstate == "PB021"
    for call, text in [
        ("SELECT pgbroker.create_stream('Bad/Name!')", "stream name"),  # whitespace: PB001, test_security
        ("SELECT pgbroker.create_stream('x', 0)", "partitions"),
        ("SELECT pgbroker.create_stream('clicks', 8)", "exists with partitions 4"),
        ("SELECT pgbroker.create_stream_group('clicks', 'g', 'middle')", "start_from"),
        (
            "SELECT pgbroker.stream_send_many('clicks', ARRAY['{}']::jsonb[], NULL, ARRAY['a', 'b'])",
            "one entry",
        ),
        # A failed message's headers go to the retry queue with x-pgbroker-stream added: an
        # array or a scalar there became an array, which the retry's handler could not read.
        ("SELECT pgbroker.stream_send('clicks', '{}', '[1]')", "headers must be a JSON object"),
        (
            "SELECT pgbroker.stream_send_many('clicks', ARRAY['{}', '{}']::jsonb[],"
            " ARRAY[NULL, '\"x\"']::jsonb[])",
            "headers must be a JSON object",
        ),
    ]:
        with pytest.raises(psycopg.Error, match=text) as err:
            conn.execute(call)
        assert err.value.sqlstate == "PB007", call
    assert conn.execute("SELECT count(*) FROM pgbroker.stream").fetchone() == (1,)


def test_drop_stream_removes_its_tables(conn: Conn) -> None:
    make_stream(conn)
    make_group(conn, "g")
    assert conn.execute("SELECT pgbroker.drop_stream('clicks')").fetchone() == (True,)
    assert conn.execute("SELECT to_regclass('pgbroker.s_clicks')").fetchone() == (None,)
    assert conn.execute("SELECT count(*) FROM pgbroker.stream_cursor").fetchone() == (0,)
    assert conn.execute("SELECT pgbroker.drop_stream('clicks')").fetchone() == (False,)


def test_enqueued_at_is_the_send_time(conn: Conn) -> None:
    make_stream(conn)
    before = dt.datetime.now(dt.UTC)
    send(conn, "clicks", [{}])
    (at,) = conn.execute("SELECT enqueued_at FROM pgbroker.s_clicks").fetchone()  # type: ignore[misc]
    assert abs((at - before).total_seconds()) < 5


def test_rewind_hands_out_the_unacknowledged_again(conn: Conn) -> None:
    """For a consumer whose read committed but whose connection broke before the rows arrived."""
    make_stream(conn, partitions=1)
    make_group(conn, "g")
    ids = send(conn, "clicks", [{"n": i} for i in range(6)])
    ack(conn, "clicks", "g", "c", read(conn, "clicks", "g", "c", qty=2))
    assert read(conn, "clicks", "g", "c", qty=2).ids == ids[2:4]  # "lost"
    assert conn.execute("SELECT pgbroker.stream_rewind('clicks', 'g', 'c')").fetchone() == (1,)
    assert read(conn, "clicks", "g", "c", qty=10).ids == ids[2:]


def test_a_read_under_a_generation_the_consumer_has_rewound_past_is_refused_and_changes_nothing(
    conn: Conn,
) -> None:
    """A read sent before a rewind and run after it (a hung session going on) would move the
    partitions past rows no one handles; under the generation it was sent with, it is refused."""
    make_stream(conn, partitions=2)
    make_group(conn, "g")
    ids = send(conn, "clicks", [{"n": i} for i in range(6)], ["a", "b"] * 3)
    first = read(conn, "clicks", "g", "c", qty=2, generation=1)  # takes both partitions under 1
    assert len(first.ids) == 2
    conn.execute("SELECT pgbroker.stream_rewind('clicks', 'g', 'c', 2)")

    def positions() -> list[tuple[Any, ...]]:
        return conn.execute(
            "SELECT partition, acked_id, delivered_id FROM pgbroker.stream_lag('clicks') ORDER BY partition"
        ).fetchall()

    before = positions()
    parts, epochs, last = first.ack_args()
    for call, args in (
        ("SELECT * FROM pgbroker.stream_read('clicks', 'g', 'c', 10, 30, generation => %s)", (1,)),
        (
            "SELECT * FROM pgbroker.stream_consume('clicks', 'g', 'c', 10, 30, %s, %s, %s, generation => %s)",
            (parts, epochs, last, 1),
        ),
    ):
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(call, args)
        assert refused.value.sqlstate == "PB022"
        assert "has rewound since this read's generation 1" in (refused.value.diag.message_primary or "")
        assert "its own name" in (refused.value.diag.message_hint or "")
        assert positions() == before  # neither read nor acked
    assert sorted(read(conn, "clicks", "g", "c", qty=10, generation=2).ids) == ids  # rewound: all again
    # A consumer that names no generation is never refused: a client that knows nothing of them.
    assert read(conn, "clicks", "g", "c", qty=10).ids == []
    conn.execute("SELECT pgbroker.stream_rewind('clicks', 'g', 'c')")
    assert sorted(read(conn, "clicks", "g", "c", qty=10).ids) == ids


def test_a_batch_is_filled_from_every_partition_in_order(conn: Conn) -> None:
    make_stream(conn, partitions=4)
    make_group(conn, "g")
    ids = send(conn, "clicks", [{"n": i} for i in range(800)])  # no key: id mod 4, 200 each
    by_partition = {p: [i for i in ids if i % 4 == p] for p in range(4)}

    def read_by_partition(qty: int) -> dict[int, list[int]]:
        batch = read(conn, "clicks", "g", "c", qty=qty)
        ack(conn, "clicks", "g", "c", batch)
        got: dict[int, list[int]] = {}
        for partition, msg_id, *_ in batch.rows:
            got.setdefault(partition, []).append(msg_id)
        return got

    # An even share of the batch from each partition, each partition's ids in order from its cursor.
    assert read_by_partition(200) == {p: by_partition[p][:50] for p in range(4)}
    assert read_by_partition(400) == {p: by_partition[p][50:150] for p in range(4)}
    assert read_by_partition(100) == {p: by_partition[p][150:175] for p in range(4)}
    # What some partitions cannot give, the others fill: 25 left in each, 30 more in one.
    keyed = send(conn, "clicks", [{"n": i} for i in range(30)], keys=["k"] * 30)
    row = conn.execute("SELECT partition FROM pgbroker.s_clicks WHERE key = 'k' LIMIT 1").fetchone()
    assert row is not None
    fuller = row[0]
    rest = read_by_partition(130)
    assert rest == {p: by_partition[p][175:] + (keyed if p == fuller else []) for p in range(4)}
    assert read(conn, "clicks", "g", "c").rows == []


def test_batches_across_segments_are_full_and_in_order_in_every_partition(conn: Conn) -> None:
    """A read goes on into the next segment, partition by partition. With keys sent in uneven runs
    the partitions stand in different segments; every batch still holds what there is up to its
    size, and each partition's ids come once, in order."""
    make_stream(conn, partitions=3, segment_rows=100, segments=3)
    make_group(conn, "g")
    pick = random.Random(7)
    keys = ["a"] * 6 + ["b"] * 2 + ["c"] + [None]
    sizes = itertools.cycle([7, 50, 13, 100, 1, 31, 64])
    sent: list[int] = []
    seen: list[int] = []
    last: dict[int, int] = {}
    for _ in range(12):
        sent += send(conn, "clicks", [{}] * 97, keys=[pick.choice(keys) for _ in range(97)])
        for _ in range(3):
            qty = next(sizes)
            batch = read(conn, "clicks", "g", "c", qty=qty)
            assert len(batch.rows) == min(qty, len(sent) - len(seen))
            for partition, msg_id, *_ in batch.rows:
                assert msg_id > last.get(partition, 0)
                last[partition] = msg_id
            seen += batch.ids
            ack(conn, "clicks", "g", "c", batch)
        conn.execute("SELECT pgbroker.maintain_stream('clicks')")
    seen += drain(conn, "clicks", "g", "c", qty=45)
    assert sorted(seen) == sent


def test_a_consumer_whose_sessions_ended_loses_its_partitions_at_once(dsn: str, conn: Conn) -> None:
    make_stream(conn, partitions=4)
    make_group(conn, "g")
    ids = send(conn, "clicks", [{"n": i} for i in range(40)])
    with psycopg.connect(dsn, autocommit=True) as elsewhere:
        held = read(elsewhere, "clicks", "g", "a", lease=600)  # a takes all four, acks nothing
        assert sorted(held.ids) == ids
        # a's session is open: a is alive, its lease is long, b gets nothing.
        assert read(conn, "clicks", "g", "b", lease=600).rows == []
    # a's connection is gone (its process died): b takes its partitions over long before the lease.
    started = time.monotonic()
    while not (again := read(conn, "clicks", "g", "b", lease=600)).rows:
        assert time.monotonic() - started < 120, "a's partitions were not freed"
        time.sleep(0.05)
    print(f"a's partitions moved {time.monotonic() - started:.2f} s after its session ended")
    assert sorted(again.ids) == ids  # a's batch delivered again
    assert set(ack(conn, "clicks", "g", "a", held).values()) == {False}  # a's acks fenced off
    assert set(ack(conn, "clicks", "g", "b", again).values()) == {True}
    assert conn.execute("SELECT consumer FROM pgbroker.stream_consumer").fetchall() == [("b",)]


def position_writes(conn: Conn) -> tuple[int, int]:
    """This transaction's writes so far: positions appended, and cursor rows updated (HOT or not)."""
    row = conn.execute(
        "SELECT coalesce(sum(n_tup_ins) FILTER (WHERE relname LIKE 'stream\\_position\\_%%'), 0),"
        " coalesce(sum(n_tup_upd) FILTER (WHERE relname = 'stream_cursor'), 0)"
        " FROM pg_stat_xact_user_tables WHERE schemaname = 'pgbroker'"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_an_ack_and_read_in_one_call_appends_one_position_a_partition(conn: Conn) -> None:
    # One position a partition a batch, not one for the ack and one for the read, and no update
    # of the cursor rows: an update leaves a version that a transaction holding back the xmin
    # horizon keeps; an appended position leaves none (test_stream_positions.py).
    make_stream(conn, partitions=4)
    make_group(conn, "g")
    send(conn, "clicks", [{"n": i} for i in range(2000)])
    batch = read(conn, "clicks", "g", "c", qty=200)
    for _ in range(5):
        parts, epochs, last = batch.ack_args()
        assert parts == [0, 1, 2, 3]
        with conn.transaction():
            before = position_writes(conn)
            batch = Batch(
                conn.execute(
                    "SELECT * FROM pgbroker.stream_consume('clicks', 'g', 'c', 200, 30, %s, %s, %s)",
                    (parts, epochs, last),
                ).fetchall()
            )
            after = position_writes(conn)
            assert (after[0] - before[0], after[1] - before[1]) == (4, 0)
    acked = [
        r[0] for r in conn.execute("SELECT acked_id FROM pgbroker.stream_lag('clicks') ORDER BY partition")
    ]
    assert acked == last
    assert len(batch.rows) == 200


def test_a_consumer_not_seen_since_the_server_started_keeps_its_lease(dsn: str, conn: Conn) -> None:
    # A restart ends every session: a live consumer's lock is gone until it reads again.
    make_stream(conn, partitions=2)
    make_group(conn, "g")
    send(conn, "clicks", [{"n": i} for i in range(4)])
    with psycopg.connect(dsn, autocommit=True) as elsewhere:
        read(elsewhere, "clicks", "g", "a", lease=600)
    conn.execute(
        "UPDATE pgbroker.stream_consumer SET renewed_at = pg_postmaster_start_time() - interval '1 second'"
    )
    assert read(conn, "clicks", "g", "b", lease=600).rows == []
    owners = conn.execute("SELECT DISTINCT owner FROM pgbroker.stream_cursor").fetchall()
    assert owners == [("a",)]


def test_a_consumer_not_seen_since_the_promotion_keeps_its_lease(
    replicated: tuple[EmbeddedPostgres, EmbeddedPostgres],
) -> None:
    """A failover ends every session too: the promoted standby holds none of the consumers'
    locks. The first consumer to read there took the others' partitions (and their batches in
    hand, handed out again while they were handled), though they were alive and reconnecting."""
    primary, standby = replicated
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        make_stream(conn, partitions=2)
        make_group(conn, "g")
        send(conn, "clicks", [{"n": i} for i in range(4)])
        assert read(conn, "clicks", "g", "a", lease=600).ids  # "a" owns both partitions
    wait_caught_up(primary, standby)
    primary.stop()
    promote(standby)
    with psycopg.connect(standby.dsn(), autocommit=True) as conn:
        assert read(conn, "clicks", "g", "b", lease=600).rows == []
        owners = conn.execute("SELECT DISTINCT owner FROM pgbroker.stream_cursor").fetchall()
    assert owners == [("a",)]


def test_a_consumer_not_seen_since_a_crash_of_the_server_keeps_its_lease(cluster: EmbeddedPostgres) -> None:
    """A backend that crashes (the OOM killer, a SIGKILL) makes the server end every session and
    recover without a new start time: the first consumer to read after it took the others'
    partitions (and their batches in hand), though they were alive and reconnecting."""
    dsn = cluster.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn, autocommit=True) as victim:
        make_stream(conn, partitions=2)
        make_group(conn, "g")
        send(conn, "clicks", [{"n": i} for i in range(4)])
        assert read(conn, "clicks", "g", "a", lease=600).ids  # "a" owns both, its session holds its lock
        pid = victim.info.backend_pid
        os.kill(pid, signal.SIGKILL)  # the server's crash: every session ends, "a"'s too
        deadline = time.monotonic() + 120
        while True:
            try:
                with psycopg.connect(dsn, autocommit=True) as back:
                    back.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline, "the server did not come back from its crash"
                time.sleep(0.2)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert read(conn, "clicks", "g", "b", lease=600).rows == []
        owners = conn.execute("SELECT DISTINCT owner FROM pgbroker.stream_cursor").fetchall()
    assert owners == [("a",)]


def _read_at_once(
    session: Conn, consumer: str, group: str, start: threading.Barrier, got: dict[str, list[int]]
) -> None:
    start.wait(30)
    got[consumer] = read(session, "clicks", group, consumer, qty=25).ids


def test_consumers_joining_at_once_never_take_each_others_partitions(dsn: str, conn: Conn) -> None:
    """Four consumers read a new group at the same moment, each on its own session. A consumer
    registers and takes its share in its read's transaction, so one that decided who is live before
    another's read committed would see the other's partitions as ownerless-but-owned by a stranger
    and take them, handing out again a batch the other is handling: duplicates without any consumer
    dying, which the guarantees rule out. Every round, no message may reach two consumers."""
    make_stream(conn)
    send(conn, "clicks", [{"n": i} for i in range(400)], [f"k{i}" for i in range(400)])
    consumers = [f"c{i}" for i in range(4)]
    sessions = [psycopg.connect(dsn, autocommit=True) for _ in consumers]
    try:
        for round_ in range(12):
            group = f"g{round_}"
            make_group(conn, group)
            start = threading.Barrier(len(consumers))
            got: dict[str, list[int]] = {}
            threads = [
                threading.Thread(target=_read_at_once, args=(session, consumer, group, start, got))
                for session, consumer in zip(sessions, consumers, strict=True)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            # A second read each, one after another: a consumer that lost a partition to a
            # wrongful take would have its batch handed out again here.
            for session, consumer in zip(sessions, consumers, strict=True):
                got[consumer] += read(session, "clicks", group, consumer, qty=25).ids
            seen = [i for ids in got.values() for i in ids]
            assert len(seen) == len(set(seen)), f"round {round_}: a message went to two consumers: {got}"
    finally:
        for session in sessions:
            session.close()
