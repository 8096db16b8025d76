"""The data source's options on a stream, and what a DataFrame written to a stream may hold: pure
logic, no Spark session and no database."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from pgbroker.spark.options import OptionError
from pgbroker.spark.schema import SchemaMismatch, spark_ddl
from pgbroker.spark.stream.options import STREAM_COLUMNS, is_stream, parse_stream_read
from pgbroker.spark.stream.ranges import share
from pgbroker.spark.stream.sink import stream_write_columns

DSN = "host=/nowhere dbname=x"


def test_stream_read_defaults_and_columns() -> None:
    opts = parse_stream_read({"Stream": "Clicks", "DSN": DSN, "group": "lake"}, streaming=True)
    assert (opts.stream, opts.group, opts.columns) == ("clicks", "lake", STREAM_COLUMNS)
    assert (opts.starting_offset, opts.max_rows_per_batch, opts.from_id, opts.to_id) == (
        "earliest",
        None,
        1,
        None,
    )
    assert spark_ddl(STREAM_COLUMNS) == (
        "partition INT, id BIGINT, key STRING, enqueued_at TIMESTAMP, headers STRING, message STRING"
    )
    picked = parse_stream_read({"stream": "s", "dsn": DSN, "columns": "message,id"}, streaming=False)
    assert picked.columns == ("id", "message")


@pytest.mark.parametrize(
    ("options", "streaming", "error"),
    [
        ({"stream": "s"}, True, "needs option group"),
        ({"stream": "s", "group": "g", "fromId": "5"}, True, "bound a batch read"),
        ({"stream": "s", "mode": "claim"}, False, "unknown option 'mode'"),
        ({"stream": "s", "columns": "msg_id"}, False, "not a column here"),
        ({"stream": "s", "toId": "-1"}, False, "at least 0"),
    ],
)
def test_stream_read_errors(options: dict[str, str], streaming: bool, error: str) -> None:
    with pytest.raises(OptionError, match=error):
        parse_stream_read({"dsn": DSN, **options}, streaming=streaming)


def test_queue_or_stream() -> None:
    assert is_stream({"stream": "s"})
    assert not is_stream({"queue": "q"})
    with pytest.raises(OptionError, match="both given"):
        is_stream({"stream": "s", "queue": "q"})


def test_stream_write_columns() -> None:
    s = T.StringType()
    schema = T.StructType([T.StructField("Headers", s), T.StructField("message", s), T.StructField("key", s)])
    assert stream_write_columns(schema) == ("message", "key", "headers")
    with pytest.raises(SchemaMismatch, match="needs a column 'message'"):
        stream_write_columns(T.StructType([T.StructField("key", s)]))
    with pytest.raises(SchemaMismatch, match="'delay'"):
        stream_write_columns(
            T.StructType([T.StructField("message", s), T.StructField("delay", T.IntegerType())])
        )
    with pytest.raises(SchemaMismatch, match="must be a STRING"):
        stream_write_columns(T.StructType([T.StructField("message", s), T.StructField("key", T.LongType())]))


@pytest.mark.parametrize(
    ("available", "limit", "taken"),
    [
        ([0, 171_000, 0, 57_000], 100_000, [0, 50_000, 0, 50_000]),
        ([5, 100, 100], 100, [5, 48, 47]),  # what a short partition leaves goes to the others
        ([10, 10, 10], 7, [3, 2, 2]),
        ([1, 1], 10, [1, 1]),
        ([0, 0], 10, [0, 0]),
    ],
)
def test_batch_limit_shared_over_partitions(available: list[int], limit: int, taken: list[int]) -> None:
    assert share(available, limit) == taken
