"""The SparkSession of a pipeline job: checked requirements, sensible local defaults, the data
source registered and pgbroker shipped to the executors.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from pgbroker.spark import register
from pgbroker.spark.requirements import JAVA_HINT, MissingRequirement, check_java, check_python_packages

DEFAULT_MASTER = "local[*]"

# Where a local session listens: its driver, block manager and Python workers are all on this
# machine, so loopback is enough; Spark would otherwise pick the address of a network interface
# (and warn that the hostname resolves to a loopback address).
LOOPBACK = "127.0.0.1"


def is_local(master: str | None) -> bool:
    return master is not None and master.startswith("local")


def under_spark_submit() -> bool:
    """True when spark-submit (or pyspark's shell) started this Python: the JVM is already up."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def defaults(master: str | None) -> dict[str, str]:
    conf = {
        # Dates and buckets in job output are UTC days and hours, wherever the job runs.
        "spark.sql.session.timeZone": "UTC",
        # The jobs print their own progress; Spark's bars would garble it.
        "spark.ui.showConsoleProgress": "false",
        # Plain log lines on the console, not JSON.
        "spark.log.structuredLogging.enabled": "false",
        # Warnings and errors only, from the start of the SparkContext on (a conf may lower it).
        "spark.log.level": "WARN",
    }
    if is_local(master):
        # 200 shuffle partitions (Spark's default, sized for clusters) cost seconds of task
        # overhead per aggregation on one machine.
        conf["spark.sql.shuffle.partitions"] = str(2 * (os.cpu_count() or 1))
        conf["spark.driver.host"] = LOOPBACK
        conf["spark.driver.bindAddress"] = LOOPBACK
    return conf


def start(
    app_name: str, *, master: str | None = None, conf: Mapping[str, str] | None = None, ship: bool = True
) -> Any:
    """A SparkSession for ``app_name``, with ``format("pgbroker")`` registered.

    ``master`` defaults to local[*], except under spark-submit, whose --master wins; a local
    session listens on 127.0.0.1 only (spark.driver.host, spark.driver.bindAddress and
    $SPARK_LOCAL_IP, unless given). With
    ``ship`` pgbroker is zipped and added to the executors' path, and an executor is asked to
    import what tasks need, so a missing dependency fails here with its name.
    """
    check_python_packages()
    submitted = under_spark_submit()
    if not submitted:
        check_java()
        master = master or DEFAULT_MASTER
    # The executors' Python must be this one (with pgbroker, psycopg and pyarrow), not whatever
    # `python3` is on the PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if is_local(master):
        # Read by the JVM as it starts, before any conf: the address its first lines resolve.
        os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)

    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in {**defaults(master), **(conf or {})}.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except PySparkRuntimeError as exc:
        if exc.getCondition() == "JAVA_GATEWAY_EXITED":
            raise MissingRequirement(f"Spark's Java process did not start: {exc}", hint=JAVA_HINT) from exc
        raise
    if ship:
        from pgbroker.spark import shipping

        shipping.ship(spark)
        shipping.check_executors(spark)
    # After shipping: registering pickles the data source with the Python files added so far,
    # and its readers and writers get only those on the executors (SQL tasks do not see files
    # added to the SparkContext later).
    register(spark)
    return spark
