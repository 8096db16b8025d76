-- pgbroker migration 0014: routes, the hot statements of every queue as
-- static SQL with cached plans.
--
-- Queue tables have a name per queue, so 0012 still ran each hot statement
-- through EXECUTE: a dynamic INSERT planned on every send, and for reads a
-- prepared statement run by an "EXECUTE name(literals)" that PL/pgSQL parses
-- on every call, after a probe of pgmq.meta joined with the queue's policy.
-- Measured with pgbench (15 clients, one server): a PL/pgSQL send whose
-- INSERT names its table, with no probe, ran at 1.4-1.8x pgmq.send; the same
-- with the probe and the dynamic INSERT (0012) at 0.8-0.9x.
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
-- The statements are pgbroker._statement's (reads, pops, acks) and
-- pgbroker._send_insert_sql's (sends), so their text is still written once.
--
-- Routes are rewritten by pgbroker._write_routes, from statement triggers on
-- pgmq.meta and pgbroker.queue_policy: any way a queue is created, dropped
-- or renamed, or a policy set, rewrites them in the same transaction (a
-- rollback takes the change back). Writers are serialised by an advisory
-- lock held to the end of their transaction, so queue creation and policy
-- changes in a database now take turns; other sessions pick up a new route at
-- their next call (PL/pgSQL recompiles a function whose definition changed).
--
-- Not every queue is routed: at most pgbroker.route_limit queues (default
-- 128, the oldest first), because every session compiles a route's full
-- text when it first calls it. A queue that is not routed (beyond the limit,
-- or invisible to the transaction that last wrote the routes) takes 0012's
-- dynamic path, which gives the same results and errors: a route is only
-- ever a faster way to the same statement.
--
-- Behaviour (results, order, errors and their order) is exactly 0012's.

-- The INSERT of a send, with $1 the messages, $2 their headers (or NULL),
-- $3 the delay (NULL: visible at once). One message takes a one-row INSERT.
CREATE FUNCTION pgbroker._send_insert_sql(qtable text, single boolean)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN single THEN format(
        'INSERT INTO pgmq.%I (vt, message, headers) VALUES (coalesce($3, now()), $1[1], $2[1])'
        ' RETURNING msg_id', qtable)
    ELSE format(
        $Q$
        INSERT INTO pgmq.%I (vt, message, headers)
        SELECT coalesce($3, now()), m.msg, m.hdr
        FROM unnest($1, $2) WITH ORDINALITY AS m(msg, hdr, n)
        ORDER BY m.n
        RETURNING msg_id
        $Q$, qtable) END;
$$;

-- A statement of pgbroker._statement as the query alone (no PREPARE).
CREATE FUNCTION pgbroker._statement_query(qtable text, op text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    statement text := pgbroker._statement(qtable, op);
    stripped text := regexp_replace(statement, '^\s*PREPARE\s+\S+\s*\([^)]*\)\s+AS\s', '');
BEGIN
    IF stripped = statement THEN
        RAISE EXCEPTION 'pgbroker._statement_query: not a PREPARE statement: %', left(statement, 80);
    END IF;
    RETURN stripped;
END;
$$;

-- A query with its $n parameters replaced by the given names (variables of
-- the route), from the highest number down so that $1 never eats $10's start.
CREATE FUNCTION pgbroker._route_statement(statement text, params text[])
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    routed text := statement;
BEGIN
    FOR i IN REVERSE cardinality(params)..1 LOOP
        routed := replace(routed, '$' || i, params[i]);
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

-- Rewrite every route from pgmq.meta and the queue policies.
CREATE FUNCTION pgbroker._write_routes()
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
           coalesce(array_agg(coalesce(s.ack_mode, 'archive') = 'archive' ORDER BY s.n), '{}')
    INTO keys, names, tables, max_depths, max_deliveries, archives
    FROM (SELECT m.queue_name, p.max_depth, p.max_deliveries, p.ack_mode,
                 row_number() OVER (ORDER BY m.created_at, m.queue_name) AS n
          FROM pgmq.meta m LEFT JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
          ORDER BY m.created_at, m.queue_name
          LIMIT greatest(route_limit, 0)) s;

    FOREACH qtable IN ARRAY tables LOOP
        send_bodies := send_bodies || format(
            E'IF cardinality(p_msgs) = 1 THEN\nRETURN QUERY %s;\nELSE\nRETURN QUERY %s;\nEND IF;',
            pgbroker._route_statement(pgbroker._send_insert_sql(qtable, true), send_params),
            pgbroker._route_statement(pgbroker._send_insert_sql(qtable, false), send_params));
        read_bodies := read_bodies || format('RETURN QUERY %s;',
            pgbroker._route_statement(pgbroker._statement_query(qtable, 'read'), read_params));
        deliver_bodies := deliver_bodies || format('RETURN QUERY %s;',
            pgbroker._route_statement(pgbroker._statement_query(qtable, 'deliver'), read_params));
        pop_bodies := pop_bodies || format('RETURN QUERY %s;',
            pgbroker._route_statement(pgbroker._statement_query(qtable, 'pop'), pop_params));
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
    IF r IS NULL THEN
        SELECT * INTO r_queue FROM pgbroker._queue(p_queue_name);
        IF NOT FOUND THEN
            PERFORM pgbroker._table(p_queue_name);  -- PB001/PB002, naming the problem
        END IF;
        r_name := r_queue.stored_name;
        r_max_depth := r_queue.max_depth;
    ELSE
        r_name := (%2$L::text[])[r];
        r_max_depth := (%3$L::bigint[])[r];
    END IF;
    IF p_msgs IS NULL OR cardinality(p_msgs) = 0
       OR (p_headers IS NOT NULL AND cardinality(p_headers) <> cardinality(p_msgs)) THEN
        PERFORM pgbroker._check_batch(p_msgs, p_headers);
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
BEGIN
    IF r_dynamic THEN
        SELECT * INTO r_queue FROM pgbroker._queue(p_queue_name);
        IF NOT FOUND THEN
            PERFORM pgbroker._table(p_queue_name);
        END IF;
    END IF;
    IF p_vt IS NULL OR p_vt < 0 OR p_qty IS NULL OR p_qty < 0 THEN
        PERFORM pgbroker._check_read_args(p_vt, p_qty);
    END IF;
    IF r_dynamic THEN
        r_from := r_queue.ready_from;
        r_name := r_queue.stored_name;
        r_max_deliveries := r_queue.max_deliveries;
    ELSE
        r_name := (%4$L::text[])[r];
        r_from := pgbroker._route_ready_from(r_name);
        r_max_deliveries := (%5$L::integer[])[r];
    END IF;
    IF %6$L AND r_max_deliveries IS NOT NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._deliver(r_name, r_from, r_max_deliveries, p_vt, p_qty,
                                                     p_conditional);
        RETURN;
    END IF;
    IF r_dynamic THEN
        RETURN QUERY EXECUTE pgbroker._run_read(r_name, r_from, p_vt, p_qty, p_conditional, %6$L);
        RETURN;
    END IF;
    r_clock := clock_timestamp();
%7$s
END;
$F$
$R$, op, CASE op WHEN 'read' THEN 'pgmq.message_record' ELSE 'pgbroker.delivery' END,
     keys, names, max_deliveries, op = 'deliver',
     CASE op WHEN 'read' THEN pgbroker._route_tree(read_bodies, 1, cardinality(read_bodies))
             ELSE pgbroker._route_tree(deliver_bodies, 1, cardinality(deliver_bodies)) END);
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
            PERFORM pgbroker._table(p_queue_name);
        END IF;
        r_name := r_queue.stored_name;
    ELSE
        r_name := (%2$L::text[])[r];
    END IF;
    IF p_qty IS NULL OR p_qty < 0 THEN
        PERFORM pgbroker._check_read_args(0, p_qty);
    END IF;
    r_from := pgbroker._route_ready_from(r_name);
    IF r IS NULL THEN
        RETURN QUERY EXECUTE format('EXECUTE %%I(%%s, NULL, %%L, NULL, %%s)',
                                    pgbroker._prepared(lower('q_' || r_name), 'pop'), p_qty,
                                    clock_timestamp(), r_from);
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

-- Where a routed read starts, moving it up now and then (as 0012's
-- _run_read does).
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

SELECT pgbroker._write_routes();

------------------------------------------------------------------------------
-- The entry points, through the routes
------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgbroker._send_many(queue_name text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers, delay);
END;
$$;

-- 0012's _send_sql is replaced by the send route.
DROP FUNCTION pgbroker._send_sql(text, jsonb[], jsonb[], timestamptz);

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB, delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], ARRAY[headers],
                                                    pgbroker._check_delay_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], NULL, NULL);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], ARRAY[headers], NULL);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], NULL,
                                                    pgbroker._delay_to_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], NULL,
                                                    pgbroker._check_delay_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB, delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], ARRAY[headers],
                                                    pgbroker._delay_to_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[],
                                           delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers, pgbroker._check_delay_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, NULL, NULL);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers, NULL);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, NULL, pgbroker._delay_to_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, NULL, pgbroker._check_delay_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[], delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers, pgbroker._delay_to_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.read(queue_name TEXT, vt INTEGER, qty INTEGER, conditional JSONB DEFAULT '{}')
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_read(queue_name, vt, qty, conditional);
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.read(queue_name text, vt integer, qty integer, conditional jsonb DEFAULT '{}')
RETURNS SETOF pgbroker.delivery LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_deliver(queue_name, vt, qty, conditional);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.pop(queue_name TEXT, qty INTEGER DEFAULT 1)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_pop(queue_name, qty);
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.ack(queue_name text, receipts text[], archive boolean DEFAULT true)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_ack(queue_name, receipts, archive, false);
END;
$$;

-- As in 0012: ack the receipts (archive NULL: the queue policy's ack_mode),
-- then read. Errors in 0012's order: the queue, the read arguments, the
-- receipts.
CREATE OR REPLACE FUNCTION pgbroker.consume(queue_name text, vt integer, qty integer,
                                            receipts text[] DEFAULT NULL, archive boolean DEFAULT NULL)
RETURNS SETOF pgbroker.delivery LANGUAGE plpgsql AS $$
BEGIN
    IF vt IS NULL OR vt < 0 OR qty IS NULL OR qty < 0 THEN
        PERFORM pgbroker._table(queue_name);
        PERFORM pgbroker._check_read_args(vt, qty);
    END IF;
    IF cardinality(receipts) > 0 THEN
        PERFORM pgbroker._route_ack(queue_name, receipts, archive, true);
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_deliver(queue_name, vt, qty, '{}');
END;
$$;
