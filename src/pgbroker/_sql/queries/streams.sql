-- The stream client's queries, one per operation, shared by the sync and asyncio
-- clients through pgbroker.streams._queries; each calls the SQL API of
-- sql/functions/92_streams.sql. Messages and headers arrive as JSON text.

-- name: stream_create
-- Create a stream.
SELECT stream_name, partitions, retention_seconds, retention_bytes, truncate_consumed, segment_rows, segments,
       notify, created_at
FROM pgbroker.create_stream(%(stream)s::text, %(partitions)s::integer, %(retention_seconds)s::bigint,
                            %(retention_bytes)s::bigint, %(truncate_consumed)s::boolean, %(segment_rows)s::bigint,
                            %(segments)s::integer, %(notify)s::boolean)

-- name: stream_drop
-- Drop a stream.
SELECT pgbroker.drop_stream(%(stream)s)

-- name: stream_list
-- Every stream.
SELECT stream_name, partitions, retention_seconds, retention_bytes, truncate_consumed, segment_rows, segments,
       notify, created_at
FROM pgbroker.streams()

-- name: stream_send_many
-- Append a batch of messages to a stream.
SELECT pgbroker.stream_send_many(%(stream)s, pgbroker._jsonb_array(%(messages)s::jsonb), pgbroker._jsonb_array(%(headers)s::jsonb, true), %(keys)s::text[])

-- name: stream_send_idempotent
-- Append a batch once per idempotency key (in its scope): a retry with the key gets the first ids again.
SELECT * FROM pgbroker.stream_send_idempotent(%(stream)s, %(key)s, pgbroker._jsonb_array(%(messages)s::jsonb), pgbroker._jsonb_array(%(headers)s::jsonb, true), %(keys)s::text[], scope => %(scope)s::text)

-- name: stream_notify_channel
-- The LISTEN channel a stream's appends notify on.
SELECT pgbroker.stream_notify_channel(%(stream)s)

-- name: stream_group_create
-- Create a consumer group on a stream.
SELECT stream_name, group_name, retry_queue, created_at
FROM pgbroker.create_stream_group(%(stream)s::text, %(group)s::text, %(start_from)s::text,
                                  %(start_time)s::timestamptz, %(retry_queue)s::text)

-- name: stream_group_drop
-- Drop a consumer group.
SELECT pgbroker.drop_stream_group(%(stream)s, %(group)s)

-- name: stream_group_list
-- A stream's consumer groups.
SELECT group_name, lag, oldest_unacked_at, consumers, retry_queue, created_at
FROM pgbroker.stream_groups(%(stream)s)

-- name: stream_lag
-- A group's lag by partition.
SELECT group_name, partition, acked_id, delivered_id, lag, oldest_unacked_at, owner, owner_alive
FROM pgbroker.stream_lag(%(stream)s)

-- name: stream_read
-- Read a group's next messages, under the consumer's generation.
SELECT partition, id, epoch, key, enqueued_at, headers, message
FROM pgbroker.stream_read(%(stream)s::text, %(group)s::text, %(consumer)s::text, %(qty)s::integer,
                          %(lease)s::integer, %(generation)s::bigint, %(lease_only)s::boolean)

-- name: stream_consume
-- Claim the next batch of a group's messages.
SELECT partition, id, epoch, key, enqueued_at, headers, message
FROM pgbroker.stream_consume(%(stream)s::text, %(group)s::text, %(consumer)s::text, %(qty)s::integer,
                             %(lease)s::integer, %(partitions)s::integer[],
                             %(epochs)s::bigint[], %(last_ids)s::bigint[], %(failed_ids)s::bigint[],
                             %(errors)s::text[], %(generation)s::bigint, %(lease_only)s::boolean)

-- name: stream_ack
-- Ack a group's claimed messages.
SELECT partition, acked
FROM pgbroker.stream_ack(%(stream)s::text, %(group)s::text, %(consumer)s::text, %(partitions)s::integer[],
                         %(epochs)s::bigint[],
                         %(last_ids)s::bigint[], %(failed_ids)s::bigint[], %(errors)s::text[])

-- name: stream_release
-- Release a group's claim unacked.
SELECT pgbroker.stream_release(%(stream)s, %(group)s, %(consumer)s)

-- name: stream_heartbeat
-- Renew a consumer's lease between reads; the partitions it owns, with their epochs.
SELECT partition, epoch
FROM pgbroker.stream_heartbeat(%(stream)s, %(group)s, %(consumer)s, %(lease)s, %(lease_only)s::boolean)

-- name: stream_rewind
-- Hand out again what a consumer read and did not ack, under its new generation.
SELECT pgbroker.stream_rewind(%(stream)s, %(group)s, %(consumer)s, %(generation)s::bigint)

-- name: stream_maintain
-- Truncate a stream's consumed or expired segments.
SELECT pgbroker.maintain_stream(%(stream)s)

-- name: stream_receive_many
-- Append messages received by a bridge, skipping ones already seen.
SELECT message_id, id FROM pgbroker.stream_receive_many(
    %(stream)s, %(message_ids)s::text[], pgbroker._jsonb_array(%(messages)s::jsonb), pgbroker._jsonb_array(%(headers)s::jsonb, true), %(keys)s::text[],
    make_interval(secs => %(seen_within)s::double precision))

-- name: stream_inbound_seen_prune
-- Forget a stream bridge's old inbound message ids, of its stream.
SELECT pgbroker.prune_stream_inbound_seen(make_interval(secs => %(seen_within)s::double precision),
                                          %(batch_size)s::integer, %(stream)s::text)
