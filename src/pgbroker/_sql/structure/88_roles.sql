-- Roles: least-privilege database roles (`pgbroker install --roles`).
-- The tables and types of this concern, created once; functions/88_roles.sql
-- holds its functions and the header that explains them.

-- The prefixes grant_roles has made roles for.
CREATE TABLE pgbroker.role_sets (
    prefix     text PRIMARY KEY CHECK (prefix ~ '^[a-z_][a-z0-9_]{0,40}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The functions each role may call, every overload of each name. An engine
-- change that adds an operation adds its rows here (and its upgrade adds
-- them to existing databases).
CREATE TABLE pgbroker.role_function (
    role_kind       text NOT NULL CHECK (role_kind IN ('producer', 'consumer', 'monitor')),
    function_schema text NOT NULL,
    function_name   text NOT NULL,
    PRIMARY KEY (role_kind, function_schema, function_name)
);

-- A producer sends, a consumer reads and settles what it read, a monitor
-- reads lengths and ages.
INSERT INTO pgbroker.role_function (role_kind, function_schema, function_name)
SELECT 'producer', 'pgmq', f FROM unnest(ARRAY['send', 'send_batch', 'send_topic', 'send_batch_topic']) f
UNION ALL
-- An inbound bridge (86_bridge.sql) produces, and prunes what it recorded.
SELECT 'producer', 'pgbroker', f FROM unnest(ARRAY['receive_many', 'prune_inbound_seen']) f
UNION ALL
-- The default codec of a queue's sends (20_policies.sql).
SELECT 'producer', 'pgbroker', 'queue_codec'
UNION ALL
-- A send that a retry with the same idempotency key answers again (34_dedup.sql).
SELECT 'producer', 'pgbroker', 'send_idempotent'
UNION ALL
SELECT 'consumer', 'pgmq', f FROM unnest(ARRAY[
    'read', 'read_with_poll', 'read_grouped', 'read_grouped_with_poll', 'read_grouped_head',
    'read_grouped_head_with_poll', 'read_grouped_rr', 'read_grouped_rr_with_poll',
    'pop', 'delete', 'archive', 'set_vt']) f
UNION ALL
-- ack_published: an outbound bridge consumes.
SELECT 'consumer', 'pgbroker', f FROM unnest(ARRAY[
    'read', 'read_with_poll', 'peek', 'ack', 'nack', 'extend', 'stale_reason', 'complete', 'fail',
    'policy', 'notify_channel', 'consume', 'ack_published']) f
UNION ALL
SELECT 'monitor', 'pgmq', f FROM unnest(ARRAY['metrics', 'metrics_all', 'list_queues']) f
UNION ALL
SELECT 'monitor', 'pgbroker', f FROM unnest(ARRAY['queue_stats', 'messages_consumed', 'is_paused']) f;
