-- Concurrency and rate limits, enforced by the engine's reads.
-- The tables and types of this concern, created once; functions/56_limits.sql
-- holds its functions and the header that explains them.

-- The token buckets of rate-limited queues.
CREATE TABLE pgbroker.rate_buckets (
    queue_name varchar PRIMARY KEY
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    tokens double precision NOT NULL,
    refilled_at timestamptz NOT NULL
);
