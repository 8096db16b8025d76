-- The queue clients' queries, one per operation, shared by the sync and asyncio
-- clients through pgbroker.queues._queries. Each is a call to the SQL API, so no
-- client re-implements queue semantics. Parameters are named (%(x)s);
-- messages and headers arrive as JSON text, serialised once in Python.

-- name: queue_create
-- Create a queue (pgmq.create).
SELECT pgmq.create(%(queue)s)

-- name: queue_create_unlogged
-- Create an unlogged queue (pgmq.create_unlogged).
SELECT pgmq.create_unlogged(%(queue)s)

-- name: queue_drop
-- Drop a queue and its archive (pgmq.drop_queue).
SELECT pgmq.drop_queue(%(queue)s)

-- name: queue_list
-- Every queue with its kind and creation time.
SELECT queue_name, is_partitioned, is_unlogged, created_at FROM pgmq.list_queues()

-- name: blocking_sessions
-- The sessions whose long transaction holds the engine's tables or the xmin horizon (of one stream, or all).
SELECT pid, role_name, application_name, client_addr::text, state, transaction_age_sec, state_age_sec, tables,
       holds_horizon, query
FROM pgbroker.blocking_sessions(make_interval(secs => %(older_than)s), %(of_stream)s)

-- name: queue_metrics
-- One queue's depth and age metrics.
SELECT * FROM pgmq.metrics(%(queue)s)

-- name: queue_metrics_all
-- Every queue's depth and age metrics.
SELECT * FROM pgmq.metrics_all()

-- name: queue_purge
-- Delete every message of a queue, returning how many.
SELECT pgmq.purge_queue(%(queue)s)

-- name: notify_enable
-- Turn on insert notifications for a queue, with a throttle.
SELECT pgmq.enable_notify_insert(%(queue)s, %(throttle_ms)s::integer)

-- name: notify_disable
-- Turn off a queue's insert notifications.
SELECT pgmq.disable_notify_insert(%(queue)s)

-- name: notify_channel
-- The LISTEN channel a queue's inserts notify on.
SELECT pgbroker.notify_channel(%(queue)s)

-- name: message_send_many
-- Send a batch of messages now.
SELECT * FROM pgmq.send_batch(%(queue)s, pgbroker._jsonb_array(%(messages)s::jsonb), pgbroker._jsonb_array(%(headers)s::jsonb, true))

-- name: message_send_many_delay_seconds
-- Send a batch of messages visible after a delay in seconds.
SELECT * FROM pgmq.send_batch(%(queue)s, pgbroker._jsonb_array(%(messages)s::jsonb), pgbroker._jsonb_array(%(headers)s::jsonb, true), %(delay)s::integer)

-- name: message_send_many_delay_until
-- Send a batch of messages visible at a timestamp.
SELECT * FROM pgmq.send_batch(%(queue)s, pgbroker._jsonb_array(%(messages)s::jsonb), pgbroker._jsonb_array(%(headers)s::jsonb, true), %(delay)s::timestamptz)

-- name: message_send_idempotent
-- Send a batch once per idempotency key (in its scope): a retry with the key gets the first msg_ids again.
SELECT * FROM pgbroker.send_idempotent(%(queue)s, %(key)s, pgbroker._jsonb_array(%(messages)s::jsonb), pgbroker._jsonb_array(%(headers)s::jsonb, true), %(delay)s::integer, scope => %(scope)s::text)

-- name: message_read_many
-- Read up to n messages with receipts, hiding them for a visibility timeout.
SELECT * FROM pgbroker.read(%(queue)s, %(vt)s::integer, %(qty)s::integer, %(conditional)s::jsonb)

-- name: message_complete_and_read
-- The worker's hot path: ack receipts by the queue's policy, then read the next batch.
-- The acks are message_complete_many's, the read message_read_many's. The read takes a
-- (zero) term of the acks' result, which makes the planner run the acks first.
-- The first row (or the only one, when nothing was read) carries the msg_ids acked.
SELECT CASE WHEN r.n IS NULL OR r.n = 1 THEN a.acked END,
       r.msg_id, r.read_ct, r.enqueued_at, r.last_read_at, r.vt, r.message, r.headers, r.receipt
FROM (SELECT coalesce(array_agg(c.msg_id), '{}') AS acked
      FROM pgbroker.complete(%(queue)s, string_to_array(%(receipts)s::text, ',')) AS c(msg_id)) AS a
LEFT JOIN LATERAL pgbroker.read(%(queue)s, %(vt)s::integer,
                                %(qty)s::integer + 0 * cardinality(a.acked), %(conditional)s::jsonb)
    WITH ORDINALITY AS r(msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers, receipt, n)
    ON true

-- name: message_pop_many
-- Read and delete up to n messages at once.
SELECT * FROM pgmq.pop(%(queue)s, %(qty)s::integer)

-- name: message_ack
-- Ack one receipt.
-- The single forms go through the batch functions, which skip a stale receipt
-- instead of raising: the client raises StaleReceipt itself, with the server's
-- reason, and a caller's transaction is not aborted by it.
SELECT done, CASE WHEN done IS NULL THEN pgbroker.stale_reason(%(queue)s, %(receipt)s) END
FROM (SELECT (SELECT a FROM pgbroker.ack(%(queue)s, ARRAY[%(receipt)s::text], %(archive)s::boolean) a) AS done) s

-- name: message_ack_many
-- Ack a batch of receipts.
SELECT * FROM pgbroker.ack(%(queue)s, string_to_array(%(receipts)s::text, ','), %(archive)s::boolean)

-- name: message_nack
-- Nack one receipt, making the message visible again after a delay.
SELECT done, CASE WHEN done IS NULL THEN pgbroker.stale_reason(%(queue)s, %(receipt)s) END
FROM (SELECT (SELECT n FROM pgbroker.nack(%(queue)s, ARRAY[%(receipt)s::text], %(delay)s::integer) n) AS done) s

-- name: message_nack_many
-- Nack a batch of receipts.
SELECT * FROM pgbroker.nack(%(queue)s, string_to_array(%(receipts)s::text, ','), %(delay)s::integer)

-- name: message_extend
-- Extend one receipt's visibility timeout.
SELECT done, CASE WHEN done IS NULL THEN pgbroker.stale_reason(%(queue)s, %(receipt)s) END
FROM (SELECT (SELECT e.receipt FROM pgbroker.extend(%(queue)s, ARRAY[%(receipt)s::text], %(vt)s::integer) e)
      AS done) s

-- name: message_extend_many
-- Extend a batch of receipts' visibility timeouts.
SELECT msg_id, receipt
FROM pgbroker.extend(%(queue)s, string_to_array(%(receipts)s::text, ','), %(vt)s::integer)

-- name: message_archive_many
-- Archive messages by id.
SELECT * FROM pgmq.archive(%(queue)s, %(msg_ids)s::bigint[])

-- name: message_delete_many
-- Delete messages by id.
SELECT * FROM pgmq.delete(%(queue)s, %(msg_ids)s::bigint[])

-- name: message_set_vt_seconds
-- Set messages' visibility timeout, in seconds from now.
SELECT * FROM pgmq.set_vt(%(queue)s, %(msg_ids)s::bigint[], %(vt)s::integer)

-- name: message_set_vt_until
-- Set messages' visibility timeout to a timestamp.
SELECT * FROM pgmq.set_vt(%(queue)s, %(msg_ids)s::bigint[], %(vt)s::timestamptz)

-- name: notify_enable_if_disabled
-- A worker's start: turn on insert notifications unless the queue has them (keeping its owner's
-- throttle). Whether it has them is its trigger's, in the catalog any login reads: a consumer's
-- worker may not read pgmq.notify_insert_throttle (nor turn notify on), and was told notify was
-- unavailable on a queue that had it.
SELECT pgmq.enable_notify_insert(%(queue)s, %(throttle_ms)s::integer)
WHERE NOT EXISTS (SELECT 1
                  FROM pg_catalog.pg_trigger t
                  JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
                  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE n.nspname = 'pgmq' AND c.relname = lower('q_' || %(queue)s::text)
                    AND t.tgname = 'pgbroker_notify_insert')

-- name: message_complete_many
-- Complete a batch of receipts by the queue's policy (archive or delete).
SELECT * FROM pgbroker.complete(%(queue)s, string_to_array(%(receipts)s::text, ','))

-- name: message_fail
-- Fail one receipt: retry with backoff or dead-letter it.
SELECT done, CASE WHEN done IS NULL THEN pgbroker.stale_reason(%(queue)s, %(receipt)s) END
FROM (SELECT (SELECT f.outcome FROM pgbroker.fail(%(queue)s, ARRAY[%(receipt)s::text], %(error)s::text,
                                                   %(traceback)s::text) f)
      AS done) s

-- name: message_peek_many
-- Look at messages without reading them.
SELECT * FROM pgbroker.peek(%(queue)s, %(qty)s::integer, %(after)s::bigint, %(state)s::text,
                            %(before)s::bigint, %(header_key)s::text, %(header_value)s::text,
                            %(enqueued_after)s::timestamptz, %(enqueued_before)s::timestamptz,
                            %(contains)s::jsonb)

-- name: policy_get
-- One queue's policy.
SELECT * FROM pgbroker.policy(%(queue)s)

-- name: policy_list
-- Every queue's policy.
SELECT * FROM pgbroker.policies()

-- name: policy_set
-- Set a queue's policy, leaving unnamed fields as they are.
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
-- The codec a queue's payloads are stored with.
SELECT pgbroker.queue_codec(%(queue)s)

-- name: queue_pause
-- Pause a queue's reads.
SELECT pgbroker.pause(%(queue)s)

-- name: queue_resume
-- Resume a paused queue's reads.
SELECT pgbroker.resume(%(queue)s)

-- name: dead_letter_list
-- A queue's dead letters.
SELECT * FROM pgbroker.dead_letters(%(queue)s, %(qty)s::integer, %(after)s::bigint)

-- name: dead_letter_get
-- One dead letter, by the msg_id it had in the queue.
SELECT * FROM pgbroker.dead_letter(%(queue)s, %(msg_id)s::bigint)

-- name: dead_letter_replay_many
-- Send dead letters back to their queue.
SELECT dead_letter_id, msg_id FROM pgbroker.replay_dead_letters(%(queue)s, %(msg_ids)s::bigint[])

-- name: dead_letter_purge_many
-- Delete dead letters.
SELECT pgbroker.purge_dead_letters(%(queue)s, %(msg_ids)s::bigint[])

-- name: archive_trim
-- Delete archived messages older than a retention.
SELECT pgbroker.trim_archive(%(queue)s, %(batch_size)s::integer)

-- name: dedup_keys_trim
-- Delete expired deduplication keys.
SELECT pgbroker.trim_dedup_keys(%(queue)s, %(batch_size)s::integer)

-- name: message_fail_many
-- Fail a batch of receipts with the error and traceback (the caller's max deliveries if no policy).
SELECT msg_id, outcome
FROM pgbroker.fail(%(queue)s, string_to_array(%(receipts)s::text, ','), %(error)s::text, %(traceback)s::text,
                   %(default_max_deliveries)s::integer)

-- name: message_ack_published_many
-- Ack the receipts of messages a bridge has published.
SELECT * FROM pgbroker.ack_published(%(queue)s, string_to_array(%(receipts)s::text, ','), %(published)s::jsonb[])

-- name: message_receive_many
-- Send messages received by a bridge, skipping ones already seen.
SELECT message_id, msg_id FROM pgbroker.receive_many(
    %(queue)s, %(message_ids)s::text[], pgbroker._jsonb_array(%(messages)s::jsonb), pgbroker._jsonb_array(%(headers)s::jsonb, true),
    make_interval(secs => %(seen_within)s::double precision))

-- name: inbound_seen_prune
-- Forget a bridge's old inbound message ids, of one queue or (NULL) of every queue.
SELECT pgbroker.prune_inbound_seen(make_interval(secs => %(seen_within)s::double precision),
                                   %(batch_size)s::integer, %(queue)s::text)

-- Schedules (sql/functions/78_schedules.sql) --------------------------------------

-- name: schedule_add
-- Add or replace a schedule.
SELECT * FROM pgbroker.schedule_add(%(name)s, %(queue)s, %(cron)s, %(message)s::jsonb,
                                    %(headers)s::jsonb, %(timezone)s, %(replace)s)

-- name: schedule_list
-- Every schedule.
SELECT * FROM pgbroker.schedule_list()

-- name: schedule_remove
-- Remove a schedule.
SELECT pgbroker.schedule_remove(%(name)s)

-- name: schedule_pause
-- Pause a schedule.
SELECT * FROM pgbroker.schedule_pause(%(name)s)

-- name: schedule_resume
-- Resume a schedule.
SELECT * FROM pgbroker.schedule_resume(%(name)s)

-- name: schedule_tick
-- Send the messages of every schedule that is due.
SELECT schedule_name, tick, msg_id, error FROM pgbroker.schedule_tick(%(as_of)s::timestamptz)

-- name: schedule_next_wake
-- When the next schedule is due.
SELECT pgbroker.schedule_next_wake()

-- name: schedules_channel
-- The LISTEN channel schedule changes notify on.
SELECT pgbroker.schedules_channel()

-- Workers (sql/functions/96_monitoring.sql) ---------------------------------------

-- name: worker_heartbeat
-- Register a queue worker, or renew its row with what it holds and has done.
SELECT pgbroker.worker_heartbeat(%(queue)s, %(worker_id)s, %(host)s, %(pid)s, %(concurrency)s, %(in_flight)s,
                                 %(completed)s, %(retried)s, %(dead_lettered)s)

-- name: worker_stopped
-- A queue worker stopped: its row goes.
SELECT pgbroker.worker_stopped(%(queue)s, %(worker_id)s)
