"""Back-off schedules (pgbroker._db.backoff): doubling, jitter, the cap, and the deadline."""

from __future__ import annotations

import time

from pgbroker._db.backoff import Backoff, Patience


def test_pauses_double_up_to_the_most_and_start_again_after_reset() -> None:
    backoff = Backoff(0.1, 1.0, jitter=0)
    assert [round(backoff.next(), 3) for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    backoff.reset()
    assert backoff.next() == 0.1


def test_jitter_only_shortens_a_pause() -> None:
    pauses = [Backoff(1.0, 1.0, jitter=0.2).next() for _ in range(200)]
    assert all(0.8 <= p <= 1.0 for p in pauses)
    assert len(set(pauses)) > 1


def test_patience_never_pauses_past_its_deadline_and_then_gives_up() -> None:
    patience = Patience(10.0, 10.0, within=0.2)
    first = patience.next()
    assert first is not None
    assert first <= 0.2
    time.sleep(0.25)
    assert patience.next() is None
    assert Patience(0.01, 1.0, within=0).next() is None
