-- pgbroker migration 0019: Spark's streams and FIFO grouped reads follow a
-- queue's pause and limits.
--
-- Spark: claim mode reads through pgbroker.read, which already honours both;
-- the source learns why a claim came back empty (pgbroker.spark_held_back), to
-- say so and, under Trigger.AvailableNow, to wait for room rather than end
-- early. Log mode on the queue table takes no batch while the queue is paused
-- and refuses a limited queue (pgbroker.spark_log_gate). 82_spark.sql says why.
--
-- Grouped reads (pgmq.read_grouped*) now follow max_in_flight and the rate
-- limit (they took neither): the budget of a limited read moves out of
-- pgbroker._read_limited into pgbroker._limit_budget and _limit_charge, which
-- both use (56_limits.sql, 70_fifo_groups.sql).

-- Why a read of the queue may get nothing now although messages wait
-- (visible, and at or below up_to when given): 'paused', 'limited' (its
-- limits leave no room at the moment), or NULL (nothing holds them back, or
-- nothing visible waits).
CREATE FUNCTION pgbroker.spark_held_back(queue_name text, up_to bigint DEFAULT NULL)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);  -- PB001/PB002 for a bad or missing queue
    mode text := (SELECT q.read_mode FROM pgbroker._queue(queue_name) q);
    waiting boolean;
BEGIN
    IF mode NOT IN ('paused', 'limited') THEN
        RETURN NULL;
    END IF;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM pgmq.%I WHERE vt <= clock_timestamp() AND msg_id <= $1)',
                   qtable)
        INTO waiting USING coalesce(up_to, 9223372036854775807);
    RETURN CASE WHEN waiting THEN mode END;
END;
$$;

-- Whether a log-mode stream may take a new batch now: false while the queue
-- is paused; PB007 when the queue has limits (see above). consumes: whether
-- the stream releases (archives or deletes) what it reads; one that does not
-- (it reads the archive, or release=none) only looks, like a peek, and is
-- always allowed.
CREATE FUNCTION pgbroker.spark_log_gate(queue_name text, consumes boolean DEFAULT true)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);  -- PB001/PB002 for a bad or missing queue
    p pgbroker.queue_policy;
BEGIN
    PERFORM pgbroker._check_arg(consumes IS NOT NULL, 'consumes must be true or false, got NULL');
    IF NOT consumes THEN
        RETURN true;
    END IF;
    p := pgbroker.policy(queue_name);
    IF p.paused THEN
        RETURN false;
    END IF;
    IF pgbroker._read_mode(p) = 'limited' THEN
        RAISE EXCEPTION 'queue "%" has concurrency or rate limits (max_in_flight %, max_in_flight_per_key %, rate_limit_per_second %): log mode reads without leases and cannot honour them',
            queue_name, coalesce(p.max_in_flight::text, 'none'), coalesce(p.max_in_flight_per_key::text, 'none'),
            coalesce(p.rate_limit_per_second::text, 'none')
            USING ERRCODE = 'PB007',
                  HINT = format('Read it in claim mode (options mode=claim, consumer=NAME), which follows the limits; or turn them off: SELECT pgbroker.set_policy(%L, max_in_flight => 0, max_in_flight_per_key => 0, rate_limit_per_second => 0).', queue_name);
    END IF;
    RETURN true;
END;
$$;

-- How many messages a read (or pop) of a limited queue may take now, at most
-- qty: the rate bucket's tokens, then the in-flight room (a pop leases
-- nothing: only the rate applies). Takes the queue's limiter lock (see the
-- header), held until the reader's transaction ends; charge what the read got
-- with pgbroker._limit_charge. budget <= 0: nothing may go now. clock is the
-- reader's clock, available the bucket's tokens before the read, per_key the
-- in-flight count of each concurrency key (jsonb).
CREATE FUNCTION pgbroker._limit_budget(stored_name text, qty integer, pop boolean,
    OUT budget integer, OUT clock timestamptz, OUT available double precision, OUT per_key jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    qtable constant text := lower('q_' || stored_name);
    p pgbroker.queue_policy := pgbroker.policy(stored_name);
    bucket pgbroker.rate_buckets;
    in_flight bigint := 0;
BEGIN
    budget := qty;
    per_key := '{}';
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.limits:' || qtable));
    clock := clock_timestamp();
    IF p.rate_limit_per_second IS NOT NULL THEN
        INSERT INTO pgbroker.rate_buckets AS b (queue_name, tokens, refilled_at)
        VALUES (stored_name, greatest(p.rate_limit_per_second, 1), clock)
        ON CONFLICT (queue_name) DO NOTHING;
        SELECT * INTO bucket FROM pgbroker.rate_buckets b WHERE b.queue_name = stored_name;
        available := least(greatest(p.rate_limit_per_second, 1),
                        bucket.tokens + extract(epoch FROM clock - bucket.refilled_at) * p.rate_limit_per_second);
        budget := least(budget, floor(available)::integer);
    END IF;
    IF NOT pop AND (p.max_in_flight IS NOT NULL OR p.max_in_flight_per_key IS NOT NULL) THEN
        EXECUTE format(
            $Q$
            SELECT coalesce(sum(n), 0), coalesce(jsonb_object_agg(k, n) FILTER (WHERE k <> ''), '{}')
            FROM (SELECT pgbroker._concurrency_key(headers) AS k, count(*) AS n FROM pgmq.%I
                  WHERE NOT (read_ct = 0 AND vt <= enqueued_at) AND vt > $1 AND read_ct > 0
                  GROUP BY 1) c
            $Q$, qtable) INTO in_flight, per_key USING clock;
        IF p.max_in_flight IS NOT NULL THEN
            budget := least(budget, p.max_in_flight - in_flight);
        END IF;
    END IF;
END;
$$;

-- Take what a read got from the rate bucket (available and clock as
-- pgbroker._limit_budget gave them; available NULL: no rate limit).
CREATE FUNCTION pgbroker._limit_charge(stored_name text, available double precision, clock timestamptz,
                                       got bigint)
RETURNS void LANGUAGE sql AS $$
    UPDATE pgbroker.rate_buckets b SET tokens = available - got, refilled_at = clock
    WHERE b.queue_name = stored_name AND available IS NOT NULL;
$$;

-- Read (or pop) a queue under its limits; the caller has checked the queue
-- and the arguments. Works out how many messages may go now
-- (pgbroker._limit_budget), and reads that many: with a per-key limit through
-- _read_by_key_sql, else with the queue's own statement (50_reads.sql).
CREATE OR REPLACE FUNCTION pgbroker._read_limited(stored_name text, ready_from bigint, vt integer, qty integer,
                                       conditional jsonb, pop boolean)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable constant text := lower('q_' || stored_name);
    p pgbroker.queue_policy := pgbroker.policy(stored_name);
    b record;
    op text;
    got bigint;
BEGIN
    SELECT * INTO b FROM pgbroker._limit_budget(stored_name, qty, pop);
    IF b.budget <= 0 THEN
        RETURN;
    END IF;

    IF NOT pop AND p.max_in_flight_per_key IS NOT NULL THEN
        RETURN QUERY EXECUTE pgbroker._read_by_key_sql(qtable, conditional)
            USING b.budget, conditional, b.clock, vt, p.max_in_flight_per_key, b.per_key, stored_name;
    ELSE
        op := CASE WHEN pop THEN 'pop' ELSE 'read' END
              || CASE WHEN p.priorities THEN '_p' ELSE '' END
              || CASE WHEN NOT pop AND NOT (conditional IS NULL OR conditional = '{}'::jsonb)
                      THEN CASE WHEN p.priorities THEN 'c' ELSE '_c' END ELSE '' END;
        RETURN QUERY EXECUTE format('EXECUTE %I(%s, %L, %L, %s, %s)', pgbroker._prepared(qtable, op),
                                    b.budget, conditional, b.clock, coalesce(vt::text, 'NULL'), ready_from);
    END IF;
    GET DIAGNOSTICS got = ROW_COUNT;
    PERFORM pgbroker._limit_charge(stored_name, b.available, b.clock, got);
END;
$$;

-- The three grouped reads differ only in how many groups they own at once,
-- how much of each run they take, and how they order the batch:
--   fill: SQS FIFO. The oldest eligible group's run first, then the next
--         group's, until the batch is full. Groups are owned one at a time,
--         so a reader never locks a group it will not use.
--   rr:   round-robin. Up to qty groups; the 1st message of each (in order
--         of their heads), then the 2nd of each, ...
--   head: up to qty groups, one message (the head) from each.
--
-- A queue's pause and limits (20_policies.sql, 56_limits.sql): a paused
-- queue gives nothing; max_in_flight and the rate limit cap how many messages
-- a read takes (fewer, never others: the groups' order is pgmq's).
-- Priorities are not followed: they would reorder a group, or the groups
-- against pgmq's rule. max_in_flight_per_key is not followed yet (a group
-- whose head's key is full could be skipped like one whose head is in
-- flight); a group is one consumer at a time already: make the key the group.
CREATE OR REPLACE FUNCTION pgbroker._read_grouped(queue_name text, vt integer, qty integer, mode text)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
    q record;
    limited boolean := false;
    limits record;
    candidates bigint[];
    owned bigint[];
    remaining integer := qty;
    got bigint;
BEGIN
    -- pgmq's terms for every argument (0018): a negative or NULL qty reads
    -- nothing in round robin (which compares a row number with it) and a
    -- NULL one nothing in fill; a negative one fails as pgmq's LIMIT does
    -- (2201W); head takes every group for a NULL qty. The vt is any: NULL
    -- fails on the first row touched (23502), a negative one leases into the
    -- past, so the timed bound goes below it first, as set_vt does.
    IF mode = 'rr' AND coalesce(qty < 0, true) THEN
        RETURN;
    END IF;
    IF qty < 0 THEN
        PERFORM pgbroker._pgmq_check_read_args(vt, qty);
    END IF;
    SELECT * INTO q FROM pgbroker._queue(queue_name);
    IF qty = 0 OR (qty IS NULL AND mode = 'fill') OR q.read_mode = 'paused' THEN
        RETURN;
    END IF;
    IF q.read_mode = 'limited' THEN
        limited := true;
        SELECT * INTO limits FROM pgbroker._limit_budget(q.stored_name, qty, false);
        IF limits.budget <= 0 THEN
            RETURN;
        END IF;
        qty := least(qty, limits.budget);
        remaining := qty;
    END IF;
    IF vt < 0 THEN
        PERFORM pgbroker._lower_timed_from(pgbroker._stored_name(queue_name),
                                           clock_timestamp() + make_interval(secs => vt));
    END IF;
    EXECUTE pgbroker._fifo_heads_sql(qtable) INTO candidates USING clock_timestamp();

    IF mode = 'fill' THEN
        WHILE remaining > 0 AND cardinality(candidates) > 0 LOOP
            EXECUTE pgbroker._fifo_own_sql(qtable) INTO owned USING candidates, clock_timestamp(), 1;
            EXIT WHEN cardinality(owned) = 0;
            RETURN QUERY EXECUTE pgbroker._fifo_take_sql(qtable, 'prio, rn')
                USING owned, remaining, remaining, vt, clock_timestamp();
            GET DIAGNOSTICS got = ROW_COUNT;
            remaining := remaining - got;
            -- Heads before the owned one were locked or gone: not ours this time.
            candidates := ARRAY(SELECT c FROM unnest(candidates) c WHERE c > owned[1] ORDER BY c);
        END LOOP;
    ELSIF mode IN ('rr', 'head') THEN
        EXECUTE pgbroker._fifo_own_sql(qtable) INTO owned USING candidates, clock_timestamp(), qty;
        IF cardinality(owned) > 0 THEN
            -- Every owned group gives at least its head, so no run can need
            -- more than what the other groups leave of the batch.
            RETURN QUERY EXECUTE pgbroker._fifo_take_sql(qtable, CASE mode WHEN 'rr' THEN 'rn, prio' ELSE 'prio' END)
                USING owned,
                      CASE mode WHEN 'rr' THEN qty - cardinality(owned) + 1 ELSE 1 END,
                      qty, vt, clock_timestamp();
            GET DIAGNOSTICS got = ROW_COUNT;
            remaining := qty - got;
        END IF;
    ELSE
        RAISE EXCEPTION 'unknown grouped read mode %', quote_literal(mode) USING ERRCODE = 'PB007';
    END IF;
    IF limited THEN
        PERFORM pgbroker._limit_charge(q.stored_name, limits.available, limits.clock, qty - remaining);
    END IF;
END;
$$;
