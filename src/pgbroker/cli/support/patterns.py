"""A remark for a glob of a grant or an API key that covers nothing now.

A pattern covers queues (and, for a key, streams) made later too, so one that covers none is
taken; but a typo of a queue's name (``--queue ordres``) was taken without a word, and showed
only as refusals once the role or key was used.
"""

from __future__ import annotations

from collections.abc import Iterable

from pgbroker._db.install import names_matching
from pgbroker._log_lines import say
from pgbroker.errors import PgbrokerError
from pgbroker.queues._client import Broker

__all__ = ["say_if_unmatched"]


def say_if_unmatched(broker: Broker, patterns: Iterable[str], *, streams: bool) -> None:
    """Say on stderr which of ``patterns`` cover no queue (nor stream, with ``streams``) now."""
    what = "queue or stream" if streams else "queue"
    with broker.connection() as conn:
        for pattern in patterns:
            if set(pattern) == {"*"}:  # every name: no typo there
                continue
            try:
                queues, stream_count = names_matching(conn, pattern)
            except PgbrokerError:  # a role that may not look: no remark
                return
            if queues == 0 and not (streams and stream_count):
                say(
                    f"no {what} matches {pattern!r} now (a typo?); it will cover those made later "
                    "that do (pgbroker list shows the queues)",
                    event="command.pattern_unmatched",
                    pattern=pattern,
                )
