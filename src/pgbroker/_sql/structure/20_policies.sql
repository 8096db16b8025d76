-- Policies: per-queue delivery rules, beyond pgmq.
-- The tables and types of this concern, created once; functions/20_policies.sql
-- holds its functions and the header that explains them.

-- No column defaults: the defaults are written once, in pgbroker.policy().
CREATE TABLE pgbroker.queue_policy (
    queue_name varchar PRIMARY KEY
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE,
    max_deliveries integer CHECK (max_deliveries >= 1),                       -- NULL: unlimited
    backoff text NOT NULL CHECK (backoff IN ('fixed', 'exponential')),
    backoff_base_seconds integer NOT NULL CHECK (backoff_base_seconds >= 0),
    backoff_max_seconds integer NOT NULL,
    backoff_jitter boolean NOT NULL,
    dead_letter_queue varchar                                                 -- NULL: the archive
        REFERENCES pgmq.meta (queue_name) ON DELETE SET NULL,
    ack_mode text NOT NULL CHECK (ack_mode IN ('archive', 'delete')),
    max_depth bigint CHECK (max_depth >= 1),                                  -- NULL: unbounded
    archive_retention_seconds bigint CHECK (archive_retention_seconds >= 1),  -- NULL: forever
    archive_max_rows bigint CHECK (archive_max_rows >= 1),                    -- NULL: unbounded
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- The codec of the clients' sends: json, msgpack, protobuf:<type> or avro:<name> (last:
    -- added by migration 0016, which appends it).
    codec text NOT NULL CHECK (codec ~ '^(json|msgpack|(protobuf|avro):[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)$'),
    priorities boolean NOT NULL,                                              -- the priority index exists
    dedup_window_seconds integer NOT NULL CHECK (dedup_window_seconds >= 1),
    dedup_mode text NOT NULL CHECK (dedup_mode IN ('window', 'queued')),
    max_in_flight integer CHECK (max_in_flight >= 1),                         -- NULL: unlimited
    max_in_flight_per_key integer CHECK (max_in_flight_per_key >= 1),         -- NULL: unlimited
    rate_limit_per_second double precision CHECK (rate_limit_per_second > 0), -- NULL: unlimited
    paused boolean NOT NULL,
    CHECK (backoff_max_seconds >= backoff_base_seconds),
    CHECK (dead_letter_queue IS DISTINCT FROM queue_name)
);
