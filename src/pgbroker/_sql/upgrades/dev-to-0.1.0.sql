-- From a development database (pgbroker.schema_migrations 1..24 or later,
-- installed before the engine was written once) to the 0.1.0 baseline.
--
-- The tables and types of migrations 1..24 are the baseline's; what the later
-- ones brought is made below where it is missing (test_migrations.py proves
-- the result: the databases it upgrades are built by those migrations, kept in
-- tests/data/dev_migrations/). The installer then records version 0.1.0 and
-- re-applies the function files, as after any upgrade.
--
-- Folding in a development migration that came after 0026: add its table and
-- type changes here, written so that they also run on a database that
-- already has them (IF NOT EXISTS, or a check of the catalog), since
-- development databases may stand at 24 or at that migration; add its line to
-- the history below and its file to tests/data/dev_migrations/.
--
-- The history this maps onto the baseline: the migrations such a database
-- records in pgbroker.schema_migrations, as "-- history: version name sha256".
-- A database whose history differs is another build's, and is refused.
-- history: 0001 pgmq_core a3ffd58b9057d36c147db43c43bc86bc37b22c1c754f7647967b8462ccd06eca
-- history: 0002 fenced_acks 7873d898555100fbde9e638e01b2bd29c064e1c204ab037a1f64149fbf1dd004
-- history: 0003 notify 79da40d12d478d13bee189c3af4f72fd4820233a8fc1557af40dfc210bdc44ed
-- history: 0004 fifo_groups 5b357fa76e43f4841dda7cc532e8055cc7b00badb1cc286aa6b4897617736d3a
-- history: 0005 topics be4bf98dfa186ef1058518147223b9d2629c9d5e5c01dacaa76d9df42d582bd5
-- history: 0006 partitioned 501101584d0d064d5994276bd8d164c2a89a191a6ff9aa4a5b6b22d11db6ae8e
-- history: 0007 spark 27076322ea95a442739932c8e578531456b1fcbeb9cd5b4967bbcadaeac1e0e9
-- history: 0008 policies d1a8c529812342cb7540892346827999361c0a3f4299aa15fb5ef083f6425dd6
-- history: 0009 api_keys e48588a50b37f64c328c1d311f2a8bb7ef6d7af79981ea8636812af7050dd964
-- history: 0010 roles ca33b37b00dcfa08e5cb3802a7783954f6dbb42964a523b9e11ab0b372ea6886
-- history: 0011 bridge 202177a7d0c2117d31592909ccc52d9aeb6779e86468d9dc9094eb65bba25301
-- history: 0012 hot_path 978771f97458429ed50a8d42772e64d4dcbf33efa83346b8d8304d5c5acd7e8a
-- history: 0013 timed_from 46ef753dbdf8cbb5c714eee8c3bf58f2d0a335a868fe52fdd32ca7ba37060c52
-- history: 0014 routes 06263bebacfc662766c300f1e80e0056b6f1e326a95837d9356ab6709f47cc5a
-- history: 0015 pgmq_errors 69dd5f8851284282615a723c0b418f8140eab4a18cd1c5e82cf064b280a23b5f
-- history: 0016 codecs d42093c14e111237e644ec93bb36d7b9fe9a323b04e7e59ce00d64e89f48c2a5
-- history: 0017 job_features f2f7babc27a87014c4ec1807977db513aad2c2d9bab82dd7005a4d0a272572b7
-- history: 0018 pgmq_arguments 0be031b4bf3f1620da8efffb6c314ba25d3f332f975badecc9bb1a174e4c65f9
-- history: 0019 spark_pause_limits 2a3e4639dea26c93277a2a398110e4f8c4f4c27d9f7dd0688e6781dd8a1fa177
-- history: 0020 schedules_peek de5e496c6b38fdc9bf0aa0b2306b097ce832cedbb48a8823fbb5a3158d43e29b
-- history: 0021 streams 976365dd757cafce6740f892197a06ebdc312b9047c682a95d660faf1f6396c3
-- history: 0022 stream_spark 8ee6ef52aeb722283eb122483183e2b962f9db068f72bec5af640252c99d19ee
-- history: 0023 stream_bridge 014b4d746fd8a4f3df9109ff6ba46b10e1be97d2da3312264e3db25566a870cd
-- history: 0024 stream_hot_paths 6a7e5e08de3def1a801230796e7087bb73eb37ded1b73d6476e90baecaa936ab
-- history: 0025 security b8408be10b3a0d446f1f361882f4ede19d9914551e10c8e7246bd772a4cc1685
-- history: 0026 queue_scopes 8e8f2e9bc3c2bdf508aa05ba4827bcc5dde4fdc2d25d54abec83830f324bf8f9

-- 0025 security: the functions it removed or gave new arguments (the function
-- files create the new ones).
DROP FUNCTION IF EXISTS pgbroker._prepared(text, text);
DROP FUNCTION IF EXISTS pgbroker._send_many(text, jsonb[], jsonb[], timestamptz);
DROP FUNCTION IF EXISTS pgbroker.prune_inbound_seen(interval, integer);
DROP FUNCTION IF EXISTS pgbroker._route_send(text, jsonb[], jsonb[], timestamptz);

-- 0025 security: pg_monitor no longer reads the queue tables
-- (structure/10_queues.sql). Only before 0025: after it, an operator may have
-- let it again (pgbroker.grant_pg_monitor_payloads).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgbroker.schema_migrations WHERE version = 25) THEN
        REVOKE SELECT ON ALL TABLES IN SCHEMA pgmq FROM pg_monitor;
        ALTER DEFAULT PRIVILEGES IN SCHEMA pgmq REVOKE SELECT ON TABLES FROM pg_monitor;
        GRANT SELECT ON pgmq.meta TO pg_monitor;
    END IF;
END;
$$;

-- 0026 queue scopes: the tables of structure/15_scopes.sql.
DO $$
BEGIN
    IF to_regclass('pgbroker.queue_grant') IS NOT NULL THEN
        RETURN;
    END IF;
    -- The column's function, in the body the function files give it right
    -- after this upgrade (functions/14_scope_patterns.sql); the table is empty
    -- until then.
    CREATE FUNCTION pgbroker._glob_like(pattern text) RETURNS text LANGUAGE sql IMMUTABLE AS 'SELECT pattern';
    CREATE TABLE pgbroker.queue_grant (
        grantee      regrole NOT NULL,
        role_kind    text NOT NULL CHECK (role_kind IN ('producer', 'consumer', 'monitor')),
        pattern      text NOT NULL CHECK (pattern = lower(pattern)),
        like_pattern text NOT NULL GENERATED ALWAYS AS (pgbroker._glob_like(pattern)) STORED,
        granted_at   timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (grantee, role_kind, pattern)
    );
    REVOKE ALL ON pgbroker.queue_grant FROM PUBLIC;
    CREATE TABLE pgbroker.queue_scoped_function (
        role_kind       text NOT NULL CHECK (role_kind IN ('producer', 'consumer', 'monitor')),
        function_schema text NOT NULL,
        function_name   text NOT NULL,
        PRIMARY KEY (role_kind, function_schema, function_name)
    );
    INSERT INTO pgbroker.queue_scoped_function (role_kind, function_schema, function_name)
    SELECT 'producer', 'pgmq', f FROM unnest(ARRAY['send', 'send_batch', 'send_topic', 'send_batch_topic']) f
    UNION ALL
    SELECT 'producer', 'pgbroker', f FROM unnest(ARRAY['receive_many', 'queue_codec']) f
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
END;
$$;

-- Notify channel as pgmq 1.13.1 names it (functions/74_notify.sql): the
-- notify triggers carry the queue's stored name alone, no longer also the
-- lower-cased channel (which _notify_insert now derives from the name).
DO $$
DECLARE
    queue record;
BEGIN
    FOR queue IN
        SELECT c.relname AS qtable, t.queue_name AS stored
        FROM pgmq.notify_insert_throttle t
        JOIN pg_class c ON c.oid = to_regclass(format('pgmq.%I', lower('q_' || t.queue_name)))
        JOIN pg_trigger tg ON tg.tgrelid = c.oid AND tg.tgname = 'pgbroker_notify_insert'
        WHERE tg.tgnargs <> 1
    LOOP
        EXECUTE format('DROP TRIGGER pgbroker_notify_insert ON pgmq.%I', queue.qtable);
        EXECUTE format(
            'CREATE TRIGGER pgbroker_notify_insert AFTER INSERT ON pgmq.%I '
            'FOR EACH STATEMENT EXECUTE FUNCTION pgbroker._notify_insert(%L)',
            queue.qtable, queue.stored);
    END LOOP;
END;
$$;

DROP TABLE pgbroker.schema_migrations;
