"""The Spark data source named ``pgbroker``: spark.read / readStream / write / writeStream on queues.

    spark.read.format("pgbroker").option("queue", "orders").load()          # a peek, no lease
    spark.readStream.format("pgbroker").option("queue", "orders").load()    # log mode
    df.write.format("pgbroker").option("queue", "out").mode("append").save()
    df.writeStream.format("pgbroker").option("queue", "out").option("checkpointLocation", d).start()
    spark.readStream.format("pgbroker").option("stream", "clicks").option("group", "lake").load()

Options are documented in docs/spark.md and checked in pgbroker.spark.options. This module only
dispatches: every method Spark calls checks the options and hands over to a reader or writer.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pgbroker.spark.bounded import driver_answer_within
from pgbroker.spark.connect import connect, queue_table
from pgbroker.spark.options import OptionError, ReadOptions, WriteOptions, parse_read, parse_write
from pgbroker.spark.queue.batch import BatchReader, BatchWriter
from pgbroker.spark.queue.streaming_claim import ClaimStreamReader
from pgbroker.spark.queue.streaming_log import LogStreamReader
from pgbroker.spark.queue.streaming_write import StreamWriter
from pgbroker.spark.schema import WriteLayout, column_type, spark_ddl, write_layout
from pgbroker.spark.stream.dispatch import stream_read_options, stream_schema, stream_write_options
from pgbroker.spark.stream.options import is_stream
from pgbroker.spark.stream.sink import StreamAppendWriter, StreamBatchAppendWriter
from pgbroker.spark.stream.source import StreamOffsetReader, StreamRangeReader

NAME = "pgbroker"


class PgbrokerDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        # Called once, on the driver, when a read is defined: the place to fail early on a bad
        # option or a queue that does not exist.
        if is_stream(self.options):
            return stream_schema(self.options)
        options = parse_read(self.options)
        with connect(options.dsn, role="planner", answer_within=driver_answer_within()) as conn:
            queue_table(conn, options.queue, archive=options.archive)
        return spark_ddl(options.columns, options.body)

    def reader(self, schema: StructType) -> DataSourceReader:
        if is_stream(self.options):
            return StreamRangeReader(stream_read_options(self.options, schema, streaming=False))
        return BatchReader(self._read_options(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if is_stream(self.options):
            return StreamOffsetReader(stream_read_options(self.options, schema, streaming=True))
        options = self._read_options(schema)
        if options.mode == "claim":
            return ClaimStreamReader(options)
        return LogStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if is_stream(self.options):
            return StreamBatchAppendWriter(*stream_write_options(self.options, schema, overwrite))
        options, layout = _write_options(self.options, schema, overwrite)
        return BatchWriter(options, layout)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        if is_stream(self.options):
            return StreamAppendWriter(*stream_write_options(self.options, schema, overwrite))
        options, layout = _write_options(self.options, schema, overwrite)
        return StreamWriter(options, layout)

    def _read_options(self, schema: StructType) -> ReadOptions:
        options = parse_read(self.options)
        given = [(f.name, f.dataType.simpleString()) for f in schema.fields]
        if given != [(name, column_type(name, options.body)) for name in options.columns]:
            raise OptionError(
                f"the pgbroker data source reads [{spark_ddl(options.columns, options.body)}], "
                f"not the schema given [{', '.join(f'{n} {t}' for n, t in given)}]",
                hint="Leave out .schema(...), and choose columns with option columns.",
            )
        return options


def _write_options(
    given: Mapping[str, str], schema: StructType, overwrite: bool
) -> tuple[WriteOptions, WriteLayout]:
    # On the driver, once per write: fail before any task runs.
    if overwrite:
        raise OptionError(
            "a queue only takes new messages: the pgbroker sink supports append only",
            hint="Use .mode('append') (batch) or outputMode('append') (streaming).",
        )
    options = parse_write(given)
    layout = write_layout(schema, options.body)
    with connect(options.dsn, role="planner", answer_within=driver_answer_within()) as conn:
        queue_table(conn, options.queue)
    return options, layout
