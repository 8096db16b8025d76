"""The pure parts of the LISTEN wake-ups (pgbroker._db.wakeups, and the listeners' counts): the
schedule of a waiting read, the reconnect delays, news."""

from __future__ import annotations

import time

import pytest

from pgbroker._db.listen import Listener, Subscription, _Loop
from pgbroker._db.wakeups import (
    NEWS_CREDIT,
    WAKE_BURST,
    WAKE_RATE,
    Waiting,
    WakeBudget,
    check_poll_interval,
    reconnect_delay,
)
from pgbroker.errors import InvalidArgument


def test_a_read_that_does_not_wait_is_done_at_once() -> None:
    assert Waiting(0, 0.5).done([])


def test_a_waiting_read_is_done_when_it_found_messages() -> None:
    waiting = Waiting(60, 0.5)
    assert not waiting.done([])
    assert waiting.done(["message"])


def test_sleeps_last_a_poll_interval_at_most_and_never_past_the_deadline() -> None:
    assert Waiting(60, 0.5).timeout() == 0.5
    assert 0 < Waiting(0.2, 0.5).timeout() <= 0.2
    expired = Waiting(0.01, 0.5)
    time.sleep(0.02)
    assert expired.timeout() == 0
    assert expired.done([])


def test_reconnect_delays_grow_from_a_tenth_of_a_second_to_five_seconds() -> None:
    delays = [reconnect_delay(n) for n in range(10)]
    assert delays[0] == pytest.approx(0.1)
    assert delays == sorted(delays)
    assert delays[-1] == 5.0
    assert reconnect_delay(10_000) == 5.0


@pytest.mark.parametrize("bad", [0, -1, float("nan"), True, "1"])
def test_poll_interval_must_be_positive_seconds(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="poll_interval"):
        check_poll_interval(bad)  # type: ignore[arg-type]


def test_a_subscriber_has_news_when_its_channel_was_heard_since_it_last_looked() -> None:
    listener = Listener(lambda: "unused: the loop is never started")
    listener._listening = _Loop("unused", lambda: None)
    listener._listening.counts.update({"mine": 3, "other": 0})
    place = Subscription(listener, "mine")
    assert not place.has_news()
    listener._listening.counts["other"] += 1
    assert not place.has_news()
    listener._listening.counts["mine"] += 1
    assert place.has_news()
    place.catch_up()
    assert not place.has_news()


def test_wake_ups_by_news_come_in_a_burst_then_at_the_budgets_rate() -> None:
    budget = WakeBudget()
    assert [budget.take() for _ in range(WAKE_BURST)] == [0.0] * WAKE_BURST
    turns = [budget.take() for _ in range(3)]
    # Past the burst a wake-up waits its turn; at most one is owed, however many were asked for.
    assert all(0 < turn <= 1 / WAKE_RATE for turn in turns)


def test_a_wake_up_that_brought_messages_earns_its_competitors_wake_ups() -> None:
    """Consumers competing for a queue's sends are each woken by every send and mostly find it
    taken: a wake-up that brings messages lets NEWS_CREDIT empty ones through (no more, however
    many brought messages), then the budget's rate holds again."""
    budget = WakeBudget()
    for _ in range(WAKE_BURST):
        budget.take()
    for _ in range(3):
        budget.news(refund=False)
    assert [budget.take() for _ in range(WAKE_BURST + NEWS_CREDIT)] == [0.0] * (WAKE_BURST + NEWS_CREDIT)
    assert budget.take() > 0
