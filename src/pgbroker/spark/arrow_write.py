"""Arrow record batches into a queue, through pgmq.send_batch, in the caller's transaction.

The batches are streamed with COPY into a temporary staging table (pyarrow writes the CSV in
C++), then sent from there with pgmq.send_batch, one call per chunk and per distinct delay. Why
not COPY straight into the queue table, which is faster: send_batch is the one door every
producer goes through, and it enforces what a queue promises its readers (the message size
limit, the queue's max depth, NOTIFY), including rules added by later migrations.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import sql

from pgbroker.spark.connect import Connection
from pgbroker.spark.schema import WriteLayout

# Rows staged before they are sent: bounds the staging table (and the server's memory for the
# arrays built from it) without a round trip per small Arrow batch.
CHUNK_ROWS = 100_000

# Messages per pgmq.send_batch call. With headers the call must stay small: _send_many reads
# headers[i] for each message i, and subscripting a flat array of variable-length values walks it
# from the start, so one call costs O(n^2) in its batch size (100,000 messages with headers:
# ~20 s in one call, ~1 s in calls of 1,000). Without headers, a few thousand is fastest.
SEND_ROWS = 5_000
SEND_ROWS_WITH_HEADERS = 1_000

_STAGING = "pgbroker_spark_staging"


def send_batches(conn: Connection, queue: str, layout: WriteLayout, batches: Iterable[Any]) -> int:
    """Send the rows of ``batches`` to ``queue`` in order; returns how many were sent.

    Runs inside the caller's transaction: nothing is sent unless it commits.
    """
    import pyarrow as pa
    from pyarrow import csv

    staging = sql.Identifier(_STAGING)
    delay = {
        "seconds": sql.SQL(", delay integer"),
        "until": sql.SQL(", delay timestamptz"),
        None: sql.SQL(""),
    }
    # ON COMMIT DROP: the table lives exactly as long as the transaction that sends its rows.
    conn.execute(
        sql.SQL(
            "CREATE TEMP TABLE {} (n bigint GENERATED ALWAYS AS IDENTITY, message jsonb, headers jsonb{})"
            " ON COMMIT DROP"
        ).format(staging, delay[layout.delay])
    )
    copy_sql = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        staging, sql.SQL(", ").join(map(sql.Identifier, layout.columns))
    )
    send_sql = _send_sql(layout, staging)
    truncate_sql = sql.SQL("TRUNCATE {}").format(staging)
    write_options = csv.WriteOptions(include_header=False, quoting_style="needed")
    sent = 0
    staged = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        by_name = {name.lower(): i for i, name in enumerate(batch.schema.names)}
        table = pa.Table.from_batches([batch]).select([by_name[c] for c in layout.columns])
        sink = pa.BufferOutputStream()
        csv.write_csv(table, sink, write_options=write_options)
        with conn.cursor() as cur, cur.copy(copy_sql) as copy:
            copy.write(sink.getvalue().to_pybytes())
        staged += batch.num_rows
        if staged >= CHUNK_ROWS:
            sent += _send_staged(conn, queue, send_sql, truncate_sql)
            staged = 0
    if staged:
        sent += _send_staged(conn, queue, send_sql, truncate_sql)
    return sent


def _send_sql(layout: WriteLayout, staging: sql.Identifier) -> sql.Composed:
    """One statement sending everything staged, in row order, through pgmq.send_batch calls of at
    most SEND_ROWS messages each (and one delay each)."""
    headers = sql.SQL("array_agg(headers ORDER BY n)" if layout.headers else "NULL::jsonb[]")
    delay_column: sql.Composable = sql.SQL("")
    delay_arg: sql.Composable = sql.SQL("")
    if layout.delay is not None:
        # A row without a delay (NULL) is visible at once.
        default = sql.SQL("0" if layout.delay == "seconds" else "now()")
        delay_column = sql.SQL(", coalesce(delay, {}) AS delay").format(default)
        delay_arg = sql.SQL(", g.delay")
    return sql.SQL(
        "SELECT count(s.msg_id) FROM ("
        " SELECT array_agg(message ORDER BY n) AS msgs, {headers} AS hdrs, min(n) AS first{delay_column}"
        " FROM {staging} GROUP BY n / {rows}{group_delay} ORDER BY first) g"
        " CROSS JOIN LATERAL pgmq.send_batch(%s, g.msgs, g.hdrs{delay_arg}) AS s(msg_id)"
    ).format(
        headers=headers,
        delay_column=delay_column,
        staging=staging,
        rows=sql.Literal(SEND_ROWS_WITH_HEADERS if layout.headers else SEND_ROWS),
        group_delay=sql.SQL(", delay") if layout.delay else sql.SQL(""),
        delay_arg=delay_arg,
    )


def _send_staged(conn: Connection, queue: str, send_sql: sql.Composed, truncate_sql: sql.Composed) -> int:
    row = conn.execute(send_sql, (queue,)).fetchone()
    conn.execute(truncate_sql)
    return int(row[0]) if row else 0
