"""The data source's options, the cutting of msg_id spans into partitions, and the write schema
check: pure logic, no Spark session and no database."""

from __future__ import annotations

import pytest
from pyspark.sql import types as T

from pgbroker.spark.options import ARCHIVE_COLUMNS, QUEUE_COLUMNS, OptionError, parse_read, parse_write
from pgbroker.spark.queue.partitions import split
from pgbroker.spark.schema import SchemaMismatch, spark_ddl, write_layout

DSN = "host=/nowhere dbname=x"


def read(**options: str) -> object:
    return parse_read({"queue": "q", "dsn": DSN, **options})


def test_defaults() -> None:
    opts = parse_read({"Queue": "orders", "DSN": DSN})
    assert opts.queue == "orders"
    assert opts.columns == QUEUE_COLUMNS
    assert opts.mode == "log"
    assert opts.release == "archive"
    assert opts.max_rows_per_batch is None
    assert opts.num_partitions >= 1


def test_archive_has_archived_at_and_never_releases() -> None:
    opts = parse_read({"queue": "q", "dsn": DSN, "archive": "true"})
    assert opts.columns == ARCHIVE_COLUMNS
    assert opts.release == "none"
    with pytest.raises(OptionError, match="cannot apply to the archive"):
        read(archive="true", release="delete")


def test_columns_keep_table_order() -> None:
    assert parse_read({"queue": "q", "dsn": DSN, "columns": "message, msg_id"}).columns == (
        "msg_id",
        "message",
    )
    assert spark_ddl(("msg_id", "message")) == "msg_id BIGINT, message STRING"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"numPartition": "2"}, r"unknown option 'numpartition'.*did you mean 'numPartitions'"),
        ({"numPartitions": "0"}, "numPartitions must be at least 1"),
        ({"numPartitions": "two"}, "numPartitions must be a whole number"),
        ({"archive": "maybe"}, "archive must be true or false"),
        ({"columns": "msg_id,body"}, "'body' is not a column"),
        ({"columns": "archived_at"}, "'archived_at' is not a column"),
        ({"mode": "tail"}, "mode must be one of log, claim"),
        ({"mode": "claim"}, "needs option consumer"),
        ({"mode": "claim", "consumer": "c", "release": "none"}, "needs release=archive or release=delete"),
        ({"consumer": "c"}, "consumer applies to mode=claim only"),
        ({"maxRowsPerBatch": "-5"}, "maxRowsPerBatch must be at least 1"),
        ({"leaseSeconds": "1"}, "leaseSeconds must be at least 3"),
        ({"startingOffset": "now"}, "startingOffset must be one of earliest, latest"),
    ],
)
def test_bad_read_options(options: dict[str, str], match: str) -> None:
    with pytest.raises(OptionError, match=match):
        read(**options)


def test_queue_and_database_are_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(OptionError, match="option queue is required"):
        parse_read({"dsn": DSN})
    with pytest.raises(OptionError, match="set option dsn or DATABASE_URL"):
        parse_write({"queue": "q"})
    monkeypatch.setenv("DATABASE_URL", DSN)
    assert parse_write({"queue": "q"}).dsn == DSN


def test_spark_options_are_accepted() -> None:
    assert parse_write({"queue": "q", "dsn": DSN, "checkpointLocation": "/x", "path": "y"}).queue == "q"


@pytest.mark.parametrize(
    ("first", "last", "parts", "expected"),
    [
        (1, 10, 2, [(1, 5), (6, 10)]),
        (1, 10, 3, [(1, 3), (4, 6), (7, 10)]),
        (5, 6, 4, [(5, 5), (6, 6)]),
        (7, 7, 2, [(7, 7)]),
        (3, 2, 2, []),
    ],
)
def test_split(first: int, last: int, parts: int, expected: list[tuple[int, int]]) -> None:
    assert split(first, last, parts) == expected


def test_split_covers_every_id_once() -> None:
    ranges = split(101, 100_000, 7)
    ids = [i for a, b in ranges for i in range(a, b + 1)]
    assert ids == list(range(101, 100_001))


def schema(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(name, kind) for name, kind in fields])


def test_write_layout() -> None:
    assert write_layout(schema(("message", T.StringType()))).columns == ("message",)
    layout = write_layout(
        schema(("Message", T.StringType()), ("delay", T.LongType()), ("headers", T.StringType()))
    )
    assert (layout.headers, layout.delay, layout.columns) == (
        True,
        "seconds",
        ("message", "headers", "delay"),
    )
    assert write_layout(schema(("message", T.StringType()), ("delay", T.TimestampType()))).delay == "until"


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ((("body", T.StringType()),), "cannot write column 'body'"),
        ((("headers", T.StringType()),), "needs a column 'message'"),
        (
            (("message", T.StructType([T.StructField("a", T.IntegerType())])),),
            "must be a STRING holding JSON",
        ),
        (
            (("message", T.StringType()), ("headers", T.MapType(T.StringType(), T.StringType()))),
            "JSON object",
        ),
        ((("message", T.StringType()), ("delay", T.DoubleType())), "whole seconds"),
        (
            (("message", T.StringType()), ("msg_id", T.LongType()), ("vt", T.TimestampType())),
            "'msg_id', 'vt'",
        ),
    ],
)
def test_write_schema_mismatch(fields: tuple[tuple[str, T.DataType], ...], match: str) -> None:
    with pytest.raises(SchemaMismatch, match=match):
        write_layout(schema(*fields))


def test_codec_options_go_together() -> None:
    assert parse_read({"queue": "q", "dsn": DSN}).body is None  # the stored JSON text, as before
    body = parse_write({"queue": "q", "dsn": DSN, "codec": "Avro", "avroSchema": "{}"}).body
    assert body is not None
    assert (body.codec, body.avro_schema) == ("avro", "{}")
    for bad, match in [
        ({"codec": "xml"}, "codec must be one of"),
        ({"codec": "avro"}, "avroSchema goes with codec=avro"),
        ({"codec": "msgpack", "protobufClass": "m:C"}, "protobufClass goes with codec=protobuf"),
        ({"avroSchema": "{}"}, "avroSchema goes with codec=avro"),
    ]:
        with pytest.raises(OptionError, match=match):
            parse_read({"queue": "q", "dsn": DSN, **bad})
