"""The Spark stage of the demo (``make demo``): the archive the tour just filled, analysed by Spark
through the pgbroker data source, and a result sent back to a queue through its exactly-once sink.

It comes after the orders stage, whose archive it reads; it needs the ``spark`` extra and Java,
and says so (without failing the tour) when either is missing: pyspark is imported only here.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pgbroker.demo.stage import Demo

__all__ = ["spark_stage"]

ORDERS = "demo_orders"
TOTALS = "demo_customer_totals"
LABEL = "spark"
# Spark's log in the demo: errors only, from the JVM's first line on (spark.log.level takes over
# once the SparkContext runs). Its warnings are for clusters: native Hadoop libraries, task sizes.
LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
"""


def _quiet_conf(log_config: Path) -> dict[str, str]:
    """The demo session's conf: no UI, and Spark's log at ERROR (the config written here)."""
    log_config.write_text(LOG4J2)
    return {
        "spark.ui.enabled": "false",
        "spark.log.level": "ERROR",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log_config}",
    }


def spark_stage(demo: Demo) -> None:
    from pgbroker.spark.requirements import MissingRequirement, check_java, check_python_packages

    try:
        check_python_packages()
        check_java()
    except MissingRequirement as exc:
        demo.say(LABEL, f"skipped: {exc.message}")
        demo.say("", f"({exc.hint})")
        return
    from pgbroker.spark import session

    dsn = demo.dsn()
    totals = demo.broker.create_queue(TOTALS)
    totals.purge()

    started = time.perf_counter()
    demo.say(LABEL, "starting a local Spark session (local[*]) with the pgbroker data source")
    log = Path(tempfile.gettempdir()) / "pgbroker-demo-spark.log"
    conf = _quiet_conf(log.with_suffix(".log4j2.properties"))
    with _stderr_to(log):  # the JVM inherits stderr at launch and keeps it: its log goes to the file
        spark = session.start("pgbroker demo", conf=conf, ship=False)
    demo.say("", f"Spark's own log: {log}")
    try:
        demo.say("", f"ready in {time.perf_counter() - started:.1f} s")
        _analyse_archive(demo, spark, dsn)
        _send_totals(demo, spark, dsn)
    finally:
        spark.stop()


@contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` meanwhile, so that a child process started now writes there.

    The demo is quiet by default; Spark's start-up chatter (log4j profile, hostname warnings)
    comes from the JVM, which only a redirect at its launch can keep off the terminal.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("wb") as log:  # this run's alone
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _analyse_archive(demo: Demo, spark: Any, dsn: str) -> None:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    archive = (
        spark.read.format("pgbroker")
        .option("queue", ORDERS)
        .option("dsn", dsn)
        .option("archive", "true")
        .option("columns", "msg_id,read_ct,enqueued_at,archived_at")
        .load()
    )
    latency = (F.unix_micros("archived_at") - F.unix_micros("enqueued_at")) / F.lit(1000.0)
    row = archive.agg(
        F.count("*").alias("messages"),
        F.percentile_approx(latency, [0.5, 0.99], 10_000).alias("q"),
        F.max(latency).alias("max"),
    ).first()
    assert row is not None
    deliveries = archive.groupBy("read_ct").count().orderBy("read_ct").collect()
    demo.say(
        "",
        f"read the archive ({row['messages']:,} messages, a peek in parallel msg_id ranges) in "
        f"{time.perf_counter() - started:.1f} s",
    )
    if row["messages"]:
        demo.say(
            "",
            f"latency enqueued -> archived: p50 {row['q'][0]:,.0f} ms, p99 {row['q'][1]:,.0f} ms, "
            f"max {row['max']:,.0f} ms",
        )
        demo.say(
            "", "deliveries per message: " + ", ".join(f"{r['read_ct']}: {r['count']:,}" for r in deliveries)
        )


def _send_totals(demo: Demo, spark: Any, dsn: str) -> None:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    orders = spark.read.format("pgbroker").option("queue", ORDERS).option("dsn", dsn)
    orders = orders.option("archive", "true").option("columns", "message").load()
    order = F.from_json("message", "customer string, total_cents long")
    per_customer = (
        orders.select(order.alias("o"))
        .groupBy("o.customer")
        .agg(F.count("*").alias("orders"), F.sum("o.total_cents").alias("total_cents"))
    )
    messages = per_customer.select(F.to_json(F.struct("customer", "orders", "total_cents")).alias("message"))
    messages.write.format("pgbroker").option("queue", TOTALS).option("dsn", dsn).mode("append").save()
    expected = per_customer.count()
    sent = demo.broker.metrics(TOTALS).queue_length
    ok = sent == expected
    demo.ok = demo.ok and ok
    demo.say(
        "",
        f"sent {sent} per-customer totals to queue {TOTALS} (one transaction per partition, keyed for "
        f"exactly-once) in {time.perf_counter() - started:.1f} s: "
        + ("OK" if ok else f"FAILED, expected {expected}"),
    )
