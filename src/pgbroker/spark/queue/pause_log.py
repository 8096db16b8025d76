"""Telling the user, once per change, that a stream idles because its queue is paused: an idle
query looks the same as an empty queue otherwise."""

from __future__ import annotations

import logging

log = logging.getLogger("pgbroker.spark")


class PauseLog:
    """Logs when a stream's queue is first seen paused, and when it is seen running again."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.paused = False

    def note(self, paused: bool) -> None:
        if paused == self.paused:
            return
        self.paused = paused
        if paused:
            log.warning("pgbroker: queue %r is paused: no new batches until it is resumed", self.queue)
        else:
            log.info("pgbroker: queue %r was resumed: batches go on", self.queue)
