-- Least-privilege database roles (`pgbroker install --roles`), and the
-- consume counter of /metrics.
--
-- Roles. pgbroker.grant_roles(prefix) makes three NOLOGIN group roles,
-- <prefix>_producer, <prefix>_consumer and <prefix>_monitor, and grants each
-- EXECUTE on exactly the entry points listed for it in pgbroker.role_function,
-- and nothing else: no privilege on any table, sequence or other function.
-- Those entry points become SECURITY DEFINER (they run as their owner, the
-- installer) with a fixed search_path. Why functions and not table grants:
--   * a table grant cannot tell an operation from another: sending needs
--     INSERT on the queue table and reading needs UPDATE, but acking needs
--     DELETE, which would also let a consumer purge the queue; a function is
--     the operation itself;
--   * a queue created later needs nothing: no table is ever granted, so there
--     is no per-queue grant to forget, whoever creates the queue (ALTER DEFAULT
--     PRIVILEGES would only cover queues created by the role it names);
--   * the monitor sees lengths and ages through metrics functions and has no
--     way at all to a message column.
-- EXECUTE is revoked from PUBLIC on those entry points: as SECURITY DEFINER
-- they must not be open to every login. The remaining functions keep PUBLIC
-- EXECUTE, and are harmless to a role without table privileges: they run with
-- the caller's rights and fail on the first table they touch.
-- Migrations may redefine an entry point, which resets it to SECURITY INVOKER
-- (safe: the roles then lose the operation, they gain nothing); the installer
-- calls grant_roles again for every prefix in pgbroker.role_sets after each
-- upgrade, so the roles keep working.

CREATE TABLE pgbroker.role_sets (
    prefix     text PRIMARY KEY CHECK (prefix ~ '^[a-z_][a-z0-9_]{0,40}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The functions each role may call, every overload of each name. A later
-- migration that adds an operation adds its rows here.
CREATE TABLE pgbroker.role_function (
    role_kind       text NOT NULL CHECK (role_kind IN ('producer', 'consumer', 'monitor')),
    function_schema text NOT NULL,
    function_name   text NOT NULL,
    PRIMARY KEY (role_kind, function_schema, function_name)
);

INSERT INTO pgbroker.role_function (role_kind, function_schema, function_name)
SELECT 'producer', 'pgmq', f FROM unnest(ARRAY['send', 'send_batch', 'send_topic', 'send_batch_topic']) f
UNION ALL
SELECT 'consumer', 'pgmq', f FROM unnest(ARRAY[
    'read', 'read_with_poll', 'read_grouped', 'read_grouped_with_poll', 'read_grouped_head',
    'read_grouped_head_with_poll', 'read_grouped_rr', 'read_grouped_rr_with_poll',
    'pop', 'delete', 'archive', 'set_vt']) f
UNION ALL
SELECT 'consumer', 'pgbroker', f FROM unnest(ARRAY[
    'read', 'read_with_poll', 'peek', 'ack', 'nack', 'extend', 'stale_reason', 'complete', 'fail',
    'policy', 'notify_channel']) f
UNION ALL
SELECT 'monitor', 'pgmq', f FROM unnest(ARRAY['metrics', 'metrics_all', 'list_queues']) f
UNION ALL
SELECT 'monitor', 'pgbroker', f FROM unnest(ARRAY['queue_stats', 'messages_consumed']) f;

-- Messages removed from a queue so far (acked, deleted, archived, popped or
-- dead-lettered): the deleted-row count the statistics system keeps for the
-- queue's table (its leaves when partitioned). Reading it costs nothing
-- whatever the queue's size, and nothing is added to the hot path, unlike a
-- counter row every ack would have to update (and lock). It behaves like a
-- Prometheus counter: it falls back to 0 when statistics are reset or the
-- server crashes, and a dropped partition takes its share with it, which
-- rate() reads as a counter reset. Approximate: deletions rolled back count
-- too, and a backend reports its counts at most about once a second.
CREATE FUNCTION pgbroker.messages_consumed(queue_name text)
RETURNS bigint LANGUAGE sql STABLE AS $$
    -- to_regclass: a queue dropped while a scrape runs counts 0, it does not fail the scrape.
    WITH q AS (SELECT to_regclass(format('pgmq.%I', pgbroker._table(queue_name))) AS rel)
    SELECT coalesce(sum(pg_stat_get_tuples_deleted(c.oid)), 0)::bigint
    FROM pg_class c
    -- pg_partition_tree lists nothing for a plain table: the table itself is added.
    WHERE c.relkind <> 'p'
      AND c.oid IN (SELECT rel FROM q UNION ALL SELECT t.relid FROM q, pg_partition_tree(q.rel) t WHERE t.isleaf);
$$;

-- The functions (every overload) listed for a role kind; NULL: for any kind.
CREATE FUNCTION pgbroker._role_procs(kind text)
RETURNS SETOF oid LANGUAGE sql STABLE AS $$
    SELECT p.oid
    FROM pgbroker.role_function rf
    JOIN pg_namespace n ON n.nspname = rf.function_schema
    JOIN pg_proc p ON p.pronamespace = n.oid AND p.proname = rf.function_name
    WHERE kind IS NULL OR rf.role_kind = kind
    ORDER BY p.oid;
$$;

CREATE FUNCTION pgbroker.grant_roles(prefix text DEFAULT 'pgbroker')
RETURNS TABLE (role_name text, functions integer) LANGUAGE plpgsql AS $$
DECLARE
    kind text;
    fn regprocedure;
    granted integer;
BEGIN
    PERFORM pgbroker._check_arg(prefix ~ '^[a-z_][a-z0-9_]{0,40}$',
        format('role prefix %L must be a lower-case identifier of at most 41 characters', prefix),
        'The roles are named <prefix>_producer, <prefix>_consumer and <prefix>_monitor.');
    INSERT INTO pgbroker.role_sets (prefix) VALUES (grant_roles.prefix) ON CONFLICT DO NOTHING;

    FOR fn IN SELECT DISTINCT p.oid::regprocedure FROM pgbroker._role_procs(NULL) p(oid) LOOP
        -- pg_temp last: a caller's temporary objects must never shadow ours.
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pgmq, pgbroker, pg_temp',
                       fn);
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
    END LOOP;

    FOREACH kind IN ARRAY ARRAY['producer', 'consumer', 'monitor'] LOOP
        role_name := prefix || '_' || kind;
        IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = role_name) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
        END IF;
        -- Exactly the listed functions: whatever was granted before is taken back first.
        EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgmq, pgbroker FROM %I', role_name);
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA pgmq, pgbroker FROM %I', role_name);
        EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgmq, pgbroker FROM %I', role_name);
        EXECUTE format('GRANT USAGE ON SCHEMA pgmq, pgbroker TO %I', role_name);
        granted := 0;
        FOR fn IN SELECT p.oid::regprocedure FROM pgbroker._role_procs(kind) p(oid) LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, role_name);
            granted := granted + 1;
        END LOOP;
        functions := granted;
        RETURN NEXT;
    END LOOP;
END;
$$;
