"""The driver-side checks of the data source on a stream (option ``stream``): options, the schema
Spark was given, the stream's existence, and what a DataFrame written to it holds; all before any
task runs. pgbroker.spark.source calls these when the options name a stream.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql.types import StructType

from pgbroker import _sql
from pgbroker.spark.bounded import driver_answer_within
from pgbroker.spark.connect import connect
from pgbroker.spark.options import OptionError
from pgbroker.spark.schema import SPARK_TYPES, spark_ddl
from pgbroker.spark.stream.options import (
    StreamReadOptions,
    StreamWriteOptions,
    parse_stream_read,
    parse_stream_write,
)
from pgbroker.spark.stream.sink import stream_write_columns


def stream_schema(given: Mapping[str, str]) -> str:
    options = parse_stream_read(given, streaming=False)
    _check_stream(options.dsn, options.stream)
    return spark_ddl(options.columns)


def stream_read_options(
    given: Mapping[str, str], schema: StructType, *, streaming: bool
) -> StreamReadOptions:
    options = parse_stream_read(given, streaming=streaming)
    fields = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    if fields != [(name, SPARK_TYPES[name].lower()) for name in options.columns]:
        raise OptionError(
            f"the pgbroker data source reads a stream as [{spark_ddl(options.columns)}], "
            f"not the schema given [{', '.join(f'{n} {t}' for n, t in fields)}]",
            hint="Leave out .schema(...), and choose columns with option columns.",
        )
    return options


def stream_write_options(
    given: Mapping[str, str], schema: StructType, overwrite: bool
) -> tuple[StreamWriteOptions, tuple[str, ...]]:
    if overwrite:
        raise OptionError(
            "a stream only takes new messages: the pgbroker sink supports append only",
            hint="Use .mode('append') (batch) or outputMode('append') (streaming).",
        )
    options = parse_stream_write(given)
    columns = stream_write_columns(schema)
    _check_stream(options.dsn, options.stream)
    return options, columns


def _check_stream(dsn: str, stream: str) -> None:
    with connect(dsn, role="planner", answer_within=driver_answer_within()) as conn:
        conn.execute(
            _sql.queries("spark_stream")["spark_stream_check"], (stream,)
        )  # StreamNotFound names the fix
