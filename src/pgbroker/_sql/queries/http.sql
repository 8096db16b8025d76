-- The HTTP server's own statements: its health check and its Prometheus metrics.

-- name: health_check
-- The database answers.
SELECT 1

-- name: queue_stats_for_metrics
-- Every queue's stats (exact counts below a size) with its messages consumed, whether it is paused,
-- its messages in flight and its failed deliveries.
SELECT s.*, pgbroker.messages_consumed(s.queue_name), pgbroker.is_paused(s.queue_name),
       a.in_flight, a.retried, a.dead_lettered
FROM pgbroker.queue_stats(%(exact_below)s) s
CROSS JOIN LATERAL pgbroker.queue_activity(s.queue_name, %(exact_below)s) a

-- name: history_sample
-- Sample every queue's stats into the history, unless another server just did; prune it.
SELECT pgbroker.sample_queue_history(make_interval(secs => %(interval)s), make_interval(secs => %(retention)s),
                                     %(exact_below)s)

-- name: history_since
-- The history's samples of the last minutes, thinned to about so many points per queue. The
-- minutes are counted on the server's clock, which stamped the samples: an API host's clock may
-- be far from it.
SELECT queue_name, sampled_at, queue_length, in_flight, oldest_msg_age_sec, total_sent, total_consumed,
       total_retried, total_dead_lettered
FROM pgbroker.queue_history(clock_timestamp() - make_interval(mins => %(minutes)s), %(points)s)

-- name: queue_workers
-- The queue workers running, with their heartbeats and what they hold.
SELECT * FROM pgbroker.queue_workers()

-- name: stream_consumers
-- Every stream group's consumers with their last renewal and lease end.
SELECT s.stream_name, c.group_name, c.consumer, c.renewed_at, c.expires_at,
       extract(epoch FROM clock_timestamp() - c.renewed_at)::float8
FROM pgbroker.streams() s CROSS JOIN LATERAL pgbroker.stream_consumers(s.stream_name) c
ORDER BY 1, 2, 3

-- name: stream_group_retry_queue
-- A group's retry queue (no row: no such group, which the engine's call then says).
SELECT g.retry_queue FROM pgbroker.stream_group g
WHERE g.stream_name = lower(%(stream)s) AND g.group_name = %(group)s

-- name: stream_retry_queues_made
-- The retry queues that go when a stream's group (or, without one, every group) is dropped.
SELECT g.retry_queue FROM pgbroker.stream_group g
WHERE g.stream_name = lower(%(stream)s) AND g.group_name = coalesce(%(group)s, g.group_name)
  AND g.retry_queue_made

-- name: stream_group_default_retry_queue
-- The retry queue the engine gives a group that names none.
SELECT pgbroker._stream_default_retry_queue(%(stream)s, %(group)s)

-- name: stream_group_unseen
-- What a key is told of a group it may not use: the engine's refusal of a group that does not exist.
SELECT pgbroker._stream_no_group(%(stream)s, %(group)s)

-- name: stream_group_stats_for_metrics
-- Every stream's groups with their lag, oldest unacked age in seconds, consumers and retry queue.
SELECT s.stream_name, g.group_name, g.lag,
       extract(epoch FROM clock_timestamp() - g.oldest_unacked_at)::float8,
       g.consumers, g.retry_queue
FROM pgbroker.streams() s CROSS JOIN LATERAL pgbroker.stream_groups(s.stream_name) g
ORDER BY 1, 2

-- name: replica_replay_lag
-- Seconds this server is behind its primary: 0 on a primary, and on a standby that has replayed
-- all it received from a running WAL receiver; else the age of the last transaction it replayed.
SELECT CASE
         WHEN NOT pg_is_in_recovery() THEN 0
         WHEN pg_last_wal_receive_lsn() IS NOT DISTINCT FROM pg_last_wal_replay_lsn()
              AND EXISTS (SELECT FROM pg_stat_wal_receiver) THEN 0
         ELSE coalesce(extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp()), 0)
       END::float8
