-- Concurrency and rate limits, enforced by the engine's reads.
--
-- A queue's policy (20_policies.sql) may limit:
--   max_in_flight          messages in flight at once, across all consumers;
--   max_in_flight_per_key  messages in flight at once per concurrency key, the
--                          header x-pgbroker-concurrency-key (a tenant, a
--                          customer); messages without the header are not
--                          limited by key;
--   rate_limit_per_second  messages handed out per second (a token bucket
--                          holding at most one second's worth, at least 1).
-- Every read of such a queue, pgmq's and pgbroker's, through the routes or
-- not, comes here (read mode 'limited', pgbroker._read_mode), so the limits
-- hold whatever client reads. A pop hands out no lease: only the rate
-- limit applies to it. The grouped reads (70_fifo_groups.sql) follow
-- max_in_flight and the rate limit, not the per-key limit; Spark's claims
-- read through pgbroker.read and follow all three.
--
-- In flight means leased: read (read_ct > 0) with a visibility time still
-- ahead. Counted from the queue table itself (the timed index from the
-- reader's clock on), so every way a message leaves flight counts at once:
-- ack, delete, archive, a lease running out. A nacked message waiting for
-- its back-off has the same shape as a leased one, and counts until it is
-- due again: the limits err on the safe side. The count touches the in-flight
-- and delayed rows, never the waiting backlog.
--
-- Why the readers of a limited queue take turns (a lock on the queue's policy
-- row held to the end of the reader's transaction): a count is only right if no other reader
-- is between counting and committing its leases. A consumer that reads and
-- works in one long transaction therefore holds up the queue's other readers;
-- read in a transaction of its own (the worker runtime and pgmq clients do).
--
-- Per key, a read must find waiting messages of keys that still have room
-- without walking the backlog of keys that have none: the queue gets an
-- index on (key, priority DESC, msg_id) over its ready messages when the
-- limit is set, and a read visits each key once (a loose index scan), then
-- takes up to that key's room from it. Its cost grows with the number of
-- keys waiting, not with the messages waiting.

-- A message's concurrency key; '' for none (no limit by key). Never change
-- this body in place: indexes built on it would silently disagree.
CREATE OR REPLACE FUNCTION pgbroker._concurrency_key(headers jsonb)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(CASE WHEN jsonb_typeof(headers) = 'object' THEN headers->>'x-pgbroker-concurrency-key' END, '')
$$;

-- Build (on) or drop (off) a queue's concurrency-key index.
CREATE OR REPLACE FUNCTION pgbroker._concurrency_key_index(stored_name text, make boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    qtable text := lower('q_' || stored_name);
BEGIN
    IF make THEN
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON pgmq.%I'
                       ' (pgbroker._concurrency_key(headers), pgbroker._priority(headers) DESC, msg_id)'
                       ' WHERE read_ct = 0 AND vt <= enqueued_at',
                       qtable || '_ckey_idx', qtable);
    ELSE
        EXECUTE format('DROP INDEX IF EXISTS pgmq.%I', qtable || '_ckey_idx');
    END IF;
END;
$$;

-- The per-key read of a limited queue: $1 qty, $2 conditional, $3 the
-- reader's clock, $4 the visibility timeout, $5 the per-key limit, $6 the
-- in-flight count of each key (jsonb), $7 the queue's stored name. Waiting
-- messages by key (a loose index scan over the concurrency-key index), due
-- timed ones from timed_from, each key capped at its room, then (priority
-- DESC, msg_id), locked and leased.
CREATE OR REPLACE FUNCTION pgbroker._read_by_key_sql(qtable text, conditional jsonb)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format(
        $Q$
        WITH RECURSIVE keys(k) AS (
            (SELECT pgbroker._concurrency_key(headers) FROM pgmq.%1$I
             WHERE read_ct = 0 AND vt <= enqueued_at
             ORDER BY 1 LIMIT 1)
            UNION ALL
            SELECT (SELECT pgbroker._concurrency_key(headers) FROM pgmq.%1$I
                    WHERE read_ct = 0 AND vt <= enqueued_at AND pgbroker._concurrency_key(headers) > keys.k
                    ORDER BY 1 LIMIT 1)
            FROM keys WHERE keys.k IS NOT NULL
        ),
        room AS (
            SELECT k, CASE WHEN k = '' THEN $1 ELSE least($1, $5 - coalesce(($6->>k)::integer, 0)) END AS n
            FROM keys WHERE k IS NOT NULL
        ),
        ready AS (
            SELECT c.* FROM room CROSS JOIN LATERAL (
                SELECT msg_id, pgbroker._priority(headers) AS priority, room.k FROM pgmq.%1$I
                WHERE read_ct = 0 AND vt <= enqueued_at AND pgbroker._concurrency_key(headers) = room.k %2$s
                ORDER BY pgbroker._priority(headers) DESC, msg_id
                LIMIT room.n) c
            WHERE room.n > 0
        ),
        timed AS (
            SELECT msg_id, pgbroker._priority(headers) AS priority, pgbroker._concurrency_key(headers) AS k
            FROM pgmq.%1$I
            WHERE NOT (read_ct = 0 AND vt <= enqueued_at) AND vt <= $3 %2$s
              AND vt >= coalesce((pgbroker._queue_bounds($7)).timed_from,
                                 '-infinity')
            ORDER BY vt
            LIMIT 1000
        ),
        ranked AS (
            SELECT c.*, row_number() OVER (PARTITION BY c.k ORDER BY c.priority DESC, c.msg_id) AS nth
            FROM (SELECT * FROM ready UNION ALL SELECT * FROM timed) c
        ),
        picked AS (
            SELECT r.msg_id FROM ranked r
            WHERE r.k = '' OR r.nth <= $5 - coalesce(($6->>r.k)::integer, 0)
            ORDER BY r.priority DESC, r.msg_id
            LIMIT $1
        ),
        locked AS (
            -- Re-checked on the latest row version: a row leased meanwhile is no longer due.
            SELECT q.msg_id FROM pgmq.%1$I q
            WHERE q.msg_id IN (SELECT msg_id FROM picked) AND q.vt <= $3
            FOR UPDATE SKIP LOCKED
        ),
        leased AS (
            UPDATE pgmq.%1$I q
            SET vt = clock_timestamp() + make_interval(secs => $4),
                read_ct = q.read_ct + 1,
                last_read_at = clock_timestamp()
            FROM locked WHERE q.msg_id = locked.msg_id
            RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message, q.headers
        )
        SELECT * FROM leased ORDER BY pgbroker._priority(headers) DESC, msg_id
        $Q$,
        qtable,
        CASE WHEN conditional IS NULL OR conditional = '{}'::jsonb THEN '' ELSE 'AND message @> $2' END)
$$;

-- How many messages a read (or pop) of a limited queue may take now, at most
-- qty: the rate bucket's tokens, then the in-flight room (a pop leases
-- nothing: only the rate applies). Takes the queue's limiter lock (see the
-- header), held until the reader's transaction ends; charge what the read got
-- with pgbroker._limit_charge. budget <= 0: nothing may go now. clock is the
-- reader's clock, available the bucket's tokens before the read, per_key the
-- in-flight count of each concurrency key (jsonb).
CREATE OR REPLACE FUNCTION pgbroker._limit_budget(stored_name text, qty integer, pop boolean,
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
    -- The queue's policy row, which only the schema's owner can lock: any
    -- session may take an advisory lock, and an outsider holding the one
    -- this was stopped every read of the queue.
    PERFORM FROM pgbroker.queue_policy qp WHERE qp.queue_name = stored_name FOR NO KEY UPDATE;
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
CREATE OR REPLACE FUNCTION pgbroker._limit_charge(stored_name text, available double precision, clock timestamptz,
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
        RETURN QUERY EXECUTE pgbroker._statement_call(qtable, op, quote_nullable(b.budget),
            quote_nullable(conditional), pgbroker._instant_literal(b.clock), quote_nullable(vt),
            quote_nullable(ready_from),
            pgbroker._instant_literal((pgbroker._queue_bounds(stored_name)).timed_from));
    END IF;
    GET DIAGNOSTICS got = ROW_COUNT;
    PERFORM pgbroker._limit_charge(stored_name, b.available, b.clock, got);
END;
$$;
