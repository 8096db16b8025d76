"""A failover under every kind of pgbroker process: a primary and a streaming standby on this
machine (tests/support/replication.py), the processes on a multi-host DSN with
target_session_attrs=read-write, none of them restarted (tests/support/failover.py says what runs).

- A crash of the primary (SIGKILL of its postmaster) under synchronous replication, the standby
  promoted: no acknowledged send is lost, no message whose ack was answered is delivered again,
  and every process kind works again within seconds of the promotion. The stream group handles
  each message once, each key in the log's order, its two consumers keep their partitions, and
  each tick of the schedule is sent once (tests/support/failover_checks.py judges). Every message
  published to RabbitMQ and confirmed there is stored once by ``bridge in``: a batch whose commit
  or ack the fault cut comes again from RabbitMQ, and its message ids are recognised
  (docs/bridge.md, "Inbound").
- A switchover: the primary stopped cleanly, the standby promoted, the old primary started again
  as a standby of the new one. The processes follow without a restart and lose nothing.

The time each process kind took to resume is printed (``pytest -s``); docs/operations.md has the
figures, and bench/failover_bench.py measures the asynchronous case.

A message identity that stays unique across failovers (msg_ids of an asynchronous failover may be
issued again) is tested against every outbound connector (tests/support/identity.py), not here.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pgbroker.embedded import EmbeddedPostgres
from tests.support.failover import Outcome, Traffic
from tests.support.replication import crash, demote, in_recovery, multi_host_dsn, promote, set_synchronous

pytestmark = pytest.mark.slow

# Generous for a loaded machine: the pools retry every few seconds at most (their back-off is
# capped at 10 s), the listener sooner; a process that never followed the failover would fail the
# run's own bound (90 s) instead.
RESUME_WITHIN = 30.0
WORKER_CONCURRENCY = 4  # tests.support.failover starts the worker so


def _assert_nothing_lost(outcome: Outcome) -> None:
    assert outcome.lost == dict.fromkeys(outcome.lost, 0), outcome.report("lost")
    assert outcome.missing == dict.fromkeys(outcome.missing, 0), outcome.report("missing")
    assert outcome.acked_then_delivered == 0, outcome.report("delivered again after an answered ack")
    assert outcome.reissued_msg_ids == 0, outcome.report("msg_ids issued twice")
    # At-least-once: a message in flight when the primary went may come again, no other. The
    # worker holds at most its concurrency handled and not yet acked (plus the outcomes of 10 ms
    # it batches into one ack); serve's reader at most one batch of 10; the bridge at most its two
    # windows of 50 whose acks were cut. A stream group none: its consumers ack what they
    # handled once a server takes writes again, within their leases, and a read whose answer was
    # cut was never handled (its rewind hands it out again); docs/streams.md, "Guarantees".
    # Bridge in stores none twice: a batch received again is recognised by its message ids.
    bounds = {"jobs": 2 * WORKER_CONCURRENCY, "http": 10, "outbox": 100, "wake": 1, "events": 0, "inbox": 0}
    assert all(outcome.duplicated[q] <= bounds[q] for q in bounds), outcome.report("duplicated")
    assert outcome.redelivered_from_before == 0, outcome.report("delivered again though long acked")
    assert outcome.acks_undone == 0, outcome.report("a stream ack undone")
    # Both consumers live throughout, their leases (30 s) longer than the failover.
    assert outcome.partitions_moved == [], outcome.report("partitions taken from a live consumer")
    # A key's messages in the log's order; a redelivery goes back and repeats from there.
    assert outcome.out_of_order == {}, outcome.report("a key out of order")
    assert outcome.ticks_unsent == outcome.ticks_sent_twice == 0, outcome.report("a tick not sent once")
    assert max(outcome.resume.values()) < RESUME_WITHIN, outcome.report("resumed too late")
    # Woken by the notification of the send: the read waits 20 s, its poll interval is 60 s.
    assert outcome.wake_latency < 10, outcome.report("a waiting read not woken")


def test_a_crash_of_the_primary_under_synchronous_replication_loses_nothing(
    replicated: tuple[EmbeddedPostgres, EmbeddedPostgres], amqp: str, tmp_path: Path
) -> None:
    primary, standby = replicated
    set_synchronous(primary, standby.data_dir.name)

    def fail_over() -> float:
        crash(primary)
        return promote(standby)

    with Traffic(multi_host_dsn(primary, standby), tmp_path, amqp) as traffic:
        outcome = traffic.across(fail_over)
    print(outcome.report("crash, synchronous"))
    _assert_nothing_lost(outcome)


def test_a_switchover_keeps_the_old_primary_as_a_standby_and_the_processes_follow(
    replicated: tuple[EmbeddedPostgres, EmbeddedPostgres], amqp: str, tmp_path: Path
) -> None:
    primary, standby = replicated

    def switch_over() -> float:
        primary.stop()  # a clean stop: the standby receives every commit first
        promoted_at = promote(standby)
        demote(primary, standby)
        return promoted_at

    started = time.monotonic()
    with Traffic(multi_host_dsn(primary, standby), tmp_path, amqp) as traffic:
        outcome = traffic.across(switch_over)
    print(outcome.report("switchover"), f"(whole run {time.monotonic() - started:.0f} s)")
    assert in_recovery(primary)
    assert not in_recovery(standby)
    _assert_nothing_lost(outcome)
