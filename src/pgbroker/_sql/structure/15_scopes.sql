-- Queue scopes: database roles granted a role kind on some queues only.
-- The tables of this concern, created once; functions/15_scopes.sql holds its
-- functions and the header that explains them.

-- The queue grants. pattern is the glob in lower case; like_pattern the same
-- as a LIKE pattern (_ and % taken literally: pgbroker._glob_like,
-- functions/14_scope_patterns.sql).
CREATE TABLE pgbroker.queue_grant (
    grantee      regrole NOT NULL,
    role_kind    text NOT NULL CHECK (role_kind IN ('producer', 'consumer', 'monitor')),
    pattern      text NOT NULL CHECK (pattern = lower(pattern)),
    like_pattern text NOT NULL GENERATED ALWAYS AS (pgbroker._glob_like(pattern)) STORED,
    granted_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (grantee, role_kind, pattern)
);
REVOKE ALL ON pgbroker.queue_grant FROM PUBLIC;

-- The entry points a queue grant of a kind gives: each of them takes a queue
-- and checks it with pgbroker._authorize (a subset of pgbroker.role_function;
-- tests/engine/test_queue_scopes.py holds them to both). An entry point
-- added to role_function is not granted to scoped roles until it is listed
-- here too.
CREATE TABLE pgbroker.queue_scoped_function (
    role_kind       text NOT NULL CHECK (role_kind IN ('producer', 'consumer', 'monitor')),
    function_schema text NOT NULL,
    function_name   text NOT NULL,
    PRIMARY KEY (role_kind, function_schema, function_name)
);

INSERT INTO pgbroker.queue_scoped_function (role_kind, function_schema, function_name)
SELECT 'producer', 'pgmq', f FROM unnest(ARRAY['send', 'send_batch', 'send_topic', 'send_batch_topic']) f
UNION ALL
SELECT 'producer', 'pgbroker', f FROM unnest(ARRAY['receive_many', 'queue_codec', 'send_idempotent']) f
UNION ALL
-- Its own queue's inbound ids, which a scoped producer's inbound bridge prunes (86_bridge.sql).
SELECT 'producer', 'pgbroker', 'prune_inbound_seen'
UNION ALL
SELECT 'consumer', 'pgmq', f FROM unnest(ARRAY[
    'read', 'read_with_poll', 'read_grouped', 'read_grouped_with_poll', 'read_grouped_head',
    'read_grouped_head_with_poll', 'read_grouped_rr', 'read_grouped_rr_with_poll',
    'pop', 'delete', 'archive', 'set_vt']) f
UNION ALL
SELECT 'consumer', 'pgbroker', f FROM unnest(ARRAY[
    'read', 'read_with_poll', 'peek', 'ack', 'nack', 'extend', 'stale_reason', 'complete', 'fail',
    'policy', 'notify_channel', 'consume', 'ack_published']) f
UNION ALL
SELECT 'monitor', 'pgmq', 'metrics'
UNION ALL
SELECT 'monitor', 'pgbroker', f FROM unnest(ARRAY['messages_consumed', 'is_paused']) f;

