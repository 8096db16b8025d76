"""A Query: one client operation as SQL text, its parameters and how to decode its rows.

Built without I/O by the query layer (_queries.py, streams/_queries.py), so a sync and an async
executor run the same Query objects and no operation is written twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, LiteralString, TypeAlias, TypeVar

from pgbroker._db.names import check_queue_name, check_stream_name

T = TypeVar("T")
Row: TypeAlias = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Query(Generic[T]):
    sql: LiteralString
    params: Mapping[str, Any]
    decode: Callable[[list[Any]], T]
    check_queue: Callable[[object], object] = check_queue_name
    # It stores messages: a connection lost while it commits (run as its own transaction)
    # leaves the outcome unknown (pgbroker.errors.OutcomeUnknown), not merely failed.
    sends: bool = False
    # What each row is made into as it is fetched, before decode takes the list of them: a read's
    # records are then built in the fetch's slices, with the event loop run between two
    # (pgbroker._db.fetch), not in one piece after it. None: decode takes the rows as they come.
    row: Callable[[Row], Any] | None = None

    def __post_init__(self) -> None:
        # Every name is judged before any query, by the engine's rule (a NUL, which libpq cannot
        # even send, included).
        if "queue" in self.params:
            self.check_queue(self.params["queue"])
        if "stream" in self.params:
            check_stream_name(self.params["stream"])
