"""Fixtures of the Spark tests: one local SparkSession (local[2]) for the whole run, with the
pgbroker data source registered.

Spark takes seconds to start and each query seconds to plan, so the session is shared and kept
small (2 shuffle partitions, no UI). The tests skip, saying why, where Java or pyspark is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.spark.helpers import require_spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pgbroker.spark import session

    require_spark()
    spark_session = session.start(
        "pgbroker-tests",
        master="local[2]",
        conf={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.streaming.stopTimeout": "30s",
        },
        ship=False,
    )
    yield spark_session
    spark_session.stop()
