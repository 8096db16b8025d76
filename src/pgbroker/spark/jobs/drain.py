"""Job ``drain``: a queue into Parquet files partitioned by date (UTC day of enqueued_at), exactly
once, printing a line per micro-batch.

    pgbroker pipeline drain orders --output /data/orders
    spark-submit --py-files pgbroker.zip .../pgbroker/spark/jobs/drain.py orders --output ...

Spark's file sink commits each micro-batch's files in its _spark_metadata log, and the source
releases (archives or deletes) a batch's messages only after that: a job killed at any point and
started again with the same checkpoint neither loses nor duplicates a message. Read the output
with Spark (which follows _spark_metadata); plain Parquet readers may also see the files of a
batch that was being written at the crash.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pgbroker.spark.jobs import common, restarts

PROG = "pgbroker pipeline drain"
DESCRIPTION = "Drain a queue into Parquet files partitioned by date, exactly once."
COLUMNS = ("msg_id", "read_ct", "enqueued_at", "message", "headers")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE", help="the queue to drain")
    parser.add_argument("--output", type=Path, required=True, help="directory of the Parquet dataset")
    common.add_stream_arguments(parser, checkpoint_required=False)
    common.add_spark_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    common.check_requirements()
    dsn = common.database(args)
    common.check_queue(dsn, args.queue)
    output = args.output.resolve()
    checkpoint = (args.checkpoint or output / "_checkpoint").resolve()
    spark = common.start_spark(args, f"pgbroker drain {args.queue}")
    messages = common.read_stream(spark, args, dsn, args.queue, consumer=f"drain:{args.queue}")
    rows = messages.select(*COLUMNS).withColumn("date", F.to_date("enqueued_at"))
    writer = (
        rows.writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .partitionBy("date")
        .queryName(f"drain {args.queue}")
    )
    print(f"drain: {args.queue} -> {output} (checkpoint {checkpoint})", flush=True)
    restarts.watch_restarting(lambda: common.trigger(writer, args).start(), "drain", dsn)
    return common.EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return common.job_main(run, add_arguments, PROG, DESCRIPTION, argv)


if __name__ == "__main__":
    sys.exit(main())
