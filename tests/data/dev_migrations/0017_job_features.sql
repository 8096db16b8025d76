-- pgbroker migration 0017: what every job queue has and pgmq lacked:
-- priorities, deduplication, concurrency and rate limits, pause and resume.
--
-- All four ride on pgmq's convention for FIFO groups, a message header, so
-- that any pgmq client gets them unchanged: x-pgbroker-priority (an integer,
-- higher first), x-pgbroker-dedup-key (a send whose key is taken returns the
-- first message's msg_id and stores nothing) and x-pgbroker-concurrency-key
-- (at most max_in_flight_per_key in flight per key). The queue policy gains
-- the settings: priorities (whether the queue has its priority index),
-- dedup_window_seconds and dedup_mode, max_in_flight, max_in_flight_per_key,
-- rate_limit_per_second, and paused (pgbroker.pause / pgbroker.resume).
--
-- A queue that uses none of them reads and sends exactly as before: its
-- read mode is 'plain' and the routes hold the same statements for it. Each
-- feature's design and reasons are in the comments of 32_priorities.sql,
-- 34_dedup.sql, 56_limits.sql and 20_policies.sql (pause), repeated below.


ALTER TABLE pgbroker.queue_policy
    ADD COLUMN priorities boolean,
    ADD COLUMN dedup_window_seconds integer CHECK (dedup_window_seconds >= 1),
    ADD COLUMN dedup_mode text CHECK (dedup_mode IN ('window', 'queued')),
    ADD COLUMN max_in_flight integer CHECK (max_in_flight >= 1),
    ADD COLUMN max_in_flight_per_key integer CHECK (max_in_flight_per_key >= 1),
    ADD COLUMN rate_limit_per_second double precision CHECK (rate_limit_per_second > 0),
    ADD COLUMN paused boolean;
UPDATE pgbroker.queue_policy SET priorities = false, dedup_window_seconds = 300, dedup_mode = 'window', paused = false;
ALTER TABLE pgbroker.queue_policy
    ALTER COLUMN priorities SET NOT NULL,
    ALTER COLUMN dedup_window_seconds SET NOT NULL,
    ALTER COLUMN dedup_mode SET NOT NULL,
    ALTER COLUMN paused SET NOT NULL;

DROP FUNCTION pgbroker.set_policy(text, integer, text, integer, integer, boolean, text, text, bigint, bigint, bigint, text);
DROP FUNCTION pgbroker._visible_sql(text, jsonb);
DROP FUNCTION pgbroker._visible_from_sql(text, jsonb);
DROP FUNCTION pgbroker._queue(text);
DROP FUNCTION pgbroker._run_read(text, bigint, integer, integer, jsonb, boolean);
DROP FUNCTION pgbroker._deliver(text, bigint, integer, integer, integer, jsonb);


-- The policy in force: the queue's row, or the defaults when it has none. The
-- usual case is one statement: a probe of meta (as pgbroker._table makes)
-- joined with the policy table.
CREATE OR REPLACE FUNCTION pgbroker.policy(queue_name text)
RETURNS pgbroker.queue_policy LANGUAGE plpgsql STABLE AS $$
DECLARE
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
CREATE FUNCTION pgbroker._read_mode(p pgbroker.queue_policy)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p.paused THEN 'paused'
                WHEN p.max_in_flight IS NOT NULL OR p.max_in_flight_per_key IS NOT NULL
                     OR p.rate_limit_per_second IS NOT NULL THEN 'limited'
                WHEN p.priorities THEN 'priority'
                ELSE 'plain' END
$$;

-- Change a queue's policy; returns it. A NULL argument leaves that setting as
-- it is; 0 turns max_deliveries, max_depth, archive_retention_seconds,
-- archive_max_rows, max_in_flight, max_in_flight_per_key and
-- rate_limit_per_second off, and '' removes the dead-letter queue.
-- priorities => true builds the queue's priority index now (a first
-- prioritized send would build it anyway), false drops it; a limit per key
-- builds the concurrency-key index (56_limits.sql), turning it off drops it.
CREATE FUNCTION pgbroker.set_policy(
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
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.queue:' || lower(queue_name)));
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

-- Pause a queue: every read of it (pgmq.read, read_with_poll, pop, the
-- grouped reads, pgbroker.read and consume) returns nothing until it is
-- resumed; sends still succeed, so producers never notice. The flag is in
-- the policy row, so the routes (90_routes.sql) hold it as a constant: a
-- routed read of a paused queue returns before its statement, with no probe,
-- and a queue that was never paused pays nothing. Returns whether the queue
-- was running before (false: it was paused already).
CREATE FUNCTION pgbroker.pause(queue_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgbroker._set_paused(queue_name, true);
END;
$$;

-- Resume a paused queue; returns whether it was paused.
CREATE FUNCTION pgbroker.resume(queue_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgbroker._set_paused(queue_name, false);
END;
$$;

CREATE FUNCTION pgbroker._set_paused(queue_name text, paused boolean)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    p pgbroker.queue_policy;
BEGIN
    PERFORM pgbroker._table(queue_name);
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.queue:' || lower(queue_name)));
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
CREATE FUNCTION pgbroker.is_paused(queue_name text)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT p.paused FROM pgmq.meta m JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
                     WHERE lower(m.queue_name) = lower($1)), false);
$$;


-- Priorities, and the sends that carry pgbroker's job headers.
--
-- A message sent with the header x-pgbroker-priority (an integer, higher
-- first; absent = 0) is read before every waiting message of lower priority;
-- within a priority, in pgmq's order (msg_id). The header is pgmq's own
-- convention (its FIFO groups ride on x-pgmq-group), so any pgmq client, in
-- any language, sends a priority with pgmq.send(queue, msg, headers).
--
-- Why a queue has a priority index only once it uses priorities. A read in
-- priority order needs an index on (priority DESC, msg_id) over the ready
-- messages; kept on every queue it would cost every send of every queue an
-- index entry, and pick a different plan for reads that have no use for it.
-- So a queue starts without it: its reads keep the plain ready-index plan
-- (50_reads.sql) and their speed. The first send carrying a priority to a
-- queue (or pgbroker.set_policy(q, priorities => true), better before a
-- large backlog) builds the index and records priorities = true in the
-- queue's policy; the policy change rewrites the routes, whose statements
-- for that queue become the prioritized ones (_statement's '_p' variants).
-- Building it takes a SHARE lock on the queue table within the sender's
-- transaction, once per queue: sends and reads of that queue wait for it
-- (a moment on a small queue). Two transactions that have both written to
-- the queue and both send its first priority can deadlock; the server
-- aborts one, which retries.
--
-- Reads of a prioritized queue stay flat with the backlog: the ready scan
-- walks the priority index from its top, the timed scan is as before, and
-- the union of both is ordered by (priority DESC, msg_id). Within the window
-- of 1000 due redeliveries (see _visible_sql) the order is exact. Not
-- avoided: consumed messages leave dead entries at the head of their
-- priority in the priority index until VACUUM removes them, and the ready_from
-- bound that lets plain reads start past theirs (50_reads.sql) has no
-- per-priority form. Measured: 60,000 consumed with autovacuum off, a read
-- of 10 touched ~475 buffers instead of ~130; autovacuum keeps it bounded.

-- A message's priority, written once: the priority index is built on this
-- expression and the prioritized reads order by it (the SQL function is
-- inlined, so they match the index). It never fails, so no header can make a
-- row unindexable: anything but an integer of up to nine digits counts as 0.
-- Sends refuse such a header first (_check_job_headers), so that only
-- rows written by hand ever meet that rule. Never change this body in place:
-- indexes built on it would silently disagree.
CREATE FUNCTION pgbroker._priority(headers jsonb)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN headers->>'x-pgbroker-priority' ~ '^-?[0-9]{1,9}$'
                THEN (headers->>'x-pgbroker-priority')::integer ELSE 0 END
$$;

-- The name of a queue table's priority index.
CREATE FUNCTION pgbroker._priority_index_name(qtable text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT qtable || '_priority_idx'
$$;

-- Build (on) or drop (off) a queue's priority index; the caller records the
-- setting in the queue's policy.
CREATE FUNCTION pgbroker._priority_index(stored_name text, make boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    qtable text := lower('q_' || stored_name);
BEGIN
    IF make THEN
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON pgmq.%I (pgbroker._priority(headers) DESC, msg_id)'
                       ' WHERE read_ct = 0 AND vt <= enqueued_at',
                       pgbroker._priority_index_name(qtable), qtable);
    ELSE
        EXECUTE format('DROP INDEX IF EXISTS pgmq.%I', pgbroker._priority_index_name(qtable));
    END IF;
END;
$$;

-- Whether any headers of a send carry a job header (priority, dedup key,
-- concurrency key). The send route calls this only for sends with headers.
CREATE FUNCTION pgbroker._has_job_headers(headers jsonb[])
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT EXISTS (SELECT 1 FROM unnest($1) h
                   WHERE jsonb_typeof(h) = 'object'
                     AND h ?| ARRAY['x-pgbroker-priority', 'x-pgbroker-dedup-key', 'x-pgbroker-concurrency-key'])
$$;

-- Refuse job headers that do not say what they must (PB007): a priority is an
-- integer of up to nine digits (a JSON number or a string of one), a dedup
-- key and a concurrency key are non-empty strings of up to 512 characters.
-- A JSON null is as good as no header.
CREATE FUNCTION pgbroker._check_job_headers(headers jsonb[])
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    h jsonb;
    k text;
BEGIN
    FOREACH h IN ARRAY headers LOOP
        CONTINUE WHEN h IS NULL OR jsonb_typeof(h) <> 'object';
        IF jsonb_typeof(h->'x-pgbroker-priority') <> 'null' THEN
            PERFORM pgbroker._check_arg(
                jsonb_typeof(h->'x-pgbroker-priority') IN ('number', 'string')
                AND h->>'x-pgbroker-priority' ~ '^-?[0-9]{1,9}$',
                format('header x-pgbroker-priority must be an integer between -999999999 and 999999999, got %s',
                       h->'x-pgbroker-priority'),
                'Higher is delivered first; leave the header out for the default priority 0.');
        END IF;
        FOREACH k IN ARRAY ARRAY['x-pgbroker-dedup-key', 'x-pgbroker-concurrency-key'] LOOP
            IF jsonb_typeof(h->k) <> 'null' THEN
                PERFORM pgbroker._check_arg(
                    jsonb_typeof(h->k) = 'string' AND length(h->>k) BETWEEN 1 AND 512,
                    format('header %s must be a string of 1 to 512 characters, got %s', k, left((h->k)::text, 80)),
                    'Use an id that names the job (dedup) or the tenant (concurrency), e.g. ''order-42''.');
            END IF;
        END LOOP;
    END LOOP;
END;
$$;

-- Ready a send whose headers carry job headers (the send route has checked
-- the batch, the size and the depth): the headers are checked, and a queue
-- without its priority index gets it. Returns whether the batch carries a
-- dedup key: then pgbroker._send_deduplicated (34_dedup.sql) sends it;
-- otherwise the route's own INSERT does, as for any send.
CREATE FUNCTION pgbroker._prepare_job_headers(stored_name text, headers jsonb[])
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._check_job_headers(headers);
    IF EXISTS (SELECT 1 FROM unnest(headers) h WHERE jsonb_typeof(h->'x-pgbroker-priority') <> 'null')
       AND NOT (SELECT p.priorities FROM pgbroker.policy(stored_name) p) THEN
        PERFORM pgbroker.set_policy(stored_name, priorities => true);
    END IF;
    RETURN EXISTS (SELECT 1 FROM unnest(headers) h WHERE jsonb_typeof(h->'x-pgbroker-dedup-key') <> 'null');
END;
$$;


-- Deduplication: a send whose x-pgbroker-dedup-key was seen is not stored again.
--
-- A message sent with header x-pgbroker-dedup-key while its key is taken in
-- that queue is not stored, and the send returns the msg_id of the message
-- that took the key. How long a key stays taken is the queue's dedup_mode
-- (20_policies.sql):
--   window  (default) for dedup_window_seconds after the send that took it
--           (default 300 s, SQS FIFO's five minutes), whatever became of
--           its message;
--   queued  while its message is still in the queue, waiting, delayed or in
--           flight (River's and pg-boss's unique jobs): once acked, archived,
--           popped or dead-lettered, the key is free again.
--
-- Keys live in pgbroker.dedup_keys, one row per (queue, key). Why this is
-- safe with concurrent senders: a sender claims a key by inserting its row;
-- a second sender of the same key blocks on the first one's uncommitted
-- index entry (INSERT ... ON CONFLICT waits for it), and then either sees
-- the committed row and returns its msg_id, or, if the first rolled back,
-- inserts the row itself. A key whose time is over is taken again by
-- updating its row under a row lock, with the same effect. In REPEATABLE
-- READ or SERIALIZABLE a sender that loses such a race gets a serialization
-- failure instead, to be retried as usual. Rows of keys never sent again
-- stay until pgbroker.trim_dedup_keys (pgbroker maintain) removes the
-- expired ones; dropping the queue drops its keys.

CREATE TABLE pgbroker.dedup_keys (
    queue_name varchar NOT NULL
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    dedup_key text NOT NULL,
    msg_id bigint,                   -- NULL only inside the transaction that claims it
    sent_at timestamptz NOT NULL,
    PRIMARY KEY (queue_name, dedup_key)
);

-- Claim a key for a send: NULL when this send may store its message (the
-- key was free or its time over; the caller records the msg_id), or the
-- msg_id of the message that holds the key.
CREATE FUNCTION pgbroker._dedup_claim(stored_name text, dedup_key text, window_seconds integer, mode text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    held pgbroker.dedup_keys;
    still_queued boolean;
BEGIN
    LOOP
        INSERT INTO pgbroker.dedup_keys (queue_name, dedup_key, sent_at)
        VALUES (stored_name, dedup_key, clock_timestamp())
        ON CONFLICT DO NOTHING;
        IF FOUND THEN
            RETURN NULL;
        END IF;
        -- A new statement: it sees the row of a sender that committed while
        -- the insert waited.
        SELECT * INTO held FROM pgbroker.dedup_keys k
        WHERE k.queue_name = stored_name AND k.dedup_key = _dedup_claim.dedup_key
        FOR UPDATE;
        CONTINUE WHEN NOT FOUND;  -- trimmed meanwhile: claim it afresh
        IF mode = 'queued' THEN
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM pgmq.%I WHERE msg_id = $1)', lower('q_' || stored_name))
                INTO still_queued USING held.msg_id;
        ELSE
            still_queued := held.sent_at > clock_timestamp() - make_interval(secs => window_seconds);
        END IF;
        IF still_queued THEN
            RETURN held.msg_id;
        END IF;
        UPDATE pgbroker.dedup_keys k SET msg_id = NULL, sent_at = clock_timestamp()
        WHERE k.queue_name = stored_name AND k.dedup_key = _dedup_claim.dedup_key;
        RETURN NULL;
    END LOOP;
END;
$$;

-- Send a batch some of whose messages carry a dedup key, one message at a
-- time in the batch's order (a key repeated within the batch returns the
-- first one's msg_id). Returns the msg_ids, the held ones for duplicates.
CREATE FUNCTION pgbroker._send_deduplicated(stored_name text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    insert_one constant text := pgbroker._send_insert_sql(lower('q_' || stored_name), true);
    p pgbroker.queue_policy := pgbroker.policy(stored_name);
    key text;
    id bigint;
BEGIN
    FOR i IN 1..cardinality(msgs) LOOP
        key := CASE WHEN jsonb_typeof(headers[i]) = 'object' THEN headers[i]->>'x-pgbroker-dedup-key' END;
        id := NULL;
        IF key IS NOT NULL THEN
            id := pgbroker._dedup_claim(stored_name, key, p.dedup_window_seconds, p.dedup_mode);
        END IF;
        IF id IS NULL THEN
            EXECUTE insert_one INTO id USING ARRAY[msgs[i]], ARRAY[headers[i]], delay;
            IF key IS NOT NULL THEN
                UPDATE pgbroker.dedup_keys k SET msg_id = id
                WHERE k.queue_name = stored_name AND k.dedup_key = key;
            END IF;
        END IF;
        RETURN NEXT id;
    END LOOP;
END;
$$;

-- Remove a queue's keys whose time is over (all queues' when queue_name is
-- NULL), at most batch_size rows a call; returns how many went.
CREATE FUNCTION pgbroker.trim_dedup_keys(queue_name text DEFAULT NULL, batch_size integer DEFAULT 10000)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    q record;
    n bigint;
    removed bigint := 0;
BEGIN
    PERFORM pgbroker._check_arg(batch_size IS NOT NULL AND batch_size >= 1,
        format('batch_size must be >= 1, got %s', coalesce(batch_size::text, 'NULL')));
    IF queue_name IS NOT NULL THEN
        PERFORM pgbroker._table(queue_name);
    END IF;
    FOR q IN SELECT p.* FROM pgbroker.policies() p
             WHERE trim_dedup_keys.queue_name IS NULL OR lower(p.queue_name) = lower(trim_dedup_keys.queue_name) LOOP
        EXIT WHEN removed >= batch_size;
        IF q.dedup_mode = 'queued' THEN
            EXECUTE format(
                $Q$
                DELETE FROM pgbroker.dedup_keys k WHERE (k.queue_name, k.dedup_key) IN (
                    SELECT d.queue_name, d.dedup_key FROM pgbroker.dedup_keys d
                    WHERE d.queue_name = $1 AND d.msg_id IS NOT NULL
                      AND NOT EXISTS (SELECT 1 FROM pgmq.%I m WHERE m.msg_id = d.msg_id)
                    LIMIT $2)
                $Q$, lower('q_' || q.queue_name)) USING q.queue_name, batch_size - removed;
        ELSE
            DELETE FROM pgbroker.dedup_keys k WHERE (k.queue_name, k.dedup_key) IN (
                SELECT d.queue_name, d.dedup_key FROM pgbroker.dedup_keys d
                WHERE d.queue_name = q.queue_name AND d.msg_id IS NOT NULL
                  AND d.sent_at < clock_timestamp() - make_interval(secs => q.dedup_window_seconds)
                LIMIT batch_size - removed);
        END IF;
        GET DIAGNOSTICS n = ROW_COUNT;
        removed := removed + n;
    END LOOP;
    RETURN removed;
END;
$$;


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
-- limit applies to it. The grouped reads (70_fifo_groups.sql) and Spark's
-- claims do not follow these limits.
--
-- In flight means leased: read (read_ct > 0) with a visibility time still
-- ahead. Counted from the queue table itself (the timed index from the
-- reader's clock on), so every way a message leaves flight counts at once:
-- ack, delete, archive, a lease running out. A nacked message waiting for
-- its back-off has the same shape as a leased one, and counts until it is
-- due again: the limits err on the safe side. The count touches the in-flight
-- and delayed rows, never the waiting backlog.
--
-- Why the readers of a limited queue take turns (an advisory lock held to the
-- end of the reader's transaction): a count is only right if no other reader
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
CREATE FUNCTION pgbroker._concurrency_key(headers jsonb)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(CASE WHEN jsonb_typeof(headers) = 'object' THEN headers->>'x-pgbroker-concurrency-key' END, '')
$$;

-- Build (on) or drop (off) a queue's concurrency-key index.
CREATE FUNCTION pgbroker._concurrency_key_index(stored_name text, make boolean)
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

-- The token buckets of rate-limited queues.
CREATE TABLE pgbroker.rate_buckets (
    queue_name varchar PRIMARY KEY
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    tokens double precision NOT NULL,
    refilled_at timestamptz NOT NULL
);

-- The per-key read of a limited queue: $1 qty, $2 conditional, $3 the
-- reader's clock, $4 the visibility timeout, $5 the per-key limit, $6 the
-- in-flight count of each key (jsonb), $7 the queue's stored name. Waiting
-- messages by key (a loose index scan over the concurrency-key index), due
-- timed ones from timed_from, each key capped at its room, then (priority
-- DESC, msg_id), locked and leased.
CREATE FUNCTION pgbroker._read_by_key_sql(qtable text, conditional jsonb)
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
              AND vt >= coalesce((SELECT h.timed_from FROM pgbroker.queue_head h WHERE h.queue_name = $7),
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

-- Read (or pop) a queue under its limits; the caller has checked the queue
-- and the arguments. Takes the queue's limiter lock (see the header), works
-- out how many messages may go now (rate, then in-flight room), and reads
-- that many: with a per-key limit through _read_by_key_sql, else with the
-- queue's own statement (50_reads.sql).
CREATE FUNCTION pgbroker._read_limited(stored_name text, ready_from bigint, vt integer, qty integer,
                                       conditional jsonb, pop boolean)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable constant text := lower('q_' || stored_name);
    p pgbroker.queue_policy := pgbroker.policy(stored_name);
    budget integer := qty;
    clock timestamptz;
    bucket pgbroker.rate_buckets;
    available double precision;
    in_flight bigint := 0;
    per_key jsonb := '{}';
    op text;
    got bigint;
BEGIN
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
    IF budget <= 0 THEN
        RETURN;
    END IF;

    IF NOT pop AND p.max_in_flight_per_key IS NOT NULL THEN
        RETURN QUERY EXECUTE pgbroker._read_by_key_sql(qtable, conditional)
            USING budget, conditional, clock, vt, p.max_in_flight_per_key, per_key, stored_name;
    ELSE
        op := CASE WHEN pop THEN 'pop' ELSE 'read' END
              || CASE WHEN p.priorities THEN '_p' ELSE '' END
              || CASE WHEN NOT pop AND NOT (conditional IS NULL OR conditional = '{}'::jsonb)
                      THEN CASE WHEN p.priorities THEN 'c' ELSE '_c' END ELSE '' END;
        RETURN QUERY EXECUTE format('EXECUTE %I(%s, %L, %L, %s, %s)', pgbroker._prepared(qtable, op),
                                    budget, conditional, clock, coalesce(vt::text, 'NULL'), ready_from);
    END IF;
    GET DIAGNOSTICS got = ROW_COUNT;
    IF p.rate_limit_per_second IS NOT NULL THEN
        UPDATE pgbroker.rate_buckets b SET tokens = available - got, refilled_at = clock
        WHERE b.queue_name = stored_name;
    END IF;
END;
$$;

-- The rows a read may take, oldest msg_id first, locked with SKIP LOCKED.
-- $1 = qty, $2 = conditional, $3 = the reader's clock. Every read and pop
-- statement is built on it, so that visibility is defined once (the grouped
-- reads of 70_fifo_groups.sql have their own rule, by group).
--
-- Timed messages (redeliveries, delayed sends) are searched from the oldest
-- due time, up to a window of 1000 due rows, then ordered by msg_id with the
-- ready ones. Within that window the order is exactly pgmq's; only when more
-- than 1000 timed messages are due at once do the earliest-due go first.
--
-- prioritized: the order is (priority DESC, msg_id) instead, priority being
-- pgbroker._priority(headers) (32_priorities.sql); the ready scan then walks
-- the queue's priority index from its top. Without it the text is the plain
-- one, so queues that use no priorities keep their statements.
CREATE FUNCTION pgbroker._visible_sql(qtable text, conditional jsonb, prioritized boolean DEFAULT false)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format(
        $Q$
        ready AS (
            SELECT msg_id%3$s FROM pgmq.%1$I
            WHERE read_ct = 0 AND vt <= enqueued_at %2$s
            ORDER BY %4$smsg_id
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ),
        timed AS (
            -- ARRAY(...) makes the due rows an InitPlan probed by primary key;
            -- as a join the planner may walk the whole primary key instead.
            SELECT q.msg_id%5$s FROM pgmq.%1$I q
            WHERE q.msg_id = ANY (ARRAY(
                    SELECT msg_id FROM pgmq.%1$I
                    WHERE NOT (read_ct = 0 AND vt <= enqueued_at) AND vt <= $3 %2$s
                    ORDER BY vt
                    LIMIT 1000))
              AND NOT (q.read_ct = 0 AND q.vt <= q.enqueued_at) AND q.vt <= $3
            ORDER BY %6$sq.msg_id
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ),
        picked AS (
            SELECT msg_id FROM (SELECT msg_id%7$s FROM ready UNION ALL SELECT msg_id%7$s FROM timed) c
            ORDER BY %8$smsg_id
            LIMIT $1
        )
        $Q$,
        qtable,
        CASE WHEN conditional IS NULL OR conditional = '{}'::jsonb THEN ''
             ELSE 'AND message @> $2' END,
        CASE WHEN prioritized THEN ', pgbroker._priority(headers) AS priority' ELSE '' END,
        CASE WHEN prioritized THEN 'pgbroker._priority(headers) DESC, ' ELSE '' END,
        CASE WHEN prioritized THEN ', pgbroker._priority(q.headers) AS priority' ELSE '' END,
        CASE WHEN prioritized THEN 'pgbroker._priority(q.headers) DESC, ' ELSE '' END,
        CASE WHEN prioritized THEN ', priority' ELSE '' END,
        CASE WHEN prioritized THEN 'priority DESC, ' ELSE '' END)
$$;

-- pgbroker._visible_sql starting where the queue's bounds say: the ready scan
-- at $5 (the caller's ready_from), the timed scan at timed_from. That bound is
-- a subquery (an InitPlan, read once a call) on the queue's name as written
-- in the statement, so no caller passes it.
CREATE FUNCTION pgbroker._visible_from_sql(qtable text, conditional jsonb, prioritized boolean DEFAULT false)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    ready_rule constant text := 'WHERE read_ct = 0 AND vt <= enqueued_at ';
    timed_rule constant text := 'WHERE NOT (read_ct = 0 AND vt <= enqueued_at) AND vt <= $3 ';
    visible text := pgbroker._visible_sql(qtable, conditional, prioritized);
BEGIN
    IF strpos(visible, ready_rule) = 0 OR strpos(visible, timed_rule) = 0 THEN
        RAISE EXCEPTION 'pgbroker._visible_sql no longer has the rules this function extends';
    END IF;
    visible := replace(visible, ready_rule, ready_rule || 'AND msg_id >= $5 ');
    RETURN replace(visible, timed_rule, timed_rule || format(
        $B$AND vt >= coalesce((SELECT h.timed_from FROM pgbroker.queue_head h
                               WHERE h.queue_name = (SELECT m.queue_name FROM pgmq.meta m
                                                     WHERE lower(m.queue_name) = %L)), '-infinity') $B$,
        substr(qtable, 3)));
END;
$$;

-- The text of a queue's hot statement, as PREPARE <name>(types) AS <query>.
--   read / read_c      pgmq.read's rows (read_c: with a conditional, $2)
--   deliver / deliver_c pgbroker.read's rows (the receipt appended)
--   pop                pgmq.pop
--   ack_a / ack_d      pgbroker.ack (archive / delete)
-- and the reads of a queue with priorities (32_priorities.sql), in priority
-- order: read_p, read_pc, deliver_p, deliver_pc, pop_p.
-- Parameters follow pgbroker._visible_sql: $1 qty, $2 conditional, $3 the
-- reader's clock; then $4 the visibility timeout (reads) and $5 the queue's
-- ready_from. ack: $1 msg_ids, $2 read_cts, $3 leases.
-- A name longer than an identifier (63 bytes; a long queue name with the
-- longest ops) would be cut by the server and never found again: such names
-- carry the table name's md5 instead.
CREATE OR REPLACE FUNCTION pgbroker._statement_name(qtable text, op text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length('pgb_' || op || '_' || qtable) <= 63 THEN 'pgb_' || op || '_' || qtable
                ELSE 'pgb_' || op || '_' || md5(qtable) END;
$$;

-- A queue's hot statement for op (see _statement_name), as PREPARE.
CREATE OR REPLACE FUNCTION pgbroker._statement(qtable text, op text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    name text := pgbroker._statement_name(qtable, op);
    atable text := 'a' || substr(qtable, 2);
    columns text := 'q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message, q.headers';
    prioritized constant boolean := op IN ('read_p', 'read_pc', 'deliver_p', 'deliver_pc', 'pop_p');
    result_order constant text := CASE WHEN prioritized THEN 'pgbroker._priority(headers) DESC, msg_id'
                                       ELSE 'msg_id' END;
BEGIN
    IF op IN ('read', 'read_c', 'deliver', 'deliver_c', 'read_p', 'read_pc', 'deliver_p', 'deliver_pc') THEN
        RETURN format(
            $Q$
            PREPARE %1$I (integer, jsonb, timestamptz, integer, bigint) AS
            WITH %2$s,
            leased AS (
                UPDATE pgmq.%3$I q
                SET vt = clock_timestamp() + make_interval(secs => $4),
                    read_ct = q.read_ct + 1,
                    last_read_at = clock_timestamp()
                FROM picked WHERE q.msg_id = picked.msg_id
                RETURNING %4$s
            )
            SELECT *%5$s FROM leased ORDER BY %6$s
            $Q$,
            name,
            pgbroker._visible_from_sql(qtable, CASE WHEN op LIKE '%c' THEN '{"c": 1}'::jsonb END, prioritized),
            qtable, columns,
            CASE WHEN op LIKE 'deliver%' THEN ', pgbroker.receipt(msg_id, read_ct, vt)' ELSE '' END,
            result_order);
    ELSIF op IN ('pop', 'pop_p') THEN
        RETURN format(
            $Q$
            PREPARE %1$I (integer, jsonb, timestamptz, integer, bigint) AS
            WITH %2$s,
            popped AS (
                DELETE FROM pgmq.%3$I q USING picked WHERE q.msg_id = picked.msg_id
                RETURNING %4$s
            )
            SELECT * FROM popped ORDER BY %5$s
            $Q$, name, pgbroker._visible_from_sql(qtable, NULL, prioritized), qtable, columns, result_order);
    ELSIF op IN ('ack_a', 'ack_d') THEN
        RETURN format(
            $Q$
            PREPARE %1$I (bigint[], integer[], bigint[]) AS
            WITH removed AS (
                DELETE FROM pgmq.%2$I q
                WHERE q.msg_id = ANY($1)
                  AND (q.msg_id, q.read_ct, pgbroker._micros(q.vt)) IN (SELECT * FROM unnest($1, $2, $3))
                  AND q.vt > clock_timestamp()
                RETURNING %4$s
            )%5$s
            SELECT msg_id FROM removed ORDER BY msg_id
            $Q$, name, qtable, atable, columns,
            CASE WHEN op = 'ack_a' THEN format(
                $A$,
            archived AS (
                INSERT INTO pgmq.%I (msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers)
                SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers FROM removed
            )$A$, atable) ELSE '' END);
    END IF;
    RAISE EXCEPTION 'pgbroker._statement: unknown operation %', quote_literal(op) USING ERRCODE = 'PB007';
END;
$$;

-- A queue's stored name and the policy settings the hot path needs, in one
-- probe; no row when the queue does not exist. read_mode: see
-- pgbroker._read_mode.
CREATE FUNCTION pgbroker._queue(queue_name text,
    OUT stored_name text, OUT max_deliveries integer, OUT max_depth bigint, OUT ack_mode text,
    OUT ready_from bigint, OUT read_mode text)
RETURNS SETOF record LANGUAGE sql STABLE AS $$
    SELECT m.queue_name, p.max_deliveries, p.max_depth, p.ack_mode, coalesce(h.ready_from, 0),
           pgbroker._read_mode(p)
    FROM pgmq.meta m
    LEFT JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
    LEFT JOIN pgbroker.queue_head h ON h.queue_name = m.queue_name
    WHERE lower(m.queue_name) = lower($1);
$$;

-- The read statement of a queue, run: pgmq.read's rows (deliver: with
-- receipts). The caller has checked the queue and the arguments. mode is the
-- queue's read mode (pgbroker._read_mode): a paused queue gives nothing, a
-- limited one is read by pgbroker._read_limited (56_limits.sql), one with
-- priorities by the prioritized statements.
CREATE FUNCTION pgbroker._run_read(stored_name text, ready_from bigint, vt integer, qty integer,
                                   conditional jsonb, deliver boolean, mode text DEFAULT 'plain')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    qtable text := lower('q_' || stored_name);
    variant text := CASE WHEN mode = 'priority' THEN 'p' ELSE '' END
                    || CASE WHEN conditional IS NULL OR conditional = '{}'::jsonb THEN '' ELSE 'c' END;
    op text := CASE WHEN deliver THEN 'deliver' ELSE 'read' END || CASE WHEN variant = '' THEN '' ELSE '_' || variant END;
    stmt text := pgbroker._statement_name(qtable, op);
BEGIN
    IF mode = 'paused' THEN
        RETURN CASE WHEN deliver THEN 'SELECT (NULL::pgbroker.delivery).* LIMIT 0'
                    ELSE 'SELECT (NULL::pgmq.message_record).* LIMIT 0' END;
    END IF;
    IF random() < 0.0625 THEN
        PERFORM pgbroker._advance_head(stored_name, qtable);
    END IF;
    IF mode = 'limited' THEN
        RETURN format('SELECT m.*%s FROM pgbroker._read_limited(%L, %s, %s, %s, %L, false) m',
                      CASE WHEN deliver THEN ', pgbroker.receipt(m.msg_id, m.read_ct, m.vt)' ELSE '' END,
                      stored_name, ready_from, vt, qty, conditional);
    END IF;
    -- pgbroker._prepared, inline: this is every read's path.
    IF NOT EXISTS (SELECT 1 FROM pg_prepared_statements s WHERE s.name = stmt) THEN
        EXECUTE pgbroker._statement(qtable, op);
    END IF;
    RETURN format('EXECUTE %I(%s, %L, %L, %s, %s)', stmt, qty, conditional, clock_timestamp(), vt, ready_from);
END;
$$;

-- The pop statement of a queue, run (mode as for _run_read).
CREATE FUNCTION pgbroker._run_pop(stored_name text, ready_from bigint, qty integer, mode text)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF mode = 'paused' THEN
        RETURN 'SELECT (NULL::pgmq.message_record).* LIMIT 0';
    ELSIF mode = 'limited' THEN
        RETURN format('SELECT * FROM pgbroker._read_limited(%L, %s, NULL, %s, NULL, true)',
                      stored_name, ready_from, qty);
    END IF;
    RETURN format('EXECUTE %I(%s, NULL, %L, NULL, %s)',
                  pgbroker._prepared(lower('q_' || stored_name), CASE WHEN mode = 'priority' THEN 'pop_p' ELSE 'pop' END),
                  qty, clock_timestamp(), ready_from);
END;
$$;

-- Read and deliver for a queue with max_deliveries (pgbroker.read's body once
-- the queue and arguments are checked; without max_deliveries the callers run
-- the read statement themselves): a message already delivered max_deliveries
-- times (each consumer died or let its lease run out) is dead-lettered
-- instead of delivered again, so a read may return fewer messages than qty
-- while more are waiting.
CREATE FUNCTION pgbroker._deliver(stored_name text, ready_from bigint, max_deliveries integer, vt integer,
                                  qty integer, conditional jsonb, mode text DEFAULT 'plain')
RETURNS SETOF pgbroker.delivery LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    statement text := pgbroker._run_read(stored_name, ready_from, vt, qty, conditional, true, mode);
    d pgbroker.delivery;
    batch pgbroker.delivery[] := '{}';
    over bigint[];
BEGIN
    -- The statement returns its rows in their delivery order.
    FOR d IN EXECUTE statement LOOP
        batch := array_append(batch, d);
    END LOOP;
    over := ARRAY(SELECT b.msg_id FROM unnest(batch) b WHERE b.read_ct > max_deliveries);
    IF cardinality(over) > 0 THEN
        PERFORM pgbroker._dead_letter(stored_name, over,
            format('delivered %s times without an ack or a failure report '
                   '(its consumers died or let their leases run out)', max_deliveries),
            -1);
    END IF;
    RETURN QUERY SELECT * FROM unnest(batch) b WHERE b.read_ct <= max_deliveries;
END;
$$;

-- Send a queue's dead letters back to it as new messages (the
-- x-pgbroker-dead-letter header removed, deliveries counted from 0 again):
-- all of them, or those of msg_ids. A replay is sent anew whatever its dedup
-- key (34_dedup.sql): the key is left out, or its window would swallow the
-- replay and the letter would be lost. The queue's max_depth applies, all or
-- nothing. Returns (dead_letter_id, msg_id): the letter's id where it was,
-- and the new message's id in the queue.
CREATE OR REPLACE FUNCTION pgbroker.replay_dead_letters(queue_name text, msg_ids bigint[] DEFAULT NULL)
RETURNS TABLE (dead_letter_id bigint, msg_id bigint) LANGUAGE plpgsql AS $$
DECLARE
    p pgbroker.queue_policy := pgbroker.policy(queue_name);
    letter_ids bigint[];
    messages jsonb[];
    letter_headers jsonb[];
BEGIN
    EXECUTE format(
        $Q$
        WITH letters AS (
            DELETE FROM pgmq.%I
            WHERE headers -> 'x-pgbroker-dead-letter' ->> 'queue' = $1 AND ($2::bigint[] IS NULL OR msg_id = ANY ($2))
            RETURNING msg_id, message,
                      nullif(headers - 'x-pgbroker-dead-letter' - 'x-pgbroker-dedup-key', '{}'::jsonb) AS headers
        )
        SELECT array_agg(msg_id ORDER BY msg_id), array_agg(message ORDER BY msg_id),
               array_agg(headers ORDER BY msg_id)
        FROM letters
        $Q$, pgbroker._dead_letter_table(p))
        INTO letter_ids, messages, letter_headers
        USING p.queue_name, msg_ids;
    IF letter_ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM unnest(letter_ids,
                                      ARRAY(SELECT pgbroker._send_many(p.queue_name, messages, letter_headers, NULL)));
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
CREATE OR REPLACE FUNCTION pgbroker._read_grouped(queue_name text, vt integer, qty integer, mode text)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
    candidates bigint[];
    owned bigint[];
    remaining integer := qty;
    got bigint;
BEGIN
    IF mode = 'rr' AND qty < 0 THEN
        -- pgmq's round robin compares a row number with qty: nothing to read.
        PERFORM pgbroker._check_read_args(vt, 0);
        RETURN;
    END IF;
    PERFORM pgbroker._pgmq_check_read_args(vt, qty);
    IF qty = 0 OR pgbroker.is_paused(queue_name) THEN  -- paused: 20_policies.sql
        RETURN;
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
        END IF;
    ELSE
        RAISE EXCEPTION 'unknown grouped read mode %', quote_literal(mode) USING ERRCODE = 'PB007';
    END IF;
END;
$$;

-- A routed queue's branch of the read, deliver or pop route, by its read
-- mode: the statement itself for a plain or prioritized queue (static SQL,
-- planned once per session), nothing for a paused one, and the dynamic path
-- (pgbroker._run_read / _run_pop) for a limited one, whose reads take turns
-- anyway.
CREATE FUNCTION pgbroker._route_read_body(qtable text, mode text, op text, params text[])
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF mode = 'paused' THEN
        RETURN 'RETURN;';
    ELSIF mode = 'limited' AND op = 'pop' THEN
        RETURN 'RETURN QUERY EXECUTE pgbroker._run_pop(r_name, r_from, p_qty, ''limited'');';
    ELSIF mode = 'limited' THEN
        RETURN format('RETURN QUERY EXECUTE pgbroker._run_read(r_name, r_from, p_vt, p_qty, p_conditional, %L, ''limited'');',
                      op = 'deliver');
    END IF;
    RETURN format('RETURN QUERY %s;', pgbroker._route_statement(
        pgbroker._statement_query(qtable, op || CASE WHEN mode = 'priority' THEN '_p' ELSE '' END), params));
END;
$$;

-- Rewrite every route from pgmq.meta and the queue policies. SECURITY
-- DEFINER, so that whoever creates a queue or sets a policy can rewrite the
-- routes, which stay the installer's. (Comments in its body refer to the
-- migrations that introduced what each route does.)
CREATE OR REPLACE FUNCTION pgbroker._write_routes()
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
-- Routes are compiled by the sessions that call them, not here.
SET check_function_bodies = off
SET search_path = pg_catalog, pg_temp AS $W$
DECLARE
    route_limit integer := coalesce(nullif(current_setting('pgbroker.route_limit', true), '')::integer, 128);
    keys text[];
    names text[];
    tables text[];
    max_depths bigint[];
    max_deliveries integer[];
    archives boolean[];
    modes text[];
    send_bodies text[] := '{}';
    read_bodies text[] := '{}';
    deliver_bodies text[] := '{}';
    pop_bodies text[] := '{}';
    ack_bodies text[] := '{}';
    read_params constant text[] := ARRAY['p_qty', 'NULL::jsonb', 'r_clock', 'p_vt', 'r_from'];
    pop_params constant text[] := ARRAY['p_qty', 'NULL::jsonb', 'r_clock', 'NULL::integer', 'r_from'];
    ack_params constant text[] := ARRAY['r_held.msg_ids', 'r_held.read_cts', 'r_held.leases'];
    send_params constant text[] := ARRAY['p_msgs', 'p_headers', 'p_delay'];
    qtable text;
    op text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.routes'));
    SELECT coalesce(array_agg(lower(s.queue_name) ORDER BY s.n), '{}'),
           coalesce(array_agg(s.queue_name ORDER BY s.n), '{}'),
           coalesce(array_agg(lower('q_' || s.queue_name) ORDER BY s.n), '{}'),
           coalesce(array_agg(s.max_depth ORDER BY s.n), '{}'),
           coalesce(array_agg(s.max_deliveries ORDER BY s.n), '{}'),
           coalesce(array_agg(coalesce(s.ack_mode, 'archive') = 'archive' ORDER BY s.n), '{}'),
           coalesce(array_agg(s.read_mode ORDER BY s.n), '{}')
    INTO keys, names, tables, max_depths, max_deliveries, archives, modes
    FROM (SELECT m.queue_name, p.max_depth, p.max_deliveries, p.ack_mode, pgbroker._read_mode(p) AS read_mode,
                 row_number() OVER (ORDER BY m.created_at, m.queue_name) AS n
          FROM pgmq.meta m LEFT JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
          ORDER BY m.created_at, m.queue_name
          LIMIT greatest(route_limit, 0)) s;

    FOR i IN 1..cardinality(tables) LOOP
        qtable := tables[i];
        send_bodies := send_bodies || format(
            E'IF cardinality(p_msgs) = 1 THEN\nRETURN QUERY %s;\nELSE\nRETURN QUERY %s;\nEND IF;',
            pgbroker._route_statement(pgbroker._send_insert_sql(qtable, true), send_params),
            pgbroker._route_statement(pgbroker._send_insert_sql(qtable, false), send_params));
        read_bodies := read_bodies || pgbroker._route_read_body(qtable, modes[i], 'read', read_params);
        deliver_bodies := deliver_bodies || pgbroker._route_read_body(qtable, modes[i], 'deliver', read_params);
        pop_bodies := pop_bodies || pgbroker._route_read_body(qtable, modes[i], 'pop', pop_params);
        ack_bodies := ack_bodies || format(E'IF r_archive THEN\nRETURN QUERY %s;\nELSE\nRETURN QUERY %s;\nEND IF;',
            pgbroker._route_statement(pgbroker._statement_query(qtable, 'ack_a'), ack_params),
            pgbroker._route_statement(pgbroker._statement_query(qtable, 'ack_d'), ack_params));
    END LOOP;

    -- Sends: as 0012's _send_sql and _send_many (checks in the same order).
    EXECUTE format($R$
CREATE OR REPLACE FUNCTION pgbroker._route_send(p_queue_name text, p_msgs jsonb[], p_headers jsonb[],
                                                p_delay timestamptz)
RETURNS SETOF bigint LANGUAGE plpgsql AS $F$
DECLARE
    r integer := array_position(%1$L::text[], lower(p_queue_name));
    r_queue record;
    r_name text;
    r_max_depth bigint;
    r_size bigint;
BEGIN
    -- The batch first, then the queue: pgmq's order (0015).
    IF p_msgs IS NULL OR cardinality(p_msgs) = 0
       OR (p_headers IS NOT NULL AND cardinality(p_headers) <> cardinality(p_msgs)) THEN
        PERFORM pgbroker._check_batch(p_msgs, p_headers);
    END IF;
    IF r IS NULL THEN
        SELECT * INTO r_queue FROM pgbroker._queue(p_queue_name);
        IF NOT FOUND THEN
            PERFORM pgbroker._pgmq_no_queue(p_queue_name);  -- pgmq's 42P01, pgbroker's code in DETAIL
        END IF;
        r_name := r_queue.stored_name;
        r_max_depth := r_queue.max_depth;
    ELSE
        r_name := (%2$L::text[])[r];
        r_max_depth := (%3$L::bigint[])[r];
    END IF;
    -- A message's size counts its headers too: both are stored in its row.
    IF cardinality(p_msgs) = 1 THEN
        r_size := pg_column_size(p_msgs[1]) + coalesce(pg_column_size(p_headers[1]), 0);
    ELSE
        SELECT max(pg_column_size(m.msg) + coalesce(pg_column_size(m.hdr), 0)) INTO r_size
        FROM unnest(p_msgs, p_headers) AS m(msg, hdr);
    END IF;
    -- Without pgbroker.max_message_bytes the limit is 1 MiB (pgbroker._check_message_size).
    IF r_size > 1048576 OR coalesce(current_setting('pgbroker.max_message_bytes', true), '') <> '' THEN
        PERFORM pgbroker._check_message_size(r_size);
    END IF;
    IF r_max_depth IS NOT NULL THEN
        PERFORM pgbroker._check_depth(r_name, lower('q_' || r_name), cardinality(p_msgs));
    END IF;
    -- The transaction id before the msg_ids: queue_head's advances rely on it.
    PERFORM pg_current_xact_id();
    -- Job headers (32_priorities.sql): checked, and a batch with dedup keys
    -- is sent by pgbroker._send_deduplicated; the rest take the INSERT below.
    IF p_headers IS NOT NULL THEN
        IF pgbroker._has_job_headers(p_headers) THEN
            IF pgbroker._prepare_job_headers(r_name, p_headers) THEN
                RETURN QUERY SELECT * FROM pgbroker._send_deduplicated(r_name, p_msgs, p_headers, p_delay);
                RETURN;
            END IF;
        END IF;
    END IF;
    IF r IS NULL THEN
        RETURN QUERY EXECUTE pgbroker._send_insert_sql(lower('q_' || r_name), cardinality(p_msgs) = 1)
            USING p_msgs, p_headers, p_delay;
        RETURN;
    END IF;
%4$s
END;
$F$
$R$, keys, names, max_depths, pgbroker._route_tree(send_bodies, 1, cardinality(send_bodies)));

    -- pgmq.read (_route_read) and pgbroker.read (_route_deliver), as in 0012.
    -- A conditional read takes the dynamic path; a deliver on a queue with
    -- max_deliveries goes through pgbroker._deliver, which dead-letters the
    -- over-delivered.
    FOREACH op IN ARRAY ARRAY['read', 'deliver'] LOOP
        EXECUTE format($R$
CREATE OR REPLACE FUNCTION pgbroker._route_%1$s(p_queue_name text, p_vt integer, p_qty integer,
                                                p_conditional jsonb)
RETURNS SETOF %2$s LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $F$
DECLARE
    r integer := array_position(%3$L::text[], lower(p_queue_name));
    r_dynamic constant boolean := r IS NULL OR NOT (p_conditional IS NULL OR p_conditional = '{}'::jsonb);
    r_queue record;
    r_name text;
    r_from bigint;
    r_clock timestamptz;
    r_max_deliveries integer;
    r_mode text;
BEGIN
    IF r_dynamic THEN
        SELECT * INTO r_queue FROM pgbroker._queue(p_queue_name);
        IF NOT FOUND THEN
            PERFORM %8$s(p_queue_name);
        END IF;
    END IF;
    IF p_vt IS NULL OR p_vt < 0 OR p_qty IS NULL OR p_qty < 0 THEN
        PERFORM %9$s(p_vt, p_qty);
    END IF;
    IF r_dynamic THEN
        r_from := r_queue.ready_from;
        r_name := r_queue.stored_name;
        r_max_deliveries := r_queue.max_deliveries;
        r_mode := r_queue.read_mode;
    ELSE
        r_name := (%4$L::text[])[r];
        r_from := pgbroker._route_ready_from(r_name);
        r_max_deliveries := (%5$L::integer[])[r];
        r_mode := (%10$L::text[])[r];
    END IF;
    IF %6$L AND r_max_deliveries IS NOT NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._deliver(r_name, r_from, r_max_deliveries, p_vt, p_qty,
                                                     p_conditional, r_mode);
        RETURN;
    END IF;
    IF r_dynamic THEN
        RETURN QUERY EXECUTE pgbroker._run_read(r_name, r_from, p_vt, p_qty, p_conditional, %6$L, r_mode);
        RETURN;
    END IF;
    r_clock := clock_timestamp();
%7$s
END;
$F$
$R$, op, CASE op WHEN 'read' THEN 'pgmq.message_record' ELSE 'pgbroker.delivery' END,
     keys, names, max_deliveries, op = 'deliver',
     CASE op WHEN 'read' THEN pgbroker._route_tree(read_bodies, 1, cardinality(read_bodies))
             ELSE pgbroker._route_tree(deliver_bodies, 1, cardinality(deliver_bodies)) END,
     -- A missing queue: pgmq's failure for pgmq.read, pgbroker's for pgbroker.read (0015).
     CASE op WHEN 'read' THEN 'pgbroker._pgmq_no_queue' ELSE 'pgbroker._table' END,
     CASE op WHEN 'read' THEN 'pgbroker._pgmq_check_read_args' ELSE 'pgbroker._check_read_args' END,
     modes);
    END LOOP;

    -- pgmq.pop, as in 0012.
    EXECUTE format($R$
CREATE OR REPLACE FUNCTION pgbroker._route_pop(p_queue_name text, p_qty integer)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $F$
DECLARE
    r integer := array_position(%1$L::text[], lower(p_queue_name));
    r_queue record;
    r_name text;
    r_from bigint;
    r_clock timestamptz;
BEGIN
    IF r IS NULL THEN
        SELECT * INTO r_queue FROM pgbroker._queue(p_queue_name);
        IF NOT FOUND THEN
            PERFORM pgbroker._pgmq_no_queue(p_queue_name);
        END IF;
        r_name := r_queue.stored_name;
    ELSE
        r_name := (%2$L::text[])[r];
    END IF;
    IF p_qty IS NULL OR p_qty < 0 THEN
        PERFORM pgbroker._pgmq_check_read_args(0, p_qty);
    END IF;
    r_from := pgbroker._route_ready_from(r_name);
    IF r IS NULL THEN
        RETURN QUERY EXECUTE pgbroker._run_pop(r_name, r_from, p_qty, r_queue.read_mode);
        RETURN;
    END IF;
    r_clock := clock_timestamp();
%3$s
END;
$F$
$R$, keys, names, pgbroker._route_tree(pop_bodies, 1, cardinality(pop_bodies)));

    -- pgbroker.ack, as in 0012; with p_policy_mode a NULL archive means the
    -- queue policy's ack_mode (pgbroker.consume), otherwise it is an error.
    -- Like the reads, it advances the queue's bounds now and then, before it
    -- writes: only a transaction that has written nothing yet can record their
    -- candidates (0013), and in pgbroker.consume the ack writes first.
    EXECUTE format($R$
CREATE OR REPLACE FUNCTION pgbroker._route_ack(p_queue_name text, p_receipts text[], p_archive boolean,
                                               p_policy_mode boolean)
RETURNS SETOF bigint LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $F$
DECLARE
    r integer := array_position(%1$L::text[], lower(p_queue_name));
    r_queue record;
    r_name text;
    r_held record;
    r_archive boolean := p_archive;
BEGIN
    IF r IS NULL THEN
        SELECT * INTO r_queue FROM pgbroker._queue(p_queue_name);
        IF NOT FOUND THEN
            PERFORM pgbroker._table(p_queue_name);
        END IF;
        r_name := r_queue.stored_name;
    ELSE
        r_name := (%2$L::text[])[r];
    END IF;
    IF random() < 0.0625 THEN
        PERFORM pgbroker._advance_head(r_name, lower('q_' || r_name));
    END IF;
    r_held := pgbroker._held(p_receipts);
    IF r_archive IS NULL THEN
        IF NOT p_policy_mode THEN
            PERFORM pgbroker._check_arg(false, 'archive must be true or false, got NULL');
        END IF;
        IF r IS NULL THEN
            r_archive := coalesce(r_queue.ack_mode, 'archive') = 'archive';
        ELSE
            r_archive := (%3$L::boolean[])[r];
        END IF;
    END IF;
    IF r IS NULL THEN
        RETURN QUERY EXECUTE pgbroker._run_ack(lower('q_' || r_name), r_held.msg_ids, r_held.read_cts,
                                               r_held.leases, r_archive);
        RETURN;
    END IF;
%4$s
END;
$F$
$R$, keys, names, archives, pgbroker._route_tree(ack_bodies, 1, cardinality(ack_bodies)));
END;
$W$;


-- The monitor reads the pause flag (the pgbroker_queue_paused gauge).
INSERT INTO pgbroker.role_function (role_kind, function_schema, function_name)
VALUES ('monitor', 'pgbroker', 'is_paused');


SELECT pgbroker._write_routes();
