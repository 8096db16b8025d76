"""pgbroker's job headers through the official pgmq Python clients, unchanged (psycopg and
asyncpg): a priority and a dedup key are plain headers of pgmq's send and send_batch."""

from __future__ import annotations

from pgmq import PGMQueue

Q = "jobs"


def test_a_pgmq_client_sends_priorities_and_dedup_keys_as_headers(client: PGMQueue) -> None:
    client.create_queue(Q)
    low = client.send(Q, {"n": 1})
    client.send_batch(
        Q, [{"n": 2}, {"n": 3}], headers=[{"x-pgbroker-priority": 5}, {"x-pgbroker-priority": 9}]
    )
    first = client.send(Q, {"n": 4}, headers={"x-pgbroker-dedup-key": "order-4"})
    assert client.send(Q, {"n": 5}, headers={"x-pgbroker-dedup-key": "order-4"}) == first
    read = client.read_batch(Q, vt=30, batch_size=10)
    assert read is not None
    assert [m.message["n"] for m in read] == [3, 2, 1, 4]
    assert read[2].msg_id == low
