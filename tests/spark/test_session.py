"""The session pgbroker starts (pgbroker.spark.session): a local one listens on loopback only, so
that its driver, block manager and Python workers never use another address of the machine."""

from __future__ import annotations

import os
from typing import Any

from pgbroker.spark.session import defaults

LOOPBACK = "127.0.0.1"


def test_a_local_session_is_bound_to_loopback(spark: Any) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.host") == LOOPBACK
    assert conf.get("spark.driver.bindAddress") == LOOPBACK
    assert os.environ["SPARK_LOCAL_IP"] == LOOPBACK  # what the JVM read when it started


def test_a_cluster_session_keeps_the_addresses_of_its_cluster() -> None:
    local = defaults("local[2]")
    assert (local["spark.driver.host"], local["spark.driver.bindAddress"]) == (LOOPBACK, LOOPBACK)
    assert "spark.driver.host" not in defaults("spark://127.0.0.1:7077")
    assert "spark.driver.host" not in defaults(None)  # spark-submit's own settings
