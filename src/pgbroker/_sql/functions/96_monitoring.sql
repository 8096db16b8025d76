-- Monitoring: what the dashboard shows beyond one scrape.
--
-- Activity: pgbroker.fail and dead-lettering count each queue's failed
-- deliveries in pgbroker.queue_failures (retried, dead_lettered), counters
-- like total_sent. Only failures touch that row, never sends, reads or acks.
-- pgbroker.queue_activity reads them with the messages in flight.
--
-- History: pgbroker.sample_queue_history, which `pgbroker serve` calls on an
-- interval, records every queue's stats (length, in flight, oldest age, and
-- the sent, consumed, retried and dead-lettered counters, whose differences
-- are the rates) in pgbroker.queue_history, and deletes samples past the
-- retention. Several servers may sample the same database: one samples per
-- interval, the others find the fresh sample and skip.
--
-- Workers: each queue worker of the runtime (pgbroker.runtime) registers a
-- row on start, renews it with its heartbeat (what it holds, what it did),
-- and deletes it when it stops. The row of a worker that died goes stale and
-- is deleted by the next heartbeat or sample.

------------------------------------------------------------------------------
-- Activity
------------------------------------------------------------------------------

-- Add to a queue's failure counters (its stored name; a queue dropped
-- meanwhile counts nothing).
CREATE OR REPLACE FUNCTION pgbroker._count_failures(queue_name text, retried bigint, dead_lettered bigint)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO pgbroker.queue_failures AS f (queue_name, retried, dead_lettered)
    SELECT m.queue_name, $2, $3 FROM pgmq.meta m WHERE m.queue_name = $1
    ON CONFLICT ON CONSTRAINT queue_failures_pkey DO UPDATE
        SET retried = f.retried + excluded.retried, dead_lettered = f.dead_lettered + excluded.dead_lettered;
$$;

-- What a queue's consumers are doing: in_flight, its messages delivered and
-- not visible again yet (leased, or waiting out a retry's back-off), counted
-- exactly up to exact_below; and its failed deliveries since it was made,
-- retried (given back with the back-off) and dead_lettered (by a failure, or
-- by a read past max_deliveries).
-- Since: 0.2.0
CREATE OR REPLACE FUNCTION pgbroker.queue_activity(queue_name text, exact_below bigint DEFAULT 10000)
RETURNS TABLE (in_flight bigint, retried bigint, dead_lettered bigint) LANGUAGE plpgsql STABLE AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('monitor', queue_name);
BEGIN
    in_flight := pgbroker._bounded_count(
        format('pgmq.%I WHERE vt > now() AND read_ct > 0', pgbroker._table(queue_name)), exact_below);
    SELECT coalesce(max(f.retried), 0), coalesce(max(f.dead_lettered), 0) INTO retried, dead_lettered
    FROM pgbroker.queue_failures f WHERE f.queue_name = pgbroker._stored_name(queue_activity.queue_name);
    RETURN NEXT;
END;
$$;

------------------------------------------------------------------------------
-- History
------------------------------------------------------------------------------

-- Record a sample of every queue's stats, unless one younger than
-- min_interval exists (another server sampled), and delete the samples older
-- than retention and the stale rows of workers that died. Counts past
-- exact_below are estimates, as in pgbroker.queue_stats. Returns the rows
-- recorded (0: skipped).
-- Since: 0.2.0
CREATE OR REPLACE FUNCTION pgbroker.sample_queue_history(
    min_interval interval DEFAULT '10 seconds', retention interval DEFAULT '24 hours',
    exact_below bigint DEFAULT 10000)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    sampled integer := 0;
BEGIN
    PERFORM pgbroker._check_arg(min_interval >= interval '0', 'min_interval must be >= 0',
                                'Pass how often the history is sampled.');
    PERFORM pgbroker._check_arg(retention > interval '0', 'retention must be > 0',
                                'Pass how long samples are kept.');
    -- One sampler at a time, on a table lock only the schema's owner may take
    -- (an outsider holding the advisory lock once used here stopped the
    -- history for good); a server that finds another sampling for longer
    -- than the lock_timeout skips this round. SHARE UPDATE EXCLUSIVE lets
    -- the history's readers through; autovacuum gives way to a waiter.
    IF NOT pgbroker._lock_within('LOCK TABLE pgbroker.queue_history IN SHARE UPDATE EXCLUSIVE MODE', '2s') THEN
        RETURN 0;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgbroker.queue_history h WHERE h.sampled_at > now() - min_interval) THEN
        INSERT INTO pgbroker.queue_history
        SELECT s.queue_name, now(), s.queue_length, a.in_flight, s.oldest_msg_age_sec, s.total_sent,
               pgbroker.messages_consumed(s.queue_name), a.retried, a.dead_lettered
        FROM pgbroker.queue_stats(exact_below) s
        CROSS JOIN LATERAL pgbroker.queue_activity(s.queue_name, exact_below) a;
        GET DIAGNOSTICS sampled = ROW_COUNT;
    END IF;
    DELETE FROM pgbroker.queue_history h WHERE h.sampled_at < now() - retention;
    PERFORM pgbroker._forget_stale_workers();
    RETURN sampled;
END;
$$;

-- The samples since a time, every queue's, oldest first, thinned to at most
-- about points per queue (the latest sample of each equal slice of the time
-- since then): a day of samples draws as a chart without sending them all.
-- Since: 0.2.0
CREATE OR REPLACE FUNCTION pgbroker.queue_history(since timestamptz, points integer DEFAULT 300)
RETURNS SETOF pgbroker.queue_history LANGUAGE plpgsql STABLE AS $$
DECLARE
    slice double precision;
BEGIN
    PERFORM pgbroker._check_arg(since IS NOT NULL, 'since must be a time', 'Pass where the history starts.');
    PERFORM pgbroker._check_arg(points BETWEEN 1 AND 10000, 'points must be between 1 and 10000',
                                'Pass how many points a chart draws.');
    slice := greatest(extract(epoch FROM now() - since), 1) / points;
    RETURN QUERY
    SELECT (h).* FROM (
        SELECT DISTINCT ON (h.queue_name, floor(extract(epoch FROM h.sampled_at - since) / slice)) h
        FROM pgbroker.queue_history h
        WHERE h.sampled_at >= since
        ORDER BY h.queue_name, floor(extract(epoch FROM h.sampled_at - since) / slice), h.sampled_at DESC
    ) thinned
    ORDER BY (h).sampled_at, (h).queue_name;
END;
$$;

------------------------------------------------------------------------------
-- Workers
------------------------------------------------------------------------------

-- How long a worker's row lives without a heartbeat: several of its beats.
CREATE OR REPLACE FUNCTION pgbroker._worker_stale_after()
RETURNS interval LANGUAGE sql IMMUTABLE AS $$ SELECT interval '1 minute' $$;

-- How many workers a queue has registered at once, at most: the panel is read whole, and a
-- consumer registering made-up workers without end filled it.
CREATE OR REPLACE FUNCTION pgbroker._workers_per_queue()
RETURNS integer LANGUAGE sql IMMUTABLE AS $$ SELECT 1000 $$;

CREATE OR REPLACE FUNCTION pgbroker._forget_stale_workers()
RETURNS void LANGUAGE sql AS $$
    DELETE FROM pgbroker.queue_workers w WHERE w.heartbeat_at < now() - pgbroker._worker_stale_after();
$$;

-- Register a queue worker, or renew its row: its process, its slots, the
-- messages it holds now and what it has done since it started. A worker
-- beats well within a minute; its row is deleted a minute after its last
-- beat.
-- Errors: PB007 for a new worker of a queue that has 1,000 registered.
-- Since: 0.2.0
CREATE OR REPLACE FUNCTION pgbroker.worker_heartbeat(
    queue_name text, worker_id uuid, host text, pid integer, concurrency integer,
    in_flight integer, completed bigint, retried bigint, dead_lettered bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    registered boolean;
BEGIN
    -- The panel's rows are a consumer's to write: of a queue there is, with a host no longer
    -- than a hostname (253), not text that fills the table at will, nor rows without end.
    PERFORM pgbroker._table(queue_name);
    PERFORM pgbroker._check_arg(length(host) <= 255, 'host must be given, at most 255 characters',
        'Pass the worker''s hostname.');
    PERFORM pgbroker._forget_stale_workers();
    -- The queue's stored name, not the caller's spelling: the panel lists each queue once.
    INSERT INTO pgbroker.queue_workers AS w
    VALUES (worker_id, pgbroker._stored_name(queue_name), host, pid, concurrency, now(), now(), in_flight,
            completed, retried, dead_lettered)
    ON CONFLICT ON CONSTRAINT queue_workers_pkey DO UPDATE
        SET heartbeat_at = now(), queue_name = excluded.queue_name, concurrency = excluded.concurrency,
            in_flight = excluded.in_flight, completed = excluded.completed, retried = excluded.retried,
            dead_lettered = excluded.dead_lettered
        -- Only a row of the queue this call was authorized for: a worker of another queue is
        -- not the caller's to renew, whatever id it gives. (A row an earlier build wrote may
        -- hold another spelling of the queue's name: renewed, it takes the stored one.)
        WHERE lower(w.queue_name) = lower(excluded.queue_name)
    RETURNING w.xmax = 0 INTO registered;  -- (a new row: no updater)
    IF registered THEN
        PERFORM pgbroker._check_arg(
            (SELECT count(*) FROM pgbroker.queue_workers k
             WHERE lower(k.queue_name) = lower(worker_heartbeat.queue_name)) <= pgbroker._workers_per_queue(),
            format('queue "%s" has %s workers registered already', queue_name, pgbroker._workers_per_queue()),
            'Stop workers, or wait a minute for the rows of those that died to go.');
    END IF;
END;
$$;

-- A queue worker of queue_name stopped: its row goes.
-- Since: 0.2.0
CREATE OR REPLACE FUNCTION pgbroker.worker_stopped(queue_name text, worker_id uuid)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
BEGIN
    DELETE FROM pgbroker.queue_workers w
    WHERE w.worker_id = worker_stopped.worker_id AND lower(w.queue_name) = lower(worker_stopped.queue_name);
END;
$$;

-- The queue workers running, by queue and host, each with the seconds since
-- its last heartbeat (a worker past a minute is gone, or stuck).
-- Since: 0.2.0
CREATE OR REPLACE FUNCTION pgbroker.queue_workers()
RETURNS TABLE (worker_id uuid, queue_name text, host text, pid integer, concurrency integer,
               started_at timestamptz, heartbeat_at timestamptz, heartbeat_age_sec double precision,
               in_flight integer, completed bigint, retried bigint, dead_lettered bigint)
LANGUAGE sql STABLE AS $$
    SELECT w.worker_id, w.queue_name, w.host, w.pid, w.concurrency, w.started_at, w.heartbeat_at,
           extract(epoch FROM now() - w.heartbeat_at)::float8, w.in_flight, w.completed, w.retried,
           w.dead_lettered
    FROM pgbroker.queue_workers w
    WHERE w.heartbeat_at >= now() - pgbroker._worker_stale_after()
    ORDER BY w.queue_name, w.host, w.pid, w.started_at;
$$;

-- A stream's consumers now: each group's members, with their last renewal
-- and the time their membership lapses without another.
-- Since: 0.2.0
CREATE OR REPLACE FUNCTION pgbroker.stream_consumers(stream_name text)
RETURNS TABLE (group_name text, consumer text, renewed_at timestamptz, expires_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT k.group_name, k.consumer, k.renewed_at, k.expires_at
    FROM pgbroker.stream_consumer k
    WHERE k.stream_name = (pgbroker._stream_row($1)).stream_name AND k.expires_at > now()
    ORDER BY k.group_name, k.consumer;
$$;

------------------------------------------------------------------------------
-- Sessions
------------------------------------------------------------------------------

-- The sessions of this database whose transaction has been open longer than
-- older_than and that hold a lock on a table of a queue, a stream or the
-- engine, or hold back the xmin horizon: what keeps other consumers from the
-- rows it locked (a stream's partitions it read, a message it set_vt), the
-- retention and ring rotation of a stream from its tables, a partition drop
-- from its queue, and vacuum from every dead tuple newer than it. A client
-- that called set_vt or a stream read in an explicit transaction and left it
-- open shows here as idle in transaction, with its last query. End it with
-- pg_terminate_backend(pid). A caller without pg_read_all_stats (pg_monitor)
-- sees the query and client of its own roles' sessions only, as in
-- pg_stat_activity: the function runs as its owner, who may see every
-- session's, so it decides for its caller (the login and the roles it may SET
-- ROLE to); a monitor read every session's last statement here, literals and
-- passwords in it included.
-- Arguments: older_than: how long a transaction has been open to be listed;
--   stream_name: only the sessions that hold a lock on that stream's log (its
--   retention cannot empty the child tables they hold) or on the ring of
--   positions (no rotation can empty it).
-- Returns: one row a session, the oldest transaction first: tables, the
--   engine's tables it holds a lock on (a partition by its own name);
--   holds_horizon, whether it keeps vacuum from removing dead tuples.
-- Errors: PB020 for a stream that does not exist.
-- Since: 0.2.0
CREATE OR REPLACE FUNCTION pgbroker.blocking_sessions(older_than interval DEFAULT '1 minute',
                                           stream_name text DEFAULT NULL)
RETURNS TABLE (pid integer, role_name text, application_name text, client_addr inet, state text,
               transaction_age_sec double precision, state_age_sec double precision, tables text[],
               holds_horizon boolean, query text)
LANGUAGE sql STABLE AS $$
    SELECT x.pid, x.usename::text, x.application_name, CASE WHEN x.visible THEN x.client_addr END, x.state,
           extract(epoch FROM clock_timestamp() - x.xact_start)::float8,
           extract(epoch FROM clock_timestamp() - x.state_change)::float8,
           x.tables, x.holds_horizon, CASE WHEN x.visible THEN x.query ELSE '<insufficient privilege>' END
    FROM (SELECT a.*, a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL AS holds_horizon,
                 pg_has_role(session_user, 'pg_read_all_stats', 'MEMBER')
                     OR pg_has_role(session_user, a.usesysid, 'MEMBER') AS visible,
                 ARRAY(SELECT DISTINCT c.oid::regclass::text
                       FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_class c ON c.oid = l.relation
                       WHERE l.pid = a.pid AND l.locktype = 'relation' AND l.granted
                         AND c.relkind IN ('r', 'p')
                         AND c.relnamespace IN (to_regnamespace('pgmq'), to_regnamespace('pgbroker'))
                       ORDER BY 1) AS tables,
                 ARRAY(SELECT l.relation FROM pg_catalog.pg_locks l
                       WHERE l.pid = a.pid AND l.locktype = 'relation' AND l.granted) AS relations
          FROM pg_catalog.pg_stat_activity a
          WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
            AND a.backend_type = 'client backend'
            AND a.xact_start < clock_timestamp() - older_than) x
    WHERE CASE WHEN blocking_sessions.stream_name IS NULL THEN cardinality(x.tables) > 0 OR x.holds_horizon
               ELSE x.relations && ARRAY(
                   SELECT t.relid::oid FROM pg_catalog.pg_partition_tree(format('pgbroker.%I',
                       's_' || (pgbroker._stream_row(blocking_sessions.stream_name)).stream_name)::regclass) t
                   UNION ALL SELECT t.relid::oid FROM pg_catalog.pg_partition_tree('pgbroker.stream_position') t
                   UNION ALL SELECT t.relid::oid FROM pg_catalog.pg_partition_tree('pgbroker.stream_watermark') t)
          END
    ORDER BY x.xact_start, x.pid;
$$;
