"""The options of the ``pgbroker`` data source on a stream (option ``stream`` instead of ``queue``).

Pure Python, like pgbroker.spark.options (whose checks it shares): a bad option fails on the
driver with a message that names it, before any task runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from pgbroker.spark.options import DEFAULT_WATERMARK_WAIT_MS, OptionError, Options, Start

STREAM_COLUMNS = ("partition", "id", "key", "enqueued_at", "headers", "message")

_READ_OPTIONS = (
    "stream",
    "dsn",
    "group",
    "columns",
    "maxRowsPerBatch",
    "startingOffset",
    "watermarkWaitMs",
    "fromId",
    "toId",
)
_WRITE_OPTIONS = ("stream", "dsn")


@dataclass(frozen=True)
class StreamReadOptions:
    stream: str
    dsn: str
    group: str | None  # streaming: required; batch: read from the group's cursor (it does not move)
    columns: tuple[str, ...]
    max_rows_per_batch: int | None
    starting_offset: Start  # where a group made by the query starts: earliest (start) or latest (end)
    watermark_wait_ms: int
    from_id: int  # batch: the first id read (inclusive)
    to_id: int | None  # batch: the last id read (inclusive); None: up to the safe id


@dataclass(frozen=True)
class StreamWriteOptions:
    stream: str
    dsn: str


def is_stream(options: Mapping[str, str]) -> bool:
    """Whether the options name a stream; refuses both a queue and a stream."""
    keys = {key.lower() for key, value in options.items() if value is not None and str(value).strip()}
    if "stream" in keys and "queue" in keys:
        raise OptionError(
            "options queue and stream are both given: the pgbroker data source reads or writes one of them",
            hint="Drop option queue to use the stream, or option stream to use the queue.",
        )
    return "stream" in keys


def parse_stream_read(options: Mapping[str, str], *, streaming: bool) -> StreamReadOptions:
    opts = Options(options, _READ_OPTIONS)
    group = opts.text("group")
    if streaming and group is None:
        raise OptionError(
            "a streaming read of a stream needs option group: the consumer group whose cursor the "
            "query moves once a batch is committed",
            hint="For example .option('group', 'lake'); it is made at the query's first start, and "
            "must not be shared with other consumers.",
        )
    if streaming and (opts.text("fromId") or opts.text("toId")):
        raise OptionError(
            "options fromId and toId bound a batch read; a streaming read starts at its group's cursor",
            hint="Drop them, or use spark.read for a range of ids.",
        )
    from_id = opts.integer("fromId", 1, minimum=1)
    to_id = opts.optional_integer("toId", minimum=0)
    return StreamReadOptions(
        stream=_name(opts),
        dsn=opts.dsn(),
        group=group,
        columns=opts.columns(STREAM_COLUMNS),
        max_rows_per_batch=opts.optional_integer("maxRowsPerBatch", minimum=1),
        starting_offset=cast(Start, opts.choice("startingOffset", ("earliest", "latest"), "earliest")),
        watermark_wait_ms=opts.integer("watermarkWaitMs", DEFAULT_WATERMARK_WAIT_MS, minimum=0),
        from_id=from_id,
        to_id=to_id,
    )


def parse_stream_write(options: Mapping[str, str]) -> StreamWriteOptions:
    opts = Options(options, _WRITE_OPTIONS)
    return StreamWriteOptions(stream=_name(opts), dsn=opts.dsn())


def _name(opts: Options) -> str:
    name = opts.text("stream")
    if name is None:
        raise OptionError("option stream is required", hint="For example .option('stream', 'clicks').")
    # Streams are stored lower-cased (create_stream); the log table is named after the stored name.
    return name.lower()
