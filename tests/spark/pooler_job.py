"""A compact Spark job for the pooler test, run in its own process so that its JVM and Python
workers inherit ``PGBROKER_POOLER``: a batch write of TOTAL messages to queue src, a batch read
of them, and a streaming query (available-now, several micro-batches) from src to dst. It prints
what it read as one JSON line; the test looks at the queues itself.

``python -m tests.spark.pooler_job DSN CHECKPOINT``
"""

from __future__ import annotations

import json
import sys

from pgbroker.spark import session
from tests.spark.helpers import stream

TOTAL = 20_000
PER_BATCH = 5_000


def main(dsn: str, checkpoint: str) -> None:
    spark = session.start(
        "pgbroker-pooler-test",
        master="local[2]",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
        ship=False,
    )
    try:
        # Two partitions, each sending twenty statements of 1,000 on one connection: past
        # psycopg's prepare threshold, so a prepared statement would meet the pooler.
        messages = spark.range(TOTAL, numPartitions=2).selectExpr("to_json(named_struct('n', id)) AS message")
        messages.write.format("pgbroker").option("queue", "src").option("dsn", dsn).mode("append").save()
        read = (
            spark.read.format("pgbroker").option("queue", "src").option("dsn", dsn)
            .option("numPartitions", "2").load().select("message").collect()
        )  # fmt: skip
        query = stream(spark, dsn, "src", "dst", checkpoint, maxRowsPerBatch=str(PER_BATCH))
        query.awaitTermination()
        batches = sum(1 for p in query.recentProgress if int(p["numInputRows"]) > 0)
        print(json.dumps({"read": sorted(json.loads(r.message)["n"] for r in read), "batches": batches}))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
