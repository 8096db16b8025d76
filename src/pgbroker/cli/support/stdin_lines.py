"""The lines of a command's input as they arrive, each saying whether more had arrived with it.

``pgbroker send`` and ``stream send`` send their stdin's lines in batches. A batch that waited
only to be full held the lines of a writer that pauses (``tail -f events | pgbroker send q``, a
person typing) unsent, for as long as the pause lasted, and lost them to a SIGTERM or Ctrl-C. So
a batch goes once it is full or once the input has nothing more to give right now.
"""

from __future__ import annotations

import codecs
import os
import select
from collections.abc import Iterator
from typing import TextIO

__all__ = ["lines_as_they_come"]

_CHUNK = 1 << 16


def lines_as_they_come(stream: TextIO) -> Iterator[str | None]:
    """The lines of ``stream``, their newlines left off, and None wherever the input pauses:
    nothing more has arrived yet (its end is no pause: the caller sees it end).

    A stream with a file descriptor is read with os.read, which returns what has arrived, and
    select says whether more is there: nothing waits in a buffer select cannot see. Another
    stream (a StringIO) has everything at once, and never pauses."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError):  # io.UnsupportedOperation is an OSError
        yield from (line.rstrip("\n") for line in stream)
        return
    decoder = codecs.getincrementaldecoder(stream.encoding or "utf-8")(errors=stream.errors or "strict")
    pending = ""
    while chunk := os.read(fd, _CHUNK):
        *lines, pending = (pending + decoder.decode(chunk)).split("\n")
        yield from lines
        if not select.select([fd], [], [], 0)[0]:
            yield None
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending
