-- Policies: per-queue delivery rules, beyond pgmq.
--
-- A queue may have a policy row: how often a message may be delivered, how
-- long to back off after a failure, where poison messages go, whether an ack
-- archives or deletes, how deep the queue may grow, and how long the archive
-- is kept. The worker runtime and the CLI only call the functions of the
-- engine, so every consumer of the queue, in any language, follows the same
-- rules:
--   pgbroker.complete(queue, receipts)     ack with the policy's ack_mode
--                                          (60_acks.sql);
--   pgbroker.fail(queue, receipt, error)   nack with the policy's back-off, or
--                                          dead-letter after max_deliveries
--                                          (65_failures.sql);
--   pgbroker.read(...)                     dead-letters, instead of delivering,
--                                          a message that already had
--                                          max_deliveries (its consumers died
--                                          or let their leases run out);
--   every send                             refuses (PB006) to grow the queue
--                                          past max_depth;
--   pgbroker.trim_archive(queue)           applies the archive retention.
--   the clients' sends                     encode with the policy's codec unless
--                                          told another (pgbroker.queue_codec;
--                                          docs/codecs.md).
-- and the job-queue settings of 32_priorities.sql, 34_dedup.sql and
-- 56_limits.sql: whether the queue has its priority index, the dedup window
-- and mode, the in-flight and rate limits, and whether it is paused
-- (pgbroker.pause / pgbroker.resume below).
-- Plain pgmq.read/delete/archive are untouched: pgmq clients keep pgmq's rules.
-- The hot path reads max_deliveries, max_depth and ack_mode from the routes
-- (90_routes.sql), which a change of this table rewrites.

-- The policy in force: the queue's row, or the defaults when it has none. The
-- usual case is one statement: a probe of meta (as pgbroker._table makes)
-- joined with the policy table.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.policy(queue_name text)
RETURNS pgbroker.queue_policy LANGUAGE plpgsql STABLE AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize(NULL, queue_name);
    hit record;
    found_policy pgbroker.queue_policy;
BEGIN
    SELECT m.queue_name AS stored, p AS row INTO hit
    FROM pgmq.meta m LEFT JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
    WHERE lower(m.queue_name) = lower(policy.queue_name);
    IF NOT FOUND THEN
        PERFORM pgbroker._table(queue_name);  -- PB001/PB002, naming the problem
    END IF;
    found_policy := hit.row;
    IF found_policy.queue_name IS NULL THEN
        found_policy.queue_name := hit.stored;
        found_policy.backoff := 'exponential';
        found_policy.backoff_base_seconds := 1;
        found_policy.backoff_max_seconds := 300;
        found_policy.backoff_jitter := true;
        found_policy.ack_mode := 'archive';
        found_policy.updated_at := now();
        found_policy.codec := 'json';
        found_policy.priorities := false;
        found_policy.dedup_window_seconds := 300;  -- SQS FIFO's five minutes
        found_policy.dedup_mode := 'window';
        found_policy.paused := false;
        -- max_deliveries, dead_letter_queue, max_depth, the retention and the
        -- in-flight and rate limits stay NULL: off.
    END IF;
    RETURN found_policy;
END;
$$;

-- How a queue is read, from its policy row (NULL: no row, the defaults):
--   paused    reads return nothing (pgbroker.pause);
--   limited   an in-flight or rate limit: pgbroker._read_limited (56_limits.sql);
--   priority  the prioritized statements, in priority order (32_priorities.sql);
--   plain     pgmq's order, the statements of 50_reads.sql.
-- The routes (90_routes.sql) hold each routed queue's mode as a constant and
-- write the statement of that mode only, so a plain queue's read is what it
-- was before any of these existed.
CREATE OR REPLACE FUNCTION pgbroker._read_mode(p pgbroker.queue_policy)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p.paused THEN 'paused'
                WHEN p.max_in_flight IS NOT NULL OR p.max_in_flight_per_key IS NOT NULL
                     OR p.rate_limit_per_second IS NOT NULL THEN 'limited'
                WHEN p.priorities THEN 'priority'
                ELSE 'plain' END
$$;

-- Every queue's policy, by queue name.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.policies()
RETURNS SETOF pgbroker.queue_policy LANGUAGE sql STABLE AS $$
    SELECT p.* FROM pgmq.meta m CROSS JOIN LATERAL pgbroker.policy(m.queue_name) p ORDER BY m.queue_name;
$$;

-- Change a queue's policy; returns it. A NULL argument leaves that setting as
-- it is; 0 turns max_deliveries, max_depth, archive_retention_seconds,
-- archive_max_rows, max_in_flight, max_in_flight_per_key and
-- rate_limit_per_second off, and '' removes the dead-letter queue.
-- priorities => true builds the queue's priority index now (a first
-- prioritized send would build it anyway), false drops it; a limit per key
-- builds the concurrency-key index (56_limits.sql), turning it off drops it.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.set_policy(
    queue_name text,
    max_deliveries integer DEFAULT NULL,
    backoff text DEFAULT NULL,
    backoff_base_seconds integer DEFAULT NULL,
    backoff_max_seconds integer DEFAULT NULL,
    backoff_jitter boolean DEFAULT NULL,
    dead_letter_queue text DEFAULT NULL,
    ack_mode text DEFAULT NULL,
    max_depth bigint DEFAULT NULL,
    archive_retention_seconds bigint DEFAULT NULL,
    archive_max_rows bigint DEFAULT NULL,
    codec text DEFAULT NULL,
    priorities boolean DEFAULT NULL,
    dedup_window_seconds integer DEFAULT NULL,
    dedup_mode text DEFAULT NULL,
    max_in_flight integer DEFAULT NULL,
    max_in_flight_per_key integer DEFAULT NULL,
    rate_limit_per_second double precision DEFAULT NULL
)
RETURNS pgbroker.queue_policy LANGUAGE plpgsql AS $$
DECLARE
    p pgbroker.queue_policy;
    dlq varchar;
BEGIN
    PERFORM pgbroker._table(queue_name);
    PERFORM pgbroker._check_arg(max_deliveries IS NULL OR max_deliveries >= 0,
        format('max_deliveries must be >= 0 (0: unlimited), got %s', max_deliveries));
    PERFORM pgbroker._check_arg(backoff IS NULL OR backoff IN ('fixed', 'exponential'),
        format('backoff must be ''fixed'' or ''exponential'', got %L', backoff));
    PERFORM pgbroker._check_arg(backoff_base_seconds IS NULL OR backoff_base_seconds >= 0,
        format('backoff_base_seconds must be >= 0, got %s', backoff_base_seconds));
    PERFORM pgbroker._check_arg(backoff_max_seconds IS NULL OR backoff_max_seconds >= 0,
        format('backoff_max_seconds must be >= 0, got %s', backoff_max_seconds));
    PERFORM pgbroker._check_arg(ack_mode IS NULL OR ack_mode IN ('archive', 'delete'),
        format('ack_mode must be ''archive'' or ''delete'', got %L', ack_mode));
    PERFORM pgbroker._check_arg(max_depth IS NULL OR max_depth >= 0,
        format('max_depth must be >= 0 (0: unbounded), got %s', max_depth));
    PERFORM pgbroker._check_arg(archive_retention_seconds IS NULL OR archive_retention_seconds >= 0,
        format('archive_retention_seconds must be >= 0 (0: forever), got %s', archive_retention_seconds));
    PERFORM pgbroker._check_arg(archive_max_rows IS NULL OR archive_max_rows >= 0,
        format('archive_max_rows must be >= 0 (0: unbounded), got %s', archive_max_rows));
    PERFORM pgbroker._check_arg(codec IS NULL
            OR codec ~ '^(json|msgpack|(protobuf|avro):[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)$',
        format('codec must be json, msgpack, protobuf:<message type> or avro:<schema full name>, got %L',
               codec),
        'For example ''msgpack'' or ''avro:shop.Order'' (see docs/codecs.md).');
    PERFORM pgbroker._check_arg(dedup_window_seconds IS NULL OR dedup_window_seconds >= 1,
        format('dedup_window_seconds must be >= 1, got %s', dedup_window_seconds),
        'A send with a dedup key already sent within this many seconds is not stored again.');
    PERFORM pgbroker._check_arg(dedup_mode IS NULL OR dedup_mode IN ('window', 'queued'),
        format('dedup_mode must be ''window'' or ''queued'', got %L', dedup_mode),
        '''window'': a key is refused for dedup_window_seconds after its send; '
        '''queued'': while its message is still in the queue.');
    PERFORM pgbroker._check_arg(max_in_flight IS NULL OR max_in_flight >= 0,
        format('max_in_flight must be >= 0 (0: unlimited), got %s', max_in_flight));
    PERFORM pgbroker._check_arg(max_in_flight_per_key IS NULL OR max_in_flight_per_key >= 0,
        format('max_in_flight_per_key must be >= 0 (0: unlimited), got %s', max_in_flight_per_key));
    PERFORM pgbroker._check_arg(rate_limit_per_second IS NULL OR rate_limit_per_second >= 0,
        format('rate_limit_per_second must be >= 0 (0: unlimited), got %s', rate_limit_per_second));
    IF dead_letter_queue <> '' THEN
        PERFORM pgbroker._table(dead_letter_queue);
        dlq := pgbroker._stored_name(dead_letter_queue);
        PERFORM pgbroker._check_arg(dlq <> pgbroker._stored_name(queue_name),
            'a queue cannot be its own dead-letter queue',
            'Create a separate queue, e.g. ''' || queue_name || '_dlq''.');
    END IF;

    -- Changes of one queue's policy take turns (as its create and drop do), so
    -- that two callers changing different settings both keep theirs; the read
    -- below is a new statement, so it sees the previous caller's commit.
    PERFORM pgbroker._queue_turn(queue_name);
    p := pgbroker.policy(queue_name);
    p.max_deliveries := CASE WHEN max_deliveries = 0 THEN NULL
                             ELSE coalesce(max_deliveries, p.max_deliveries) END;
    p.backoff := coalesce(backoff, p.backoff);
    p.backoff_base_seconds := coalesce(backoff_base_seconds, p.backoff_base_seconds);
    p.backoff_max_seconds := coalesce(backoff_max_seconds, p.backoff_max_seconds);
    p.backoff_jitter := coalesce(backoff_jitter, p.backoff_jitter);
    p.dead_letter_queue := CASE WHEN dead_letter_queue = '' THEN NULL
                                ELSE coalesce(dlq, p.dead_letter_queue) END;
    p.ack_mode := coalesce(ack_mode, p.ack_mode);
    p.max_depth := CASE WHEN max_depth = 0 THEN NULL ELSE coalesce(max_depth, p.max_depth) END;
    p.archive_retention_seconds := CASE WHEN archive_retention_seconds = 0 THEN NULL
                                        ELSE coalesce(archive_retention_seconds, p.archive_retention_seconds) END;
    p.archive_max_rows := CASE WHEN archive_max_rows = 0 THEN NULL
                               ELSE coalesce(archive_max_rows, p.archive_max_rows) END;
    p.codec := coalesce(codec, p.codec);
    PERFORM pgbroker._check_arg(p.backoff_max_seconds >= p.backoff_base_seconds,
        format('backoff_max_seconds (%s) must be >= backoff_base_seconds (%s)',
               p.backoff_max_seconds, p.backoff_base_seconds),
        'Exponential back-off doubles from the base up to the max; fixed back-off uses the base.');
    p.dedup_window_seconds := coalesce(dedup_window_seconds, p.dedup_window_seconds);
    p.dedup_mode := coalesce(dedup_mode, p.dedup_mode);
    p.max_in_flight := CASE WHEN max_in_flight = 0 THEN NULL ELSE coalesce(max_in_flight, p.max_in_flight) END;
    IF max_in_flight_per_key IS NOT NULL AND (p.max_in_flight_per_key IS NULL) <> (max_in_flight_per_key = 0) THEN
        -- The limit per key turned on or off: its index goes with it.
        PERFORM pgbroker._concurrency_key_index(p.queue_name, max_in_flight_per_key <> 0);
    END IF;
    p.max_in_flight_per_key := CASE WHEN max_in_flight_per_key = 0 THEN NULL
                                    ELSE coalesce(max_in_flight_per_key, p.max_in_flight_per_key) END;
    p.rate_limit_per_second := CASE WHEN rate_limit_per_second = 0 THEN NULL
                                    ELSE coalesce(rate_limit_per_second, p.rate_limit_per_second) END;
    IF priorities IS NOT NULL AND priorities IS DISTINCT FROM p.priorities THEN
        PERFORM pgbroker._priority_index(p.queue_name, priorities);
        p.priorities := priorities;
    END IF;
    p.updated_at := now();

    INSERT INTO pgbroker.queue_policy VALUES (p.*)
    ON CONFLICT ON CONSTRAINT queue_policy_pkey DO UPDATE SET
        max_deliveries = EXCLUDED.max_deliveries,
        backoff = EXCLUDED.backoff,
        backoff_base_seconds = EXCLUDED.backoff_base_seconds,
        backoff_max_seconds = EXCLUDED.backoff_max_seconds,
        backoff_jitter = EXCLUDED.backoff_jitter,
        dead_letter_queue = EXCLUDED.dead_letter_queue,
        ack_mode = EXCLUDED.ack_mode,
        max_depth = EXCLUDED.max_depth,
        archive_retention_seconds = EXCLUDED.archive_retention_seconds,
        archive_max_rows = EXCLUDED.archive_max_rows,
        updated_at = EXCLUDED.updated_at,
        codec = EXCLUDED.codec,
        priorities = EXCLUDED.priorities,
        dedup_window_seconds = EXCLUDED.dedup_window_seconds,
        dedup_mode = EXCLUDED.dedup_mode,
        max_in_flight = EXCLUDED.max_in_flight,
        max_in_flight_per_key = EXCLUDED.max_in_flight_per_key,
        rate_limit_per_second = EXCLUDED.rate_limit_per_second;
    RETURN p;
END;
$$;

-- The codec a client's send uses when not told one: the policy's, 'json' when
-- the queue has no policy row, or no such queue (its send then fails as
-- always). Clients cache it for a few seconds.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.queue_codec(queue_name text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT pgbroker._authorize('producer', queue_name);
    SELECT coalesce((SELECT p.codec FROM pgbroker.queue_policy p
                     WHERE lower(p.queue_name) = lower(queue_codec.queue_name)), 'json');
$$;

------------------------------------------------------------------------------
-- Pause and resume
------------------------------------------------------------------------------

-- Pause a queue: every read of it (pgmq.read, read_with_poll, pop, the
-- grouped reads, pgbroker.read and consume) returns nothing until it is
-- resumed; sends still succeed, so producers never notice. The flag is in
-- the policy row, so the routes (90_routes.sql) hold it as a constant: a
-- routed read of a paused queue returns before its statement, with no probe,
-- and a queue that was never paused pays nothing. Returns whether the queue
-- was running before (false: it was paused already).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.pause(queue_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgbroker._set_paused(queue_name, true);
END;
$$;

-- Resume a paused queue; returns whether it was paused.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.resume(queue_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgbroker._set_paused(queue_name, false);
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker._set_paused(queue_name text, paused boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    p pgbroker.queue_policy;
BEGIN
    PERFORM pgbroker._table(queue_name);
    PERFORM pgbroker._queue_turn(queue_name);
    p := pgbroker.policy(queue_name);
    IF p.paused = paused THEN
        RETURN false;  -- no change: the routes stay as they are
    END IF;
    p.paused := paused;
    p.updated_at := now();
    INSERT INTO pgbroker.queue_policy VALUES (p.*)
    ON CONFLICT ON CONSTRAINT queue_policy_pkey DO UPDATE SET
        paused = EXCLUDED.paused, updated_at = EXCLUDED.updated_at;
    RETURN true;
END;
$$;

-- Whether a queue is paused, whatever the case of the name (false for no such
-- queue): the probe of the reads the routes do not hold, and the monitor's
-- (the pgbroker_queue_paused gauge; a monitor entry point, 88_roles.sql).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.is_paused(queue_name text)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT pgbroker._authorize('monitor', queue_name);
    SELECT coalesce((SELECT p.paused FROM pgmq.meta m JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
                     WHERE lower(m.queue_name) = lower($1)), false);
$$;

-- Seconds to wait before the next delivery after the read_ct-th one failed.
-- Exponential back-off doubles from the base up to the max; jitter draws the
-- delay from its upper half, so that messages that failed together (a
-- dependency down) come back spread out rather than all at once.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.retry_delay(p pgbroker.queue_policy, read_ct integer)
RETURNS integer LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN p.backoff_jitter THEN ceil(d / 2.0 + random() * d / 2.0)::integer ELSE d END
    FROM (SELECT CASE p.backoff
                     WHEN 'fixed' THEN p.backoff_base_seconds
                     ELSE least(p.backoff_max_seconds::numeric,
                                p.backoff_base_seconds * power(2::numeric, least(greatest(read_ct - 1, 0), 40)))
                 END::integer AS d) AS delay;
$$;

------------------------------------------------------------------------------
-- Backpressure
------------------------------------------------------------------------------

-- Refuse a send that would take the queue past its max_depth. The cheap
-- upper bound (ids handed out minus the oldest id present) settles almost
-- every send in two index probes; only near the limit is the queue counted,
-- and then at most max_depth + 1 rows (an index-only walk, ~10 ms per 100,000
-- rows: keep max_depth in that range, it is a safety limit). In-flight and
-- delayed messages count: they are still in the queue. Concurrent senders
-- may overshoot by what their uncommitted transactions hold: the limit
-- protects the disk, it is not a counter.
CREATE OR REPLACE FUNCTION pgbroker._check_depth(queue_name text, qtable text, incoming integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    max_depth bigint;
    upper_bound bigint;
    depth bigint;
BEGIN
    SELECT p.max_depth INTO max_depth
    FROM pgmq.meta m JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
    WHERE lower(m.queue_name) = lower(_check_depth.queue_name);
    IF max_depth IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format('SELECT (SELECT last_value FROM %s) - coalesce((SELECT min(msg_id) FROM pgmq.%I), 0) + 1',
                   pg_get_serial_sequence(format('pgmq.%I', qtable), 'msg_id'), qtable) INTO upper_bound;
    IF upper_bound + incoming <= max_depth THEN
        RETURN;
    END IF;
    EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM pgmq.%I LIMIT $1) AS q', qtable)
        INTO depth USING max_depth + 1;
    IF depth + incoming > max_depth THEN
        RAISE EXCEPTION 'queue "%" is full: % messages in it, % more would pass its max_depth of %',
            queue_name, depth, incoming, max_depth
            USING ERRCODE = 'PB006',
                  HINT = 'Consume faster, send again later (the clients'' send(..., wait=seconds) does), '
                         'or raise the limit: pgbroker policy set ' || queue_name || ' --max-depth N';
    END IF;
END;
$$;

------------------------------------------------------------------------------
-- Archive retention (for non-partitioned queues; partitioned archives follow
-- pg_partman's retention, see 76_partitions.sql). Deletes at most batch_size
-- rows per call, so that each call is a short transaction; callers repeat
-- until it returns 0 (pgbroker maintain does).
------------------------------------------------------------------------------

-- Delete up to batch_size archived messages older than the queue policy's
-- archive retention; repeat until it returns 0.
-- Returns: how many rows it deleted.
-- Errors: PB007 when batch_size < 1; PB002 when the queue does not exist.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.trim_archive(queue_name text, batch_size integer DEFAULT 10000)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    atable text := pgbroker._table(queue_name, 'a');
    p pgbroker.queue_policy := pgbroker.policy(queue_name);
    deleted bigint := 0;
    n bigint;
    cutoff timestamptz;
BEGIN
    PERFORM pgbroker._check_arg(batch_size IS NOT NULL AND batch_size >= 1,
        format('batch_size must be >= 1, got %s', coalesce(batch_size::text, 'NULL')));
    IF p.archive_retention_seconds IS NOT NULL THEN
        EXECUTE format(
            $Q$
            DELETE FROM pgmq.%1$I WHERE msg_id IN (
                SELECT msg_id FROM pgmq.%1$I WHERE archived_at < now() - make_interval(secs => $1)
                ORDER BY archived_at LIMIT $2)
            $Q$, atable) USING p.archive_retention_seconds, batch_size;
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END IF;
    IF p.archive_max_rows IS NOT NULL AND deleted < batch_size THEN
        -- The archived_at of the archive_max_rows-th newest row (a walk of
        -- that many entries of the archived_at index); older rows go. Rows
        -- archived by one statement share archived_at, so those tied with it
        -- stay: at least archive_max_rows rows are kept.
        EXECUTE format('SELECT archived_at FROM pgmq.%I ORDER BY archived_at DESC OFFSET $1 LIMIT 1', atable)
            INTO cutoff USING p.archive_max_rows - 1;
        IF cutoff IS NOT NULL THEN
            EXECUTE format(
                $Q$
                DELETE FROM pgmq.%1$I WHERE msg_id IN (
                    SELECT msg_id FROM pgmq.%1$I WHERE archived_at < $1 ORDER BY archived_at LIMIT $2)
                $Q$, atable) USING cutoff, batch_size - deleted;
            GET DIAGNOSTICS n = ROW_COUNT;
            deleted := deleted + n;
        END IF;
    END IF;
    RETURN deleted;
END;
$$;
