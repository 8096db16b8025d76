-- The Spark data source's stream statements (spark/stream/: the streaming and batch sources, the
-- sink). {log} and {table} are composed in Python as a stream's log table (pgbroker.s_x),
-- {columns} as the read's column list, other braces as literals.

-- name: spark_stream_check
-- That a stream exists, or pgbroker's StreamNotFound.
SELECT pgbroker._stream_row(%s)

-- name: spark_stream_waiting
-- Rows waiting per partition after each start up to a bound, counted up to a limit, in partition order.
SELECT (SELECT count(*) FROM (SELECT 1 FROM {log} l
                              WHERE l.partition = u.p AND l.id > u.a AND l.id <= %s LIMIT %s) x)
FROM unnest(%s::integer[], %s::bigint[]) WITH ORDINALITY AS u(p, a, n)
ORDER BY u.n

-- name: spark_stream_kth_after
-- Per cut partition, the id of the k-th row after its start (the last of its share).
SELECT u.p, (SELECT l.id FROM {log} l WHERE l.partition = u.p AND l.id > u.a AND l.id <= %s
             ORDER BY l.id OFFSET u.k - 1 LIMIT 1)
FROM unnest(%s::integer[], %s::bigint[], %s::integer[]) AS u(p, a, k)

-- name: spark_stream_send
-- Append one Arrow chunk to a stream (messages, headers and keys as arrays).
SELECT count(*) FROM pgbroker.stream_send_many(%s, %b, %b, %s::text[])

-- name: spark_stream_partition_rows
-- A stream partition's rows after one id up to another, in id order (the log's index).
SELECT {columns} FROM {table} WHERE partition = {partition} AND id > {after} AND id <= {last} ORDER BY id

-- name: spark_stream_bound
-- The id up to which a stream's log is safe to read, and the first candidate past it.
SELECT safe_id, candidate_id FROM pgbroker.spark_stream_bound(%s)

-- name: spark_stream_start
-- A Spark group's start on a stream, per partition, creating the group at 'start' or 'end'.
SELECT acked_id FROM pgbroker.spark_stream_start(%s, %s, %s)

-- name: spark_stream_commit
-- Move a Spark group's cursors to the ids of a committed batch.
SELECT pgbroker.spark_stream_commit(%s, %s, %s, %s)

-- name: spark_stream_group_check
-- That a stream's group exists, or pgbroker's error naming it.
SELECT pgbroker._stream_group_row(%s, %s)

-- name: spark_stream_group_cursors
-- A group's cursors, by partition.
SELECT p.acked_id FROM pgbroker.stream_cursor c
CROSS JOIN LATERAL pgbroker._stream_positions(c.stream_name, c.group_name, ARRAY[c.partition]) p
WHERE c.stream_name = %s AND c.group_name = %s ORDER BY c.partition

-- name: spark_stream_partitions
-- How many partitions a stream has (StreamNotFound when there is no such stream).
SELECT (pgbroker._stream_row(%s)).partitions
