-- pgbroker migration 0018: Spark's streams follow a queue's pause and limits.
-- Claim mode reads through pgbroker.read, which already honours both; the
-- source learns why a claim came back empty (pgbroker.spark_held_back), to
-- say so and, under Trigger.AvailableNow, to wait for room rather than end
-- early. Log mode on the queue table takes no batch while the queue is paused
-- and refuses a limited queue (pgbroker.spark_log_gate). 82_spark.sql says why.

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
