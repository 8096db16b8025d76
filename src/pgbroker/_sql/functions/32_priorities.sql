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
CREATE OR REPLACE FUNCTION pgbroker._priority(headers jsonb)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN headers->>'x-pgbroker-priority' ~ '^-?[0-9]{1,9}$'
                THEN (headers->>'x-pgbroker-priority')::integer ELSE 0 END
$$;

-- The name of a queue table's priority index.
CREATE OR REPLACE FUNCTION pgbroker._priority_index_name(qtable text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT qtable || '_priority_idx'
$$;

-- Build (on) or drop (off) a queue's priority index; the caller records the
-- setting in the queue's policy.
CREATE OR REPLACE FUNCTION pgbroker._priority_index(stored_name text, make boolean)
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

-- Headers named x-pgbroker-* are reserved: they carry the engine's state and
-- its record of what happened to a message (x-pgbroker-dead-letter, which
-- dead_letters, replay and purge trust; -schedule, -stream and -published,
-- which consumers key on). A sender may set only the job headers above
-- (priority, dedup key, concurrency key: inputs by design). A send through
-- any door carrying another reserved header is refused (PB007), not
-- stripped: a caller's bad input gets an error and changes nothing, and a
-- message is never stored other than as sent. Only the engine's own sends
-- (pgbroker._send_many with engine_headers: dead-letter replay, schedules,
-- stream retries) carry them. The names compare in any letter case.
CREATE OR REPLACE FUNCTION pgbroker._check_reserved_headers(headers jsonb[])
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    reserved text;
BEGIN
    SELECT k INTO reserved
    FROM unnest(headers) h,
         jsonb_object_keys(CASE WHEN jsonb_typeof(h) = 'object' THEN h END) k
    WHERE starts_with(lower(k), 'x-pgbroker-')
      AND lower(k) NOT IN ('x-pgbroker-priority', 'x-pgbroker-dedup-key', 'x-pgbroker-concurrency-key')
    LIMIT 1;
    IF reserved IS NOT NULL THEN
        RAISE EXCEPTION 'header % is reserved for pgbroker itself', quote_ident(reserved)
            USING ERRCODE = 'PB007',
                  HINT = 'Of the x-pgbroker-* headers a sender may set only x-pgbroker-priority, '
                         'x-pgbroker-dedup-key and x-pgbroker-concurrency-key; rename the header.';
    END IF;
END;
$$;

-- Whether any headers of a send carry a job header (priority, dedup key,
-- concurrency key). The send route calls this only for sends with headers.
CREATE OR REPLACE FUNCTION pgbroker._has_job_headers(headers jsonb[])
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT EXISTS (SELECT 1 FROM unnest($1) h
                   WHERE jsonb_typeof(h) = 'object'
                     AND h ?| ARRAY['x-pgbroker-priority', 'x-pgbroker-dedup-key', 'x-pgbroker-concurrency-key'])
$$;

-- Refuse job headers that do not say what they must (PB007): a priority is an
-- integer of up to nine digits (a JSON number or a string of one), a dedup
-- key and a concurrency key are non-empty strings of up to 512 characters.
-- A JSON null is as good as no header.
CREATE OR REPLACE FUNCTION pgbroker._check_job_headers(headers jsonb[])
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
CREATE OR REPLACE FUNCTION pgbroker._prepare_job_headers(stored_name text, headers jsonb[])
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
