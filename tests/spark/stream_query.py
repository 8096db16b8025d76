"""A streaming query from stream "events" (group "spark") to stream "copied", run in a process of
its own so that a test can SIGKILL its driver: python -m tests.spark.stream_query DSN CHECKPOINT.
It processes what is there (Trigger.AvailableNow) and prints "done" when it ends."""

from __future__ import annotations

import sys


def main(dsn: str, checkpoint: str) -> None:
    from pgbroker.spark import session

    spark = session.start(
        "pgbroker-stream-kill",
        master="local[2]",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
        ship=False,
    )
    df = (
        spark.readStream.format("pgbroker")
        .option("dsn", dsn)
        .option("stream", "events")
        .option("group", "spark")
        .option("maxRowsPerBatch", "2000")
        .load()
    )
    query = (
        df.select("message", "key", "headers")
        .writeStream.format("pgbroker")
        .option("dsn", dsn)
        .option("stream", "copied")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
