-- The Spark data source's queue statements (spark/queue/: the batch source, the streaming log and
-- claim sources, the releaser). {table} is composed in Python as a qualified identifier
-- (pgmq.q_x or pgmq.a_x), {columns} as the read's column list, other braces as literals.

-- name: spark_queue_bounds
-- The smallest and largest msg_id of a queue or archive table.
SELECT min(msg_id), max(msg_id) FROM {table}

-- name: spark_queue_range_rows
-- A range partition's rows, by msg_id.
SELECT {columns} FROM {table} WHERE msg_id BETWEEN {first} AND {last} ORDER BY msg_id

-- name: spark_queue_claim_rows
-- A claim partition's rows: its elements first..last still leased to the claim (same delivery).
SELECT {columns} FROM pgbroker.spark_claims c
CROSS JOIN LATERAL unnest(c.msg_ids[{first}:{last}], c.receipts[{first}:{last}]) AS u(msg_id, receipt)
JOIN {table} q ON q.msg_id = u.msg_id
WHERE c.consumer = {consumer} AND c.seq = {seq} AND u.receipt IS NOT NULL
  AND q.read_ct = split_part(u.receipt, ':', 2)::integer
ORDER BY q.msg_id

-- name: spark_queue_release
-- Delete or archive a log stream's messages after one id up to another.
SELECT pgbroker.spark_release(%s, %s, %s, %s)

-- name: spark_queue_renew
-- Renew a consumer's claim leases; returns how many were found lost.
SELECT pgbroker.spark_renew(%s, %s)

-- name: spark_queue_consumer
-- Register a claim consumer on a queue; returns its last claim's seq.
SELECT pgbroker.spark_consumer(%s, %s)

-- name: spark_queue_last_msg_id
-- The newest msg_id a queue has handed out (0 before any), the end of an available-now run.
SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence(
    format('pgmq.%%I', pgbroker._table(%s)), 'msg_id')), 0)

-- name: spark_queue_claims_between
-- A consumer's claims after one seq up to another, with their sizes.
SELECT seq, cardinality(msg_ids) FROM pgbroker.spark_claims
WHERE consumer = %s AND seq > %s AND seq <= %s
ORDER BY seq

-- name: spark_queue_claim
-- Claim up to n messages as a consumer's next seq; returns how many.
SELECT pgbroker.spark_claim(%s, %s, %s, %s, %s)

-- name: spark_queue_held_back
-- Why a claim got nothing: 'paused', 'limited' or nothing.
SELECT pgbroker.spark_held_back(%s, %s)

-- name: spark_queue_release_claims
-- Ack (delete or archive) a consumer's claims up to a seq.
SELECT pgbroker.spark_release_claims(%s, %s, %s)

-- name: spark_queue_first_after
-- The first msg_id of a table after one id up to another.
SELECT min(msg_id) FROM {table} WHERE msg_id > %s AND msg_id <= %s

-- name: spark_queue_bounds_between
-- The smallest and largest msg_id of a table after one id up to another.
SELECT min(msg_id), max(msg_id) FROM {table} WHERE msg_id > %s AND msg_id <= %s

-- name: spark_queue_log_gate
-- Whether a log stream may read now (false while paused; PB007 when the queue has limits).
SELECT pgbroker.spark_log_gate(%s, %s)

-- name: spark_queue_safe_watermark
-- The msg_id below which no sender's transaction is still open, waiting a while for them.
SELECT pgbroker.spark_safe_watermark(%s, %s, %s, %s)
