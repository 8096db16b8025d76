"""The job features on a partitioned queue (pg_partman): the priority and concurrency-key indexes
are built on the partitioned table (and so on every partition), dedup, limits and pause hold."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from tests.support.tables import Conn, jsonb_array


def test_job_features_on_a_partitioned_queue(pconn: Conn) -> None:
    # Partitions of 10 msg_ids: the messages below spread over several.
    pconn.execute("SELECT pgmq.create_partitioned('pq', '10', '100')")
    keys = [{"x-pgbroker-priority": i % 3, "x-pgbroker-concurrency-key": f"k{i % 2}"} for i in range(25)]
    pconn.execute(
        "SELECT pgmq.send_batch('pq', %s::jsonb[], %s::jsonb[])",
        [jsonb_array([{"n": i} for i in range(25)]), jsonb_array(keys)],
    )
    partitions = pconn.execute(
        "SELECT count(*) FROM pg_indexes WHERE schemaname = 'pgmq' AND indexname LIKE '%priority%'"
    ).fetchone()
    assert partitions is not None
    assert partitions[0] >= 3  # the parent's index and one per partition
    got = [m["n"] for (m,) in pconn.execute("SELECT message FROM pgmq.read('pq', 30, 5)")]
    assert got == [2, 5, 8, 11, 14]  # priority 2 first, msg_id order within it

    pconn.execute("SELECT pgbroker.set_policy('pq', max_in_flight_per_key => 3)")
    # k0 has 3 of the 5 in flight, k1 2: one more of k1 only.
    got = pconn.execute(
        "SELECT headers->>'x-pgbroker-concurrency-key' FROM pgmq.read('pq', 30, 5)"
    ).fetchall()
    assert got == [("k1",)]

    first = pconn.execute("SELECT pgmq.send('pq', '{}', %s::jsonb)", [Jsonb({"x-pgbroker-dedup-key": "d"})])
    again = pconn.execute("SELECT pgmq.send('pq', '{}', %s::jsonb)", [Jsonb({"x-pgbroker-dedup-key": "d"})])
    assert first.fetchone() == again.fetchone()

    pconn.execute("SELECT pgbroker.pause('pq')")
    assert pconn.execute("SELECT * FROM pgmq.pop('pq')").fetchall() == []
