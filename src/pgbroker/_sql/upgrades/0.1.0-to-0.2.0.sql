-- From 0.1.0 to 0.2.0: what this release changes in tables and types, and a
-- DROP for each function it removes or re-signatures. Each change is its own
-- block, with the reason; the installer then re-applies the function files.

-- Idempotent sends (issue 23, item 4): the HTTP header Idempotency-Key,
-- pgbroker.send_idempotent and pgbroker.stream_send_idempotent keep each
-- key's request digest and ids (structure/34_dedup.sql, 92_streams.sql); a
-- producer may call them (structure/88_roles.sql, 92_streams.sql). A key is
-- its sender's within a scope (the HTTP API's: the API key), so that one API
-- key's Idempotency-Key never answers or refuses another's send.
CREATE TABLE pgbroker.idempotency_keys (
    queue_name varchar NOT NULL
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    scope text NOT NULL DEFAULT '',
    idempotency_key text NOT NULL,
    request_digest bytea NOT NULL,
    ids bigint[] NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue_name, scope, idempotency_key)
);
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
VALUES ('producer', 'pgbroker', 'send_idempotent'), ('producer', 'pgbroker', 'stream_send_idempotent');
-- A producer granted some queues (pgbroker grant) sends to them idempotently too.
INSERT INTO pgbroker.queue_scoped_function (role_kind, function_schema, function_name)
VALUES ('producer', 'pgbroker', 'send_idempotent');

-- Attempt history (issue 24): pgbroker.fail takes the consumer's traceback,
-- kept with the error of each failed attempt (65_failures.sql).
DROP FUNCTION IF EXISTS pgbroker.fail(text, text[], text);
DROP FUNCTION IF EXISTS pgbroker.fail(text, text, text);

-- Search by body field (issue 24): pgbroker.peek takes message_contains (77_peek.sql).
DROP FUNCTION IF EXISTS pgbroker.peek(text, integer, bigint, text, bigint, text, text, timestamptz, timestamptz);

-- Monitoring (issue 24): failure counters, the stats history `pgbroker serve`
-- samples, and the queue workers' heartbeat rows (structure/96_monitoring.sql).
CREATE TABLE pgbroker.queue_failures (
    queue_name varchar PRIMARY KEY
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    retried bigint NOT NULL,
    dead_lettered bigint NOT NULL
);
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
CREATE INDEX queue_history_sampled_at ON pgbroker.queue_history (sampled_at);
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

-- Insert-only stream positions (issue 25): a group's position per partition
-- leaves stream_cursor (whose every move was an UPDATE, a dead tuple a
-- partition a batch while a transaction held back the xmin horizon) for
-- stream_position, appended to and emptied by TRUNCATE (structure/92_streams.sql,
-- functions/92_streams.sql "Positions"). The cursor rows keep owner and epoch.
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
-- The cursor table made again without the position's columns (a DROP COLUMN
-- would leave its columns numbered unlike a new install's).
LOCK TABLE pgbroker.stream_cursor IN EXCLUSIVE MODE;  -- no move between the copy and the drop
INSERT INTO pgbroker.stream_position (stream_name, group_name, partition, seq, slot, acked_id, delivered_id,
                                      acked_at)
SELECT c.stream_name, c.group_name, c.partition, nextval('pgbroker.stream_position_seq'), 0, c.acked_id,
       c.delivered_id, c.acked_at
FROM pgbroker.stream_cursor c ORDER BY c.stream_name, c.group_name, c.partition;
ALTER TABLE pgbroker.stream_cursor RENAME TO stream_cursor_0_1;
ALTER INDEX pgbroker.stream_cursor_pkey RENAME TO stream_cursor_0_1_pkey;
ALTER TABLE pgbroker.stream_cursor_0_1 DROP CONSTRAINT stream_cursor_stream_name_group_name_fkey;
CREATE TABLE pgbroker.stream_cursor (
    stream_name text NOT NULL,
    group_name text NOT NULL,
    partition integer NOT NULL,
    owner text,
    epoch bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (stream_name, group_name, partition),
    FOREIGN KEY (stream_name, group_name) REFERENCES pgbroker.stream_group ON DELETE CASCADE
) WITH (fillfactor = 30);
INSERT INTO pgbroker.stream_cursor (stream_name, group_name, partition, owner, epoch)
SELECT c.stream_name, c.group_name, c.partition, c.owner, c.epoch FROM pgbroker.stream_cursor_0_1 c;
DROP TABLE pgbroker.stream_cursor_0_1;

-- Insert-only watermark (issue 25): a stream's safe id leaves its row, updated
-- at about every batch of consumers that keep up (a dead tuple each while a
-- transaction held back the xmin horizon), for rows appended to the ring of
-- the positions (structure/92_streams.sql; functions/92_streams.sql "The safe id").
LOCK TABLE pgbroker.stream_watermark IN EXCLUSIVE MODE;  -- no advance between the copy and the drop
ALTER TABLE pgbroker.stream_watermark RENAME TO stream_watermark_0_1;
ALTER INDEX pgbroker.stream_watermark_pkey RENAME TO stream_watermark_0_1_pkey;
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
INSERT INTO pgbroker.stream_watermark (stream_name, seq, slot, safe_id, candidate_id, candidate_writers)
SELECT w.stream_name, w.seq, ((w.seq >> 32) % 2)::integer, w.safe_id, w.candidate_id, w.candidate_writers
FROM (SELECT o.*, nextval('pgbroker.stream_position_seq') AS seq FROM pgbroker.stream_watermark_0_1 o) w;
DROP TABLE pgbroker.stream_watermark_0_1;

-- A consumer's balance returns the partitions it could not give up (92_streams.sql).
DROP FUNCTION IF EXISTS pgbroker._stream_balance(pgbroker.stream, text, text, integer);

-- A queue's read bounds no longer wait for every older transaction of the
-- cluster once the horizon has held a candidate back for a second: the
-- queue's own writers decide (functions/50_reads.sql, "Where reads start").
ALTER TABLE pgbroker.queue_head ADD COLUMN next_at timestamptz, ADD COLUMN next_writers text[],
    ADD COLUMN timed_next_writers text[];

-- A queue's read bounds insert-only (structure/50_reads.sql): an advance
-- appends a row, and the bounds are the queue's row with the highest seq.
CREATE SEQUENCE pgbroker.queue_head_seq;
ALTER TABLE pgbroker.queue_head DROP CONSTRAINT queue_head_pkey,
    ADD COLUMN seq bigint NOT NULL DEFAULT nextval('pgbroker.queue_head_seq'),
    RESET (fillfactor);
ALTER TABLE pgbroker.queue_head ADD PRIMARY KEY (queue_name, seq);

-- A stream's read function reads every partition of a segment in one call
-- (functions/92_streams.sql): its arguments are arrays now.
DO $$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT stream_name FROM pgbroker.stream LOOP
        EXECUTE format('DROP FUNCTION IF EXISTS pgbroker.%I(integer, integer, bigint, bigint, integer, bigint, text)',
                       's_' || s.stream_name || '_read');
    END LOOP;
END;
$$;

-- The read and pop routes look the queue's bounds up themselves, once a call
-- for both scans (functions/90_routes.sql): their helper is gone.
DROP FUNCTION IF EXISTS pgbroker._route_ready_from(text);

-- A consumer's heartbeat between reads (functions/92_streams.sql): a
-- StreamWorker whose batch outlasts its lease keeps its partitions. A
-- consumer may call it (structure/92_streams.sql).
INSERT INTO pgbroker.role_function (role_kind, function_schema, function_name)
VALUES ('consumer', 'pgbroker', 'stream_heartbeat');

-- A StreamWorker under the consumer role looks up its group's retry queue
-- (stream_groups) and whether the stream notifies (streams) at its start:
-- both were the monitor's only, and the worker stopped there
-- (structure/92_streams.sql).
INSERT INTO pgbroker.role_function (role_kind, function_schema, function_name)
VALUES ('consumer', 'pgbroker', 'streams'), ('consumer', 'pgbroker', 'stream_groups');

-- Generations (functions/92_streams.sql): a read sent before a consumer's
-- rewind and run after it (a hung session going on) moved the partitions
-- past rows no one handled. The rewind marks the consumer's cursor rows with
-- its new generation, and reads under another are refused; stream_read,
-- stream_consume and stream_rewind take the consumer's generation.
ALTER TABLE pgbroker.stream_cursor ADD COLUMN generation bigint;
DROP FUNCTION IF EXISTS pgbroker.stream_read(text, text, text, integer, integer);
DROP FUNCTION IF EXISTS pgbroker.stream_consume(text, text, text, integer, integer, integer[], bigint[], bigint[],
                                                bigint[], text[]);
DROP FUNCTION IF EXISTS pgbroker.stream_rewind(text, text, text);
DROP FUNCTION IF EXISTS pgbroker._stream_read(text, text, text, integer, integer, integer[], bigint[], bigint[]);

-- Lease-only consumers (functions/92_streams.sql, "Live"): a caller whose
-- sessions serve many consumers (the HTTP API's pool) takes no liveness lock,
-- whose sessions kept one for every consumer name they were given until the
-- server's lock table was full. stream_read, stream_consume and
-- stream_heartbeat take lease_only.
ALTER TABLE pgbroker.stream_consumer ADD COLUMN lease_only boolean NOT NULL DEFAULT false;
DROP FUNCTION IF EXISTS pgbroker.stream_read(text, text, text, integer, integer, bigint);
DROP FUNCTION IF EXISTS pgbroker.stream_consume(text, text, text, integer, integer, integer[], bigint[], bigint[],
                                                bigint[], text[], bigint);
DROP FUNCTION IF EXISTS pgbroker.stream_heartbeat(text, text, text, integer);
DROP FUNCTION IF EXISTS pgbroker._stream_read(text, text, text, integer, integer, integer[], bigint[], bigint[],
                                              bigint);
DROP FUNCTION IF EXISTS pgbroker._stream_balance(pgbroker.stream, text, text, integer, bigint);
DROP FUNCTION IF EXISTS pgbroker._stream_renew(text, text, text, integer);

-- A stream ack's failures (functions/92_streams.sql, _stream_retry_failed):
-- only those of the ranges the ack settles are copied to the retry queue,
-- each once; the epochs come along to say which ranges those are.
DROP FUNCTION IF EXISTS pgbroker._stream_retry_failed(pgbroker.stream_group, text, integer[], bigint[], bigint[],
                                                      text[]);

-- Group scopes of API keys (structure/84_keys.sql): a key that may read a
-- stream could read, ack and hold the partitions of every group of it, other
-- teams' too. Keys made before keep every group ('{*}'), as they had.
ALTER TABLE pgbroker.api_keys ADD COLUMN groups text[] NOT NULL DEFAULT '{*}';

-- An inbound bridge under a producer granted some queues only (pgbroker grant
-- producer) prunes its own queue's message ids (86_bridge.sql): it could not.
INSERT INTO pgbroker.queue_scoped_function (role_kind, function_schema, function_name)
VALUES ('producer', 'pgbroker', 'prune_inbound_seen');

-- An inbound bridge into a stream under a producer login (94_stream_bridge.sql):
-- the producer receives into streams and prunes the ids of one stream, the
-- bridge's own, which the prune now names (the ids of every stream went, with
-- the window of whichever bridge pruned).
DROP FUNCTION IF EXISTS pgbroker.prune_stream_inbound_seen(interval, integer);
INSERT INTO pgbroker.role_function (role_kind, function_schema, function_name)
SELECT 'producer', 'pgbroker', f FROM unnest(ARRAY['stream_receive_many', 'prune_stream_inbound_seen']) f;

-- A group's retry queue goes with the group when the group made it
-- (functions/92_streams.sql, drop_stream_group): it stayed, and a group made
-- again under the name took it over with the old group's failures. A group
-- made its queue in its own transaction, so the queue's created_at is the
-- group's (now() is the transaction's start): a queue older than its group
-- was there before it and stays.
ALTER TABLE pgbroker.stream_group ADD COLUMN retry_queue_made boolean NOT NULL DEFAULT false;
UPDATE pgbroker.stream_group g SET retry_queue_made = true
FROM pgmq.meta m WHERE m.queue_name = g.retry_queue AND m.created_at = g.created_at;
