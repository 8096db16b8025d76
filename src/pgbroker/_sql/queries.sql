-- The client's queries, one per operation, shared by the sync and asyncio
-- clients through pgbroker.queries. Each is a call to the SQL API, so no
-- client re-implements queue semantics. Parameters are named (%(x)s);
-- messages and headers arrive as JSON text, serialised once in Python.

-- name: queue_create
SELECT pgmq.create(%(queue)s)

-- name: queue_create_unlogged
SELECT pgmq.create_unlogged(%(queue)s)

-- name: queue_drop
SELECT pgmq.drop_queue(%(queue)s)

-- name: queue_list
SELECT queue_name, is_partitioned, is_unlogged, created_at FROM pgmq.list_queues()

-- name: queue_metrics
SELECT * FROM pgmq.metrics(%(queue)s)

-- name: queue_metrics_all
SELECT * FROM pgmq.metrics_all()

-- name: queue_purge
SELECT pgmq.purge_queue(%(queue)s)

-- name: notify_enable
SELECT pgmq.enable_notify_insert(%(queue)s, %(throttle_ms)s::integer)

-- name: notify_disable
SELECT pgmq.disable_notify_insert(%(queue)s)

-- name: notify_channel
SELECT pgbroker.notify_channel(%(queue)s)

-- name: message_send_many
SELECT * FROM pgmq.send_batch(%(queue)s, %(messages)s::jsonb[], %(headers)s::jsonb[])

-- name: message_send_many_delay_seconds
SELECT * FROM pgmq.send_batch(%(queue)s, %(messages)s::jsonb[], %(headers)s::jsonb[], %(delay)s::integer)

-- name: message_send_many_delay_until
SELECT * FROM pgmq.send_batch(%(queue)s, %(messages)s::jsonb[], %(headers)s::jsonb[], %(delay)s::timestamptz)

-- name: message_read_many
SELECT * FROM pgbroker.read(%(queue)s, %(vt)s::integer, %(qty)s::integer, %(conditional)s::jsonb)

-- name: message_complete_and_read
-- The worker's hot path in one statement: ack receipts by the queue's policy (as
-- message_complete_many), then read (as message_read_many). The read takes a
-- (zero) term of the acks' result, which makes the planner run the acks first.
-- The first row (or the only one, when nothing was read) carries the msg_ids acked.
SELECT CASE WHEN r.n IS NULL OR r.n = 1 THEN a.acked END,
       r.msg_id, r.read_ct, r.enqueued_at, r.last_read_at, r.vt, r.message, r.headers, r.receipt
FROM (SELECT coalesce(array_agg(c.msg_id), '{}') AS acked
      FROM pgbroker.complete(%(queue)s, %(receipts)s::text[]) AS c(msg_id)) AS a
LEFT JOIN LATERAL pgbroker.read(%(queue)s, %(vt)s::integer,
                                %(qty)s::integer + 0 * cardinality(a.acked), %(conditional)s::jsonb)
    WITH ORDINALITY AS r(msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers, receipt, n)
    ON true

-- name: message_pop_many
SELECT * FROM pgmq.pop(%(queue)s, %(qty)s::integer)

-- name: message_ack
-- The single forms go through the batch functions, which skip a stale receipt
-- instead of raising: the client raises StaleReceipt itself, with the server's
-- reason, and a caller's transaction is not aborted by it.
SELECT done, CASE WHEN done IS NULL THEN pgbroker.stale_reason(%(queue)s, %(receipt)s) END
FROM (SELECT (SELECT a FROM pgbroker.ack(%(queue)s, ARRAY[%(receipt)s::text], %(archive)s::boolean) a) AS done) s

-- name: message_ack_many
SELECT * FROM pgbroker.ack(%(queue)s, %(receipts)s::text[], %(archive)s::boolean)

-- name: message_nack
SELECT done, CASE WHEN done IS NULL THEN pgbroker.stale_reason(%(queue)s, %(receipt)s) END
FROM (SELECT (SELECT n FROM pgbroker.nack(%(queue)s, ARRAY[%(receipt)s::text], %(delay)s::integer) n) AS done) s

-- name: message_nack_many
SELECT * FROM pgbroker.nack(%(queue)s, %(receipts)s::text[], %(delay)s::integer)

-- name: message_extend
SELECT done, CASE WHEN done IS NULL THEN pgbroker.stale_reason(%(queue)s, %(receipt)s) END
FROM (SELECT (SELECT e.receipt FROM pgbroker.extend(%(queue)s, ARRAY[%(receipt)s::text], %(vt)s::integer) e)
      AS done) s

-- name: message_extend_many
SELECT msg_id, receipt FROM pgbroker.extend(%(queue)s, %(receipts)s::text[], %(vt)s::integer)

-- name: message_archive_many
SELECT * FROM pgmq.archive(%(queue)s, %(msg_ids)s::bigint[])

-- name: message_delete_many
SELECT * FROM pgmq.delete(%(queue)s, %(msg_ids)s::bigint[])

-- name: message_set_vt_seconds
SELECT * FROM pgmq.set_vt(%(queue)s, %(msg_ids)s::bigint[], %(vt)s::integer)

-- name: message_set_vt_until
SELECT * FROM pgmq.set_vt(%(queue)s, %(msg_ids)s::bigint[], %(vt)s::timestamptz)

-- name: notify_enable_if_disabled
-- A worker's start: a queue that notifies already keeps the throttle its owner chose.
SELECT pgmq.enable_notify_insert(%(queue)s, %(throttle_ms)s::integer)
WHERE NOT EXISTS (SELECT 1 FROM pgmq.notify_insert_throttle t
                  WHERE lower(t.queue_name) = lower(%(queue)s::text))

-- name: message_complete_many
SELECT * FROM pgbroker.complete(%(queue)s, %(receipts)s::text[])

-- name: message_fail
SELECT done, CASE WHEN done IS NULL THEN pgbroker.stale_reason(%(queue)s, %(receipt)s) END
FROM (SELECT (SELECT f.outcome FROM pgbroker.fail(%(queue)s, ARRAY[%(receipt)s::text], %(error)s::text) f)
      AS done) s

-- name: message_peek_many
SELECT * FROM pgbroker.peek(%(queue)s, %(qty)s::integer, %(after)s::bigint, %(state)s::text,
                            %(before)s::bigint, %(header_key)s::text, %(header_value)s::text,
                            %(enqueued_after)s::timestamptz, %(enqueued_before)s::timestamptz)

-- name: policy_get
SELECT * FROM pgbroker.policy(%(queue)s)

-- name: policy_list
SELECT * FROM pgbroker.policies()

-- name: policy_set
SELECT * FROM pgbroker.set_policy(
    %(queue)s,
    max_deliveries => %(max_deliveries)s::integer,
    backoff => %(backoff)s::text,
    backoff_base_seconds => %(backoff_base_seconds)s::integer,
    backoff_max_seconds => %(backoff_max_seconds)s::integer,
    backoff_jitter => %(backoff_jitter)s::boolean,
    dead_letter_queue => %(dead_letter_queue)s::text,
    ack_mode => %(ack_mode)s::text,
    max_depth => %(max_depth)s::bigint,
    archive_retention_seconds => %(archive_retention_seconds)s::bigint,
    archive_max_rows => %(archive_max_rows)s::bigint,
    codec => %(codec)s::text,
    priorities => %(priorities)s::boolean,
    dedup_window_seconds => %(dedup_window_seconds)s::integer,
    dedup_mode => %(dedup_mode)s::text,
    max_in_flight => %(max_in_flight)s::integer,
    max_in_flight_per_key => %(max_in_flight_per_key)s::integer,
    rate_limit_per_second => %(rate_limit_per_second)s::double precision)

-- name: queue_codec
SELECT pgbroker.queue_codec(%(queue)s)

-- name: queue_pause
SELECT pgbroker.pause(%(queue)s)

-- name: queue_resume
SELECT pgbroker.resume(%(queue)s)

-- name: dead_letter_list
SELECT * FROM pgbroker.dead_letters(%(queue)s, %(qty)s::integer, %(after)s::bigint)

-- name: dead_letter_replay_many
SELECT dead_letter_id, msg_id FROM pgbroker.replay_dead_letters(%(queue)s, %(msg_ids)s::bigint[])

-- name: dead_letter_purge_many
SELECT pgbroker.purge_dead_letters(%(queue)s, %(msg_ids)s::bigint[])

-- name: archive_trim
SELECT pgbroker.trim_archive(%(queue)s, %(batch_size)s::integer)

-- name: dedup_keys_trim
SELECT pgbroker.trim_dedup_keys(%(queue)s, %(batch_size)s::integer)

-- name: message_fail_many
SELECT msg_id, outcome FROM pgbroker.fail(%(queue)s, %(receipts)s::text[], %(error)s::text)

-- name: message_ack_published_many
SELECT * FROM pgbroker.ack_published(%(queue)s, %(receipts)s::text[], %(published)s::jsonb[])

-- name: message_receive_many
SELECT message_id, msg_id FROM pgbroker.receive_many(
    %(queue)s, %(message_ids)s::text[], %(messages)s::jsonb[], %(headers)s::jsonb[],
    make_interval(secs => %(seen_within)s::double precision))

-- name: inbound_seen_prune
SELECT pgbroker.prune_inbound_seen(make_interval(secs => %(seen_within)s::double precision),
                                   %(batch_size)s::integer)

-- Schedules (sql/functions/78_schedules.sql) --------------------------------------

-- name: schedule_add
SELECT * FROM pgbroker.schedule_add(%(name)s, %(queue)s, %(cron)s, %(message)s::jsonb,
                                    %(headers)s::jsonb, %(timezone)s, %(replace)s)

-- name: schedule_list
SELECT * FROM pgbroker.schedule_list()

-- name: schedule_remove
SELECT pgbroker.schedule_remove(%(name)s)

-- name: schedule_pause
SELECT * FROM pgbroker.schedule_pause(%(name)s)

-- name: schedule_resume
SELECT * FROM pgbroker.schedule_resume(%(name)s)

-- name: schedule_tick
SELECT schedule_name, tick, msg_id, error FROM pgbroker.schedule_tick(%(as_of)s::timestamptz)

-- name: schedule_next_wake
SELECT pgbroker.schedule_next_wake()

-- name: schedules_channel
SELECT pgbroker.schedules_channel()
