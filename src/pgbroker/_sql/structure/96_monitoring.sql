-- Monitoring: what the dashboard shows beyond one scrape (failure counts, a
-- history of every queue's stats, the queue workers that run).
-- The tables of this concern, created once; functions/96_monitoring.sql
-- holds its functions and the header that explains them.

-- Failed deliveries per queue since it was made: counters, like total_sent.
CREATE TABLE pgbroker.queue_failures (
    queue_name varchar PRIMARY KEY
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    retried bigint NOT NULL,
    dead_lettered bigint NOT NULL
);

-- Samples of every queue's stats, one row per queue and sample, written by
-- `pgbroker serve` on an interval and pruned past its retention.
CREATE TABLE pgbroker.queue_history (
    queue_name varchar NOT NULL
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    sampled_at timestamptz NOT NULL,
    queue_length bigint NOT NULL,
    in_flight bigint NOT NULL,
    oldest_msg_age_sec double precision,
    total_sent bigint NOT NULL,
    total_consumed bigint NOT NULL,
    total_retried bigint NOT NULL,
    total_dead_lettered bigint NOT NULL,
    PRIMARY KEY (queue_name, sampled_at)
);
-- Pruning and the latest sample walk it by time.
CREATE INDEX queue_history_sampled_at ON pgbroker.queue_history (sampled_at);

-- The queue workers running now, one row each, renewed by its heartbeat and
-- removed when it stops (or, when it died, once its heartbeat is stale).
CREATE TABLE pgbroker.queue_workers (
    worker_id uuid PRIMARY KEY,
    queue_name text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    concurrency integer NOT NULL,
    started_at timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    in_flight integer NOT NULL,
    completed bigint NOT NULL,
    retried bigint NOT NULL,
    dead_lettered bigint NOT NULL
);

-- A consumer registers its workers; a monitor reads the history and the workers.
INSERT INTO pgbroker.role_function (role_kind, function_schema, function_name)
SELECT 'consumer', 'pgbroker', f FROM unnest(ARRAY['worker_heartbeat', 'worker_stopped']) f
UNION ALL
SELECT 'monitor', 'pgbroker', f FROM unnest(ARRAY['queue_history', 'queue_workers', 'queue_activity',
                                               'stream_consumers', 'blocking_sessions']) f;
-- The entry points of one queue are granted to roles scoped to it too (15_scopes.sql).
INSERT INTO pgbroker.queue_scoped_function (role_kind, function_schema, function_name)
SELECT 'consumer', 'pgbroker', f FROM unnest(ARRAY['worker_heartbeat', 'worker_stopped']) f
UNION ALL
SELECT 'monitor', 'pgbroker', 'queue_activity';
