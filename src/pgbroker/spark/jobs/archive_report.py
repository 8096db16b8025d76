"""Job ``archive-report``: what a queue's archive says about its traffic, as Parquet and PNG charts.

    pgbroker pipeline archive-report orders --output /reports/orders

Writes, under the output directory:
  throughput/  messages enqueued and archived per time bucket         throughput.png
  latency/     end-to-end latency (enqueued_at -> archived_at) per bucket: p50, p90, p99, max
                                                                      latency.png
  summary/     the latency percentiles over the whole archive (also printed)
  read_ct/     how many messages needed 1, 2, 3... deliveries       read_ct.png
A bucket is a minute, an hour or a day (--bucket; by default the one giving at most a few
hundred buckets over the archive's span). The archive is read as a batch peek: it is not changed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pgbroker.spark.jobs import charts, common

PROG = "pgbroker pipeline archive-report"
DESCRIPTION = "Throughput, end-to-end latency and delivery counts from a queue's archive."
PERCENTILES = (0.5, 0.9, 0.95, 0.99, 0.999)
BUCKETS = {"minute": 60, "hour": 3600, "day": 86400}
# With --bucket auto: the smallest bucket that keeps the charts readable.
MAX_AUTO_BUCKETS = 500


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE", help="the queue whose archive to analyse")
    parser.add_argument(
        "--output", type=Path, required=True, help="directory for the Parquet files and charts"
    )
    parser.add_argument("--bucket", choices=["auto", *BUCKETS], default="auto", help="time bucket (auto)")
    parser.add_argument(
        "--since", type=datetime.fromisoformat, metavar="TIME", help="archived at or after (ISO)"
    )
    parser.add_argument("--until", type=datetime.fromisoformat, metavar="TIME", help="archived before (ISO)")
    common.add_spark_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from pyspark.sql import functions as F

    common.check_requirements()
    charts.check_matplotlib()
    dsn = common.database(args)
    common.check_queue(dsn, args.queue)
    output = args.output.resolve()
    spark = common.start_spark(args, f"pgbroker archive-report {args.queue}")
    archive = (
        spark.read.format("pgbroker")
        .option("queue", args.queue)
        .option("dsn", dsn)
        .option("archive", "true")
        .option("columns", "msg_id,read_ct,enqueued_at,archived_at")
        .load()
    )
    if args.since:
        archive = archive.where(F.col("archived_at") >= F.lit(args.since))
    if args.until:
        archive = archive.where(F.col("archived_at") < F.lit(args.until))
    archive = archive.withColumn(
        "latency_ms", (F.unix_micros("archived_at") - F.unix_micros("enqueued_at")) / F.lit(1000.0)
    ).cache()

    span = archive.agg(F.count("*"), F.min("archived_at"), F.max("archived_at")).first()
    assert span is not None
    count, first, last = span[0], span[1], span[2]
    if count == 0:
        print(f"archive-report: the archive of {args.queue!r} is empty{_range(args)}: nothing to report")
        return common.EXIT_OK
    bucket = args.bucket if args.bucket != "auto" else auto_bucket((last - first).total_seconds())
    report = Report(archive, bucket)

    output.mkdir(parents=True, exist_ok=True)
    throughput = report.throughput()
    latency = report.latency()
    summary = report.summary()
    read_ct = report.read_ct()
    for name, frame in (
        ("throughput", throughput),
        ("latency", latency),
        ("summary", summary),
        ("read_ct", read_ct),
    ):
        frame.coalesce(1).write.mode("overwrite").parquet(str(output / name))

    throughput_rows = [r.asDict() for r in throughput.collect()]
    latency_rows = [r.asDict() for r in latency.collect()]
    read_ct_rows = [r.asDict() for r in read_ct.collect()]
    summary_row = summary.first()
    assert summary_row is not None
    pngs = [
        charts.throughput(throughput_rows, bucket, output / "throughput.png", args.queue),
        charts.latency(latency_rows, bucket, output / "latency.png", args.queue),
        charts.read_ct(read_ct_rows, output / "read_ct.png", args.queue),
    ]
    archive.unpersist()

    print(f"archive-report: {args.queue}: {count:,} archived messages, {first} .. {last} UTC{_range(args)}")
    print(
        f"  per {bucket}: peak {max(r['archived'] for r in throughput_rows):,} archived, over "
        f"{len(throughput_rows):,} {bucket}{'' if len(throughput_rows) == 1 else 's'}"
    )
    s = summary_row.asDict()
    print(
        "  latency (enqueued -> archived): "
        + ", ".join(f"p{_pct(p)} {_ms(s[f'p{_pct(p)}_ms'])}" for p in PERCENTILES)
        + f", max {_ms(s['max_ms'])}"
    )
    print(
        "  deliveries (read_ct): "
        + ", ".join(f"{r['read_ct']}: {r['messages']:,}" for r in read_ct_rows[:8])
        + (" ..." if len(read_ct_rows) > 8 else "")
    )
    print(
        f"  wrote {output}/{{throughput,latency,summary,read_ct}} (Parquet) and "
        + ", ".join(p.name for p in pngs)
    )
    return common.EXIT_OK


class Report:
    """The aggregations, each a small DataFrame."""

    def __init__(self, archive: Any, bucket: str) -> None:
        from pyspark.sql import functions as F

        self.archive = archive
        self.bucket = bucket
        self.F = F

    def _bucket(self, column: str) -> Any:
        return self.F.date_trunc(self.bucket, column).alias("bucket")

    def throughput(self) -> Any:
        F = self.F
        archived = self.archive.groupBy(self._bucket("archived_at")).agg(F.count("*").alias("archived"))
        enqueued = self.archive.groupBy(self._bucket("enqueued_at")).agg(F.count("*").alias("enqueued"))
        return (
            archived.join(enqueued, "bucket", "full_outer")
            .select(
                "bucket",
                F.coalesce("enqueued", F.lit(0)).alias("enqueued"),
                F.coalesce("archived", F.lit(0)).alias("archived"),
            )
            .orderBy("bucket")
        )

    def latency(self) -> Any:
        F = self.F
        quantiles = F.percentile_approx("latency_ms", [0.5, 0.9, 0.99], 10_000)
        return (
            self.archive.groupBy(self._bucket("archived_at"))
            .agg(quantiles.alias("q"), F.max("latency_ms").alias("max_ms"), F.count("*").alias("messages"))
            .select(
                "bucket",
                "messages",
                F.col("q")[0].alias("p50_ms"),
                F.col("q")[1].alias("p90_ms"),
                F.col("q")[2].alias("p99_ms"),
                "max_ms",
            )
            .orderBy("bucket")
        )

    def summary(self) -> Any:
        F = self.F
        quantiles = F.percentile_approx("latency_ms", list(PERCENTILES), 100_000)
        return self.archive.agg(
            F.count("*").alias("messages"),
            quantiles.alias("q"),
            F.max("latency_ms").alias("max_ms"),
            F.avg("latency_ms").alias("mean_ms"),
        ).select(
            "messages",
            *(F.col("q")[i].alias(f"p{_pct(p)}_ms") for i, p in enumerate(PERCENTILES)),
            "max_ms",
            "mean_ms",
        )

    def read_ct(self) -> Any:
        F = self.F
        return self.archive.groupBy("read_ct").agg(F.count("*").alias("messages")).orderBy("read_ct")


def auto_bucket(span_seconds: float) -> str:
    for name, seconds in BUCKETS.items():
        if span_seconds / seconds <= MAX_AUTO_BUCKETS:
            return name
    return "day"


def _pct(p: float) -> str:
    return f"{p * 100:g}".replace(".", "")


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f} ms" if value < 10_000 else f"{value / 1000:,.1f} s"


def _range(args: argparse.Namespace) -> str:
    parts = [f"since {args.since}" if args.since else "", f"until {args.until}" if args.until else ""]
    text = ", ".join(p for p in parts if p)
    return f" ({text})" if text else ""


def main(argv: Sequence[str] | None = None) -> int:
    return common.job_main(run, add_arguments, PROG, DESCRIPTION, argv)


if __name__ == "__main__":
    sys.exit(main())
