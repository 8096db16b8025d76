"""The Spark JVMs of the tests start with the options of a short-lived JVM.

A test's Spark driver, executors and standalone daemons run for seconds, on a small input: their
CPU goes to starting up and to the JIT's optimizing compiler, which the runs end before they
profit from. The suite is CPU-bound on two cores, and a third of its time is Spark's. With the
JIT's first tier only and the serial collector, a local session's start and first query took 15 s
of CPU instead of 26-27 s (and 12 s of wall time instead of 14-15) on the machine of stop 43.
What the jobs do is unchanged: the options are the JVM's, not Spark's or pgbroker's.

The options go into a ``spark-defaults.conf`` of the run's own, named by ``SPARK_CONF_DIR`` for
every Spark the tests start, in process or through ``pgbroker pipeline`` and ``spark-submit``
(an environment that sets ``SPARK_CONF_DIR`` itself keeps it); tests/spark/standalone.py writes
them into its cluster's own conf directory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.support.jvm import spark_defaults


def pytest_configure(config: pytest.Config) -> None:
    if "SPARK_CONF_DIR" in os.environ:
        return
    conf_dir = Path(tempfile.mkdtemp(prefix="pgbroker-spark-conf-"))
    (conf_dir / "spark-defaults.conf").write_text(spark_defaults())
    os.environ["SPARK_CONF_DIR"] = str(conf_dir)
