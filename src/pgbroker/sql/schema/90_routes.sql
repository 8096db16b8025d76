-- Routes: the hot statements of every queue as static SQL with cached plans.
-- (The engine as it is now: change it together with a new migration, see
-- 10_queues.sql.)
--
-- Queue tables have a name per queue, so a statement that names its table
-- must be written per queue. Run through EXECUTE it is parsed and planned
-- (or, prepared, at least parsed) on every call, after a probe of pgmq.meta
-- joined with the queue's policy. Measured with pgbench (15 clients, one
-- server): a PL/pgSQL send whose INSERT names its table, with no probe, ran
-- at 1.4-1.8x pgmq.send; the same with the probe and a dynamic INSERT at
-- 0.8-0.9x.
--
-- A route is a generated PL/pgSQL function per operation
-- (pgbroker._route_send, _route_read, _route_deliver, _route_pop,
-- _route_ack) holding, for every queue, that operation's statement with the
-- table name written in: static SQL, planned once per session. The queue's
-- names and the policy settings the hot path needs are written in as array
-- constants, so a routed call makes no probe at all:
--   * the queue is found with array_position over the lower-case names, a C
--     loop of memcmp (a few microseconds for the largest route);
--   * its statement is chosen by a balanced tree of IFs on that position, so
--     a call tests about log2(queues) integers, never every branch.
-- The statements are pgbroker._statement's (reads, pops, acks; 50_reads.sql)
-- and pgbroker._send_insert_sql's (sends; 30_sends.sql), so their text is
-- written once. The route functions are not in this file: only
-- pgbroker._write_routes defines them, and rewrites them as queues change.
--
-- Routes are rewritten by pgbroker._write_routes, from statement triggers on
-- pgmq.meta and pgbroker.queue_policy: any way a queue is created, dropped
-- or renamed, or a policy set, rewrites them in the same transaction (a
-- rollback takes the change back). Writers are serialised by an advisory
-- lock held to the end of their transaction, so queue creation and policy
-- changes in a database take turns; other sessions pick up a new route at
-- their next call (PL/pgSQL recompiles a function whose definition changed).
--
-- A queue's read mode (pgbroker._read_mode, 20_policies.sql) chooses what its
-- read, deliver and pop branches hold: the plain statements, the
-- prioritized ones (32_priorities.sql), a bare RETURN for a paused queue, or
-- the limited read (56_limits.sql). A queue that uses none of these features
-- keeps exactly the branch it had before them. Sends carrying pgbroker's job
-- headers (priority, dedup key, concurrency key) are checked by
-- pgbroker._prepare_job_headers, and those with a dedup key leave the static
-- INSERT for pgbroker._send_deduplicated; a send without headers tests one
-- NULL.
--
-- Not every queue is routed: at most pgbroker.route_limit queues (default
-- 128, the oldest first), because every session compiles a route's full
-- text when it first calls it. A queue that is not routed (beyond the limit,
-- or invisible to the transaction that last wrote the routes) takes the
-- dynamic path (pgbroker._statement_call, 50_reads.sql), which gives the same
-- results and errors: a route is only ever a faster way to the same
-- statement.

-- A query with its $n parameters replaced by the given expressions (variables
-- of the route, or literals: pgbroker._statement_call), in one pass, so that
-- no replacement is ever read again for marks ($1 in a literal stays as it
-- is, and $1 never eats $10's start).
CREATE FUNCTION pgbroker._route_statement(statement text, params text[])
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    parts constant text[] := regexp_split_to_array(statement, '\$[0-9]+');
    marks constant integer[] := ARRAY(SELECT m[1]::integer FROM regexp_matches(statement, '\$([0-9]+)', 'g') m);
    routed text := parts[1];
BEGIN
    FOR i IN 1..cardinality(marks) LOOP
        routed := routed || params[marks[i]] || parts[i + 1];
    END LOOP;
    RETURN routed;
END;
$$;

-- IF statements choosing bodies[lo..hi] by the variable r, halving the range
-- at each level.
CREATE FUNCTION pgbroker._route_tree(bodies text[], lo integer, hi integer)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    mid integer := (lo + hi) / 2;
BEGIN
    IF lo > hi THEN
        RETURN '';
    ELSIF lo = hi THEN
        RETURN bodies[lo];
    END IF;
    RETURN format(E'IF r <= %s THEN\n%s\nELSE\n%s\nEND IF;',
                  mid, pgbroker._route_tree(bodies, lo, mid), pgbroker._route_tree(bodies, mid + 1, hi));
END;
$$;

-- Rewrite every route from pgmq.meta and the queue policies. SECURITY
-- DEFINER, so that whoever creates a queue or sets a policy can rewrite the
-- routes, which stay the installer's. (Comments in its body refer to the
-- migrations that introduced what each route does.)
CREATE FUNCTION pgbroker._write_routes()
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
-- Routes are compiled by the sessions that call them, not here.
SET check_function_bodies = off
SET search_path = pg_catalog, pg_temp AS $W$
DECLARE
    route_limit constant bigint := pgbroker._limit('pgbroker.route_limit', 128, false);
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
                                                p_delay timestamptz, p_engine_headers boolean DEFAULT false)
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
    -- The limit is the database's, never only the session's (0025).
    PERFORM pgbroker._check_message_size(r_size);
    IF r_max_depth IS NOT NULL THEN
        PERFORM pgbroker._check_depth(r_name, lower('q_' || r_name), cardinality(p_msgs));
    END IF;
    -- The transaction id before the msg_ids: queue_head's advances rely on it.
    PERFORM pg_current_xact_id();
    -- Job headers (32_priorities.sql): checked, and a batch with dedup keys
    -- is sent by pgbroker._send_deduplicated; the rest take the INSERT below.
    IF p_headers IS NOT NULL THEN
        -- Reserved headers (0025): only the engine's own sends carry them.
        IF NOT p_engine_headers THEN
            PERFORM pgbroker._check_reserved_headers(p_headers);
        END IF;
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

REVOKE EXECUTE ON FUNCTION pgbroker._write_routes() FROM PUBLIC;

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

-- Where a routed read starts, moving it up now and then (as the dynamic
-- path's pgbroker._run_read does).
CREATE FUNCTION pgbroker._route_ready_from(stored_name text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    ready_from bigint;
BEGIN
    IF random() < 0.0625 THEN
        PERFORM pgbroker._advance_head(stored_name, lower('q_' || stored_name));
    END IF;
    SELECT h.ready_from INTO ready_from FROM pgbroker.queue_head h WHERE h.queue_name = stored_name;
    RETURN coalesce(ready_from, 0);
END;
$$;

-- The triggers' function: any change of the queues or their policies
-- rewrites the routes.
CREATE FUNCTION pgbroker._routes_changed()
RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pgbroker._write_routes();
    RETURN NULL;
END;
$$;

REVOKE EXECUTE ON FUNCTION pgbroker._routes_changed() FROM PUBLIC;

CREATE TRIGGER routes_on_queues AFTER INSERT OR UPDATE OR DELETE ON pgmq.meta
    FOR EACH STATEMENT EXECUTE FUNCTION pgbroker._routes_changed();
CREATE TRIGGER routes_on_policies AFTER INSERT OR UPDATE OR DELETE ON pgbroker.queue_policy
    FOR EACH STATEMENT EXECUTE FUNCTION pgbroker._routes_changed();

-- The routes of a database without queues yet: every call takes the dynamic
-- path, which reports the missing queue.
SELECT pgbroker._write_routes();
