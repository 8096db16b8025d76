"""pgbroker on Apache Spark: the ``pgbroker`` data source and the pipeline jobs built on it.

Needs the ``spark`` extra (``pip install 'pgbroker[spark]'``: pyspark and pyarrow) and Java.
Importing this package imports neither; :func:`register` does.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Make ``format("pgbroker")`` available in a SparkSession."""
    from pgbroker.spark.source import PgbrokerDataSource

    spark.dataSource.register(PgbrokerDataSource)
