"""The options of the tests' short-lived Spark JVMs (tests/plugins/spark_jvm.py says why)."""

from __future__ import annotations

#: The JIT's first tier only (no optimizing compiles that a run of seconds ends before it profits
#: from) and one GC thread: the cheapest start for a JVM of seconds.
SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_defaults() -> str:
    """Lines of a spark-defaults.conf giving every driver and executor those options. The
    default options, which Spark puts before an application's own extraJavaOptions (the demo
    sets its log configuration so), rather than replacing them."""
    return (
        f"spark.driver.defaultJavaOptions {SHORT_LIVED_JVM_OPTIONS}\n"
        f"spark.executor.defaultJavaOptions {SHORT_LIVED_JVM_OPTIONS}\n"
    )
