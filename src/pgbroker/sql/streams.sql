-- The stream client's queries, one per operation, shared by the sync and asyncio
-- clients through pgbroker.stream_queries; each calls the SQL API of
-- sql/schema/92_streams.sql. Messages and headers arrive as JSON text.

-- name: stream_create
SELECT stream_name, partitions, retention_seconds, retention_bytes, truncate_consumed, segment_rows, segments,
       notify, created_at
FROM pgbroker.create_stream(%(stream)s, %(partitions)s, %(retention_seconds)s, %(retention_bytes)s,
                            %(truncate_consumed)s, %(segment_rows)s, %(segments)s, %(notify)s)

-- name: stream_drop
SELECT pgbroker.drop_stream(%(stream)s)

-- name: stream_list
SELECT stream_name, partitions, retention_seconds, retention_bytes, truncate_consumed, segment_rows, segments,
       notify, created_at
FROM pgbroker.streams()

-- name: stream_send_many
SELECT pgbroker.stream_send_many(%(stream)s, %(messages)s::jsonb[], %(headers)s::jsonb[], %(keys)s::text[])

-- name: stream_notify_channel
SELECT pgbroker.stream_notify_channel(%(stream)s)

-- name: stream_group_create
SELECT stream_name, group_name, retry_queue, created_at
FROM pgbroker.create_stream_group(%(stream)s, %(group)s, %(start_from)s, %(start_time)s, %(retry_queue)s)

-- name: stream_group_drop
SELECT pgbroker.drop_stream_group(%(stream)s, %(group)s)

-- name: stream_group_list
SELECT group_name, lag, oldest_unacked_at, consumers, retry_queue, created_at
FROM pgbroker.stream_groups(%(stream)s)

-- name: stream_lag
SELECT group_name, partition, acked_id, delivered_id, lag, oldest_unacked_at, owner, owner_alive
FROM pgbroker.stream_lag(%(stream)s)

-- name: stream_read
SELECT partition, id, epoch, key, enqueued_at, headers, message
FROM pgbroker.stream_read(%(stream)s, %(group)s, %(consumer)s, %(qty)s, %(lease)s)

-- name: stream_consume
SELECT partition, id, epoch, key, enqueued_at, headers, message
FROM pgbroker.stream_consume(%(stream)s, %(group)s, %(consumer)s, %(qty)s, %(lease)s, %(partitions)s::integer[],
                             %(epochs)s::bigint[], %(last_ids)s::bigint[], %(failed_ids)s::bigint[],
                             %(errors)s::text[])

-- name: stream_ack
SELECT partition, acked
FROM pgbroker.stream_ack(%(stream)s, %(group)s, %(consumer)s, %(partitions)s::integer[], %(epochs)s::bigint[],
                         %(last_ids)s::bigint[], %(failed_ids)s::bigint[], %(errors)s::text[])

-- name: stream_release
SELECT pgbroker.stream_release(%(stream)s, %(group)s, %(consumer)s)

-- name: stream_rewind
SELECT pgbroker.stream_rewind(%(stream)s, %(group)s, %(consumer)s)

-- name: stream_maintain
SELECT pgbroker.maintain_stream(%(stream)s)
