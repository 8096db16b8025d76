-- The HTTP server's own statements: its health check and its Prometheus metrics.

-- name: health_check
-- The database answers.
SELECT 1

-- name: queue_stats_for_metrics
-- Every queue's stats (exact counts below a size) with its messages consumed and whether it is paused.
SELECT s.*, pgbroker.messages_consumed(s.queue_name), pgbroker.is_paused(s.queue_name)
FROM pgbroker.queue_stats(%s) s

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
