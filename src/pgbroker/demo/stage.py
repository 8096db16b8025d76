"""What every stage of the demo gets: a Demo, with the broker, where to write, and the verdict."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from pgbroker._db.wakeups import conninfo_of
from pgbroker.queues._client import Broker

__all__ = ["Demo", "Stage"]

LABEL_WIDTH = 10


@dataclass
class Demo:
    """State the stages share; a stage that finds something wrong sets ``ok`` to False."""

    broker: Broker
    out: TextIO
    ok: bool = True

    def say(self, label: str, text: str = "") -> None:
        print(f"{label:<{LABEL_WIDTH}} {text}".rstrip(), file=self.out, flush=True)

    def progress(self, label: str, text: str) -> None:
        # Only a terminal can redraw a line; in a log the final line alone is enough.
        if self.out.isatty():
            print(f"\r{label:<{LABEL_WIDTH}} {text}", end="", file=self.out, flush=True)

    def end_progress(self) -> None:
        if self.out.isatty():
            print("\r\033[K", end="", file=self.out, flush=True)

    def dsn(self) -> str:
        """The conninfo of the broker's database, for a stage that connects on its own terms."""
        with self.broker.connection() as conn:
            return conninfo_of(conn.info)


Stage = Callable[[Demo], None]
