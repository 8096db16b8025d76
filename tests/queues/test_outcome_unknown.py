"""A send whose connection broke while it committed raises OutcomeUnknown (the messages may be
stored), unlike a call that failed cleanly; a retry with the same dedup key stores nothing twice.
The commit is cut off for real (tests/support/commits.py). And the idempotency key of
send_many, the other way to retry safely."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from pgbroker import Broker, ConnectionLost, IdempotencyKeyReused, InvalidArgument, OutcomeUnknown
from pgbroker.embedded import EmbeddedPostgres
from tests.support.commits import commits_cut_off


def test_a_send_cut_off_in_its_commit_is_outcome_unknown_and_its_retry_stores_it_once(
    cluster: EmbeddedPostgres,
) -> None:
    dsn = cluster.dsn()
    with Broker(dsn) as broker:
        broker.create_queue("orders")
        with commits_cut_off(dsn), pytest.raises(OutcomeUnknown) as raised:
            broker.queue("orders").send({"order": 1}, dedup_key="order-1")
    assert isinstance(raised.value, ConnectionLost)
    assert raised.value.hint is not None
    assert "same x-pgbroker-dedup-key" in raised.value.hint
    with Broker(dsn) as broker:
        again = broker.queue("orders").send({"order": 1}, dedup_key="order-1")  # the retry
        with broker.connection() as conn:
            stored = conn.execute("SELECT msg_id, message FROM pgmq.q_orders").fetchall()
    assert stored == [(again, {"order": 1})], "it had committed; the retry found it"


def test_a_connection_lost_inside_the_callers_transaction_is_not_outcome_unknown(
    cluster: EmbeddedPostgres,
) -> None:
    """The commit was not issued yet: the server rolled the send back, for certain."""
    dsn = cluster.dsn()
    with Broker(dsn) as broker:
        broker.create_queue("orders")
        with broker.transaction() as tx:
            with psycopg.connect(dsn, autocommit=True) as other:
                pid = tx.connection.execute("SELECT pg_backend_pid()").fetchone()
                other.execute("SELECT pg_terminate_backend(%s)", pid)
            try:
                tx.queue("orders").send({"order": 1})
            except ConnectionLost as exc:
                lost: ConnectionLost = exc
            else:
                pytest.fail("the send went through a terminated session")
        assert not isinstance(lost, OutcomeUnknown)
        assert broker.metrics("orders").queue_length == 0


def test_an_idempotency_key_answers_a_retry_and_refuses_another_request(broker: Broker) -> None:
    queue = broker.create_queue("orders")
    ids = queue.send_many([{"order": 1}], idempotency_key="order-1", delay=timedelta(seconds=5))
    assert queue.send_many([{"order": 1}], idempotency_key="order-1", delay=5) == ids
    with pytest.raises(IdempotencyKeyReused, match="'order-1'"):
        queue.send_many([{"order": 2}], idempotency_key="order-1")
    with pytest.raises(InvalidArgument, match="delay in seconds"):
        queue.send_many([{"order": 1}], idempotency_key="order-1", delay=datetime.now(UTC))
    assert broker.metrics("orders").queue_length == 1
