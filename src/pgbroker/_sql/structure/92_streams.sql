-- Streams: append-only logs read by consumer groups (PgQ's lesson).
-- The tables and types of this concern, created once; functions/92_streams.sql
-- holds its functions and the header that explains them.

CREATE TABLE pgbroker.stream (
    stream_name text PRIMARY KEY CHECK (stream_name ~ '^[a-z0-9_][a-z0-9_-]{0,39}$'),
    partitions integer NOT NULL CHECK (partitions BETWEEN 1 AND 256),
    segments integer NOT NULL CHECK (segments BETWEEN 3 AND 64),
    segment_rows bigint NOT NULL CHECK (segment_rows >= 100),
    retention_seconds bigint CHECK (retention_seconds BETWEEN 1 AND 3153600000),  -- NULL: no time limit
    retention_bytes bigint CHECK (retention_bytes >= 1),        -- NULL: no size limit
    truncate_consumed boolean NOT NULL,                         -- drop what every group has passed
    notify boolean NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The safe id and its candidate (functions/92_streams.sql), insert-only: an
-- advance appends a row, and a stream's watermark is its row with the
-- highest seq. In the ring of the positions (stream_position below: the same
-- sequence and slots, emptied by the same rotation), so that a transaction
-- holding back the xmin horizon keeps no dead version of it either. No
-- foreign key, as for the positions: a dropped stream's rows are never read
-- again and go with their child table.
CREATE TABLE pgbroker.stream_watermark (
    stream_name text NOT NULL,
    seq bigint NOT NULL,
    slot integer NOT NULL,
    safe_id bigint NOT NULL,
    candidate_id bigint,
    candidate_writers text[]
) PARTITION BY LIST (slot);
CREATE TABLE pgbroker.stream_watermark_0 PARTITION OF pgbroker.stream_watermark FOR VALUES IN (0);
CREATE TABLE pgbroker.stream_watermark_1 PARTITION OF pgbroker.stream_watermark FOR VALUES IN (1);
CREATE INDEX stream_watermark_newest ON pgbroker.stream_watermark (stream_name, seq);

-- retry_queue_made: the group made its retry queue (it did not exist), which
-- then goes with the group (functions/92_streams.sql, drop_stream_group).
CREATE TABLE pgbroker.stream_group (
    stream_name text NOT NULL REFERENCES pgbroker.stream ON DELETE CASCADE,
    group_name text NOT NULL CHECK (group_name ~ '^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$'),
    retry_queue varchar NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    retry_queue_made boolean NOT NULL DEFAULT false,
    PRIMARY KEY (stream_name, group_name)
);

-- A group's partition: who reads it, under which epoch, and the owner's
-- generation (functions/92_streams.sql, "Generations"; NULL: none named).
-- Written only when the partition changes hands or its owner rewinds; its
-- position is in stream_position.
CREATE TABLE pgbroker.stream_cursor (
    stream_name text NOT NULL,
    group_name text NOT NULL,
    partition integer NOT NULL,
    owner text,
    epoch bigint NOT NULL DEFAULT 0,
    generation bigint,
    PRIMARY KEY (stream_name, group_name, partition),
    FOREIGN KEY (stream_name, group_name) REFERENCES pgbroker.stream_group ON DELETE CASCADE
) WITH (fillfactor = 30);

-- The positions of every group's partitions, insert-only: a move appends a
-- row, and a partition's position is its row with the highest seq. Two child
-- tables by slot, a ring that maintenance empties with TRUNCATE (see
-- functions/92_streams.sql, "Positions"). No foreign key: its check would
-- lock the group's row at every insert; a dropped group's rows are never
-- read again and go with their child table.
CREATE SEQUENCE pgbroker.stream_position_seq AS bigint;
CREATE TABLE pgbroker.stream_position (
    stream_name text NOT NULL,
    group_name text NOT NULL,
    partition integer NOT NULL,
    seq bigint NOT NULL,
    slot integer NOT NULL,
    acked_id bigint NOT NULL,
    delivered_id bigint NOT NULL,
    acked_at timestamptz
) PARTITION BY LIST (slot);
CREATE TABLE pgbroker.stream_position_0 PARTITION OF pgbroker.stream_position FOR VALUES IN (0);
CREATE TABLE pgbroker.stream_position_1 PARTITION OF pgbroker.stream_position FOR VALUES IN (1);
CREATE INDEX stream_position_newest ON pgbroker.stream_position (stream_name, group_name, partition, seq);

CREATE TABLE pgbroker.stream_consumer (
    stream_name text NOT NULL,
    group_name text NOT NULL,
    consumer text NOT NULL,
    expires_at timestamptz NOT NULL,
    renewed_at timestamptz NOT NULL,
    -- Live by its lease alone: no session holds a liveness lock for it (functions/92_streams.sql, "Live").
    lease_only boolean NOT NULL DEFAULT false,
    PRIMARY KEY (stream_name, group_name, consumer),
    FOREIGN KEY (stream_name, group_name) REFERENCES pgbroker.stream_group ON DELETE CASCADE
) WITH (fillfactor = 30);

-- Idempotency keys of sends to a stream, as pgbroker.idempotency_keys for
-- queues (structure/34_dedup.sql).
CREATE TABLE pgbroker.stream_idempotency_keys (
    stream_name text NOT NULL REFERENCES pgbroker.stream ON DELETE CASCADE,
    scope text NOT NULL DEFAULT '',
    idempotency_key text NOT NULL,
    request_digest bytea NOT NULL,
    ids bigint[] NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (stream_name, scope, idempotency_key)
);

INSERT INTO pgbroker.role_function (role_kind, function_schema, function_name)
SELECT 'producer', 'pgbroker', f FROM unnest(ARRAY['stream_send', 'stream_send_many']) f
UNION ALL
-- A send that a retry with the same idempotency key answers again (functions/92_streams.sql).
SELECT 'producer', 'pgbroker', 'stream_send_idempotent'
UNION ALL
SELECT 'consumer', 'pgbroker', f FROM unnest(ARRAY[
    'stream_read', 'stream_ack', 'stream_consume', 'stream_release', 'stream_rewind',
    'stream_heartbeat', 'stream_notify_channel']) f
UNION ALL
-- What a StreamWorker looks up at its start: its group's retry queue, whether the stream notifies.
SELECT 'consumer', 'pgbroker', f FROM unnest(ARRAY['streams', 'stream_groups']) f
UNION ALL
SELECT 'monitor', 'pgbroker', f FROM unnest(ARRAY['streams', 'stream_groups', 'stream_lag']) f;
