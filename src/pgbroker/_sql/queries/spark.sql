-- The Spark data source's shared statements (spark/: connections, Arrow reads and writes, the
-- exactly-once sink, the jobs' harness). spark_queue.sql and spark_stream.sql hold those of its
-- queue and stream sources. Placeholders in braces are composed in Python with psycopg's sql.

-- name: spark_session_utc
-- Timestamps in UTC for every connection, so executors agree whatever the server's setting.
SET TimeZone = 'UTC'

-- name: spark_session_iso_dates
-- ISO dates for every connection, the text form the CSV reader parses.
SET DateStyle = 'ISO'

-- name: spark_queue_table
-- The table of a queue or its archive ('q' or 'a'), or pgbroker's QueueNotFound.
SELECT pgbroker._table(%s, %s)

-- name: spark_read_setting
-- Set a setting a read's SELECT needs, for its transaction only (arrow_read.copy_batches says why).
SELECT set_config(%s, %s, true)

-- name: spark_copy_out
-- A read's rows as CSV; {select} is the composed SELECT of the rows.
COPY ({select}) TO STDOUT (FORMAT csv)

-- name: spark_send_batch
-- Send one Arrow chunk to a queue; {args} are the composed arguments of pgmq.send_batch.
SELECT count(*) FROM pgmq.send_batch({args})

-- name: spark_sink_begin
-- Start a sink partition's write; false when an earlier attempt already committed it.
SELECT pgbroker.spark_sink_begin(%s, %s, %s, %s)

-- name: spark_sink_finish
-- Record how many messages a sink partition sent, in the write's transaction.
SELECT pgbroker.spark_sink_finish(%s, %s, %s, %s)

-- name: spark_sink_forget
-- Drop the sink keys of batches that can never be replayed.
SELECT pgbroker.spark_sink_forget(%s, %s)

-- name: spark_server_started_at
-- When the server started, to see a restart.
SELECT pg_postmaster_start_time()
