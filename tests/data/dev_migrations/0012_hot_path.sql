-- pgbroker migration 0012: the hot path. Reads, pops and acks without
-- per-call planning, sends with less around them, pgbroker.consume (ack the
-- last batch and read the next in one call, one transaction, one commit), and
-- reads that start past the dead entries of consumed messages.
--
-- Queue tables have a name per queue, so the engine's statements are dynamic
-- SQL, and PL/pgSQL's EXECUTE plans a dynamic statement on every call: for a
-- read of 10, planning its CTE cost more than running it. Here the read, pop
-- and ack statements are made session-level prepared statements the first time a
-- backend runs it for a queue (PREPARE, named pgb_<op>_<table>), and later
-- calls run it with EXECUTE: parsed, analysed and planned once per backend
-- and queue. pgbroker._statement(qtable, op) writes every such statement, so
-- its text is defined once; the visibility rule is still
-- pgbroker._visible_sql's.
--
--   * The check for an existing statement reads pg_prepared_statements, so a
--     DEALLOCATE ALL or DISCARD ALL (connection poolers) only costs a new
--     PREPARE.
--   * A prepared statement is re-analysed by the server when a table it uses
--     is dropped or altered, so a queue dropped and created again under the
--     same name (even as a partitioned queue) is found again; a dropped queue
--     still fails with PB002, since every call probes pgmq.meta first.
--   * Parameters of EXECUTE can only be values written into its text, so
--     values travel as literals (format %L); their text forms round-trip
--     exactly (jsonb, timestamptz, integers).
--   * The functions run with plan_cache_mode = force_generic_plan: with
--     LIMIT $n, the server would otherwise judge the generic plan dearer than
--     a custom one (it guesses 10% of the table for the limit) and replan on
--     every call, which is what this migration is for avoiding. The generic
--     plans are the custom ones (ready and timed index scans, primary-key
--     probes): tests/integration/test_query_plans.py checks them.
--   * Each hot function makes one probe of pgmq.meta joined with the queue's
--     policy (a static statement, cached too), instead of _table, policy(),
--     and _check_depth's probes; argument checks are inline and only call the
--     old checking functions to raise their exact errors.
--
-- Where reads start (pgbroker.queue_head). Every delivered, acked or popped
-- message leaves a dead entry at the low end of the ready index until VACUUM
-- removes it, and every read walked them all from the start: after 100,000
-- messages consumed, ~300 index pages a read. Reads now start at
-- queue_head.ready_from, a msg_id below which no message can be ready, and
-- now and then (one read in sixteen) a reader moves it up. Sends take no lock
-- for this; the bound is safe in two steps:
--   1. An advance records a candidate: the queue sequence's last value V and
--      the xmax of a snapshot taken after reading it. A send takes its
--      transaction id before its msg_ids (pgbroker._send_many), so every
--      msg_id <= V belongs to a transaction older than that xmax.
--   2. A later advance, once every transaction older than that xmax has
--      ended (the snapshot's xmin has passed it), sees every message <= V
--      that will ever exist; ready_from becomes the first ready one in
--      [ready_from, V], or V + 1. Then it records a new candidate.
-- Only one transaction advances a queue at a time (a try-lock: the others
-- skip it), only in READ COMMITTED, and the update is conditional on the old
-- value, so a concurrent lowering wins. pgmq.set_vt, the only call that can
-- make an older message ready again (a delayed, never-read message given a
-- vt at or before its enqueued_at), lowers ready_from. Not covered: rows
-- inserted into a queue table by hand while readers run, and queue
-- sequences given a CACHE above 1.
--
-- Behaviour (results, order, errors and their order) is exactly that of the
-- functions replaced; only pgbroker.consume is new.

CREATE TABLE pgbroker.queue_head (
    queue_name varchar PRIMARY KEY
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    -- no ready message has a smaller msg_id
    ready_from bigint NOT NULL,
    -- the candidate of the next advance: msg_ids up to next_from were taken by
    -- transactions older than next_xmax
    next_from bigint,
    next_xmax xid8
) WITH (fillfactor = 10);  -- pruned on almost every visit: reads never walk long update chains

-- The text of a queue's hot statement, as PREPARE <name>(types) AS <query>.
--   read / read_c      pgmq.read's rows (read_c: with a conditional, $2)
--   deliver / deliver_c pgbroker.read's rows (the receipt appended)
--   pop                pgmq.pop
--   ack_a / ack_d      pgbroker.ack (archive / delete)
-- Parameters follow pgbroker._visible_sql: $1 qty, $2 conditional, $3 the
-- reader's clock; then $4 the visibility timeout (reads) and $5 the queue's
-- ready_from. ack: $1 msg_ids, $2 read_cts, $3 leases.
CREATE FUNCTION pgbroker._statement_name(qtable text, op text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 'pgb_' || op || '_' || qtable;
$$;

-- pgbroker._visible_sql with the ready scan starting at $5.
CREATE FUNCTION pgbroker._visible_from_sql(qtable text, conditional jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    ready_rule constant text := 'WHERE read_ct = 0 AND vt <= enqueued_at ';
    visible text := pgbroker._visible_sql(qtable, conditional);
BEGIN
    IF strpos(visible, ready_rule) = 0 THEN
        RAISE EXCEPTION 'pgbroker._visible_sql no longer has the ready rule this function extends';
    END IF;
    RETURN replace(visible, ready_rule, ready_rule || 'AND msg_id >= $5 ');
END;
$$;

CREATE FUNCTION pgbroker._statement(qtable text, op text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    name text := pgbroker._statement_name(qtable, op);
    atable text := 'a' || substr(qtable, 2);
    columns text := 'q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message, q.headers';
BEGIN
    IF op IN ('read', 'read_c', 'deliver', 'deliver_c') THEN
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
            SELECT *%5$s FROM leased ORDER BY msg_id
            $Q$,
            name,
            pgbroker._visible_from_sql(qtable, CASE WHEN op LIKE '%_c' THEN '{"c": 1}'::jsonb END),
            qtable, columns,
            CASE WHEN op LIKE 'deliver%' THEN ', pgbroker.receipt(msg_id, read_ct, vt)' ELSE '' END);
    ELSIF op = 'pop' THEN
        RETURN format(
            $Q$
            PREPARE %1$I (integer, jsonb, timestamptz, integer, bigint) AS
            WITH %2$s,
            popped AS (
                DELETE FROM pgmq.%3$I q USING picked WHERE q.msg_id = picked.msg_id
                RETURNING %4$s
            )
            SELECT * FROM popped ORDER BY msg_id
            $Q$, name, pgbroker._visible_from_sql(qtable, NULL), qtable, columns);
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

-- The statement's name, prepared in this session if it was not yet.
CREATE FUNCTION pgbroker._prepared(qtable text, op text)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    stmt text := pgbroker._statement_name(qtable, op);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_prepared_statements s WHERE s.name = stmt) THEN
        EXECUTE pgbroker._statement(qtable, op);
    END IF;
    RETURN stmt;
END;
$$;

-- A queue's stored name and the policy settings the hot path needs, in one
-- probe; no row when the queue does not exist.
CREATE FUNCTION pgbroker._queue(queue_name text,
    OUT stored_name text, OUT max_deliveries integer, OUT max_depth bigint, OUT ack_mode text,
    OUT ready_from bigint)
RETURNS SETOF record LANGUAGE sql STABLE AS $$
    SELECT m.queue_name, p.max_deliveries, p.max_depth, p.ack_mode, coalesce(h.ready_from, 0)
    FROM pgmq.meta m
    LEFT JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
    LEFT JOIN pgbroker.queue_head h ON h.queue_name = m.queue_name
    WHERE lower(m.queue_name) = lower($1);
$$;

-- Move a queue's ready_from up (see the header); a no-op unless this
-- transaction is the one advancing it now.
CREATE FUNCTION pgbroker._advance_head(stored_name text, qtable text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    h pgbroker.queue_head;
    seq text;
    first_ready bigint;
    new_from bigint;
    top bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_try_advisory_xact_lock(hashtext('pgbroker.head:' || qtable)) THEN
        RETURN;
    END IF;
    SELECT * INTO h FROM pgbroker.queue_head qh WHERE qh.queue_name = stored_name;
    IF NOT FOUND THEN
        INSERT INTO pgbroker.queue_head (queue_name, ready_from) VALUES (stored_name, 0)
        ON CONFLICT DO NOTHING;
        h.ready_from := 0;
    END IF;
    new_from := h.ready_from;
    IF h.next_xmax IS NOT NULL THEN
        IF pg_snapshot_xmin(pg_current_snapshot()) < h.next_xmax THEN
            RETURN;  -- a transaction that may hold a msg_id <= next_from is still running
        END IF;
        EXECUTE format('SELECT min(msg_id) FROM pgmq.%I'
                       ' WHERE read_ct = 0 AND vt <= enqueued_at AND msg_id >= $1 AND msg_id <= $2', qtable)
            INTO first_ready USING h.ready_from, h.next_from;
        new_from := greatest(h.ready_from, coalesce(first_ready, h.next_from + 1));
    END IF;
    seq := pg_get_serial_sequence(format('pgmq.%I', qtable), 'msg_id');
    IF seq IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format('SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM %s', seq)
        INTO top;
    -- A new statement, so its snapshot is taken after the sequence was read.
    UPDATE pgbroker.queue_head qh
    SET ready_from = new_from, next_from = top, next_xmax = pg_snapshot_xmax(pg_current_snapshot())
    WHERE qh.queue_name = stored_name AND qh.ready_from = h.ready_from;
END;
$$;

------------------------------------------------------------------------------
-- Reads
------------------------------------------------------------------------------

-- The read statement of a queue, run: pgmq.read's rows (deliver: with
-- receipts). The caller has checked the queue and the arguments.
CREATE FUNCTION pgbroker._run_read(stored_name text, ready_from bigint, vt integer, qty integer,
                                   conditional jsonb, deliver boolean)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    qtable text := lower('q_' || stored_name);
    op text := CASE WHEN deliver THEN 'deliver' ELSE 'read' END
               || CASE WHEN conditional IS NULL OR conditional = '{}'::jsonb THEN '' ELSE '_c' END;
    stmt text := pgbroker._statement_name(qtable, op);
BEGIN
    IF random() < 0.0625 THEN
        PERFORM pgbroker._advance_head(stored_name, qtable);
    END IF;
    -- pgbroker._prepared, inline: this is every read's path.
    IF NOT EXISTS (SELECT 1 FROM pg_prepared_statements s WHERE s.name = stmt) THEN
        EXECUTE pgbroker._statement(qtable, op);
    END IF;
    RETURN format('EXECUTE %I(%s, %L, %L, %s, %s)', stmt, qty, conditional, clock_timestamp(), vt, ready_from);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.read(queue_name TEXT, vt INTEGER, qty INTEGER, conditional JSONB DEFAULT '{}')
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    q record;
BEGIN
    SELECT * INTO q FROM pgbroker._queue(queue_name);
    IF NOT FOUND THEN
        PERFORM pgbroker._table(queue_name);  -- PB001/PB002, naming the problem
    END IF;
    IF vt IS NULL OR vt < 0 OR qty IS NULL OR qty < 0 THEN
        PERFORM pgbroker._check_read_args(vt, qty);
    END IF;
    RETURN QUERY EXECUTE pgbroker._run_read(q.stored_name, q.ready_from, vt, qty, conditional, false);
END;
$$;

-- As in 0008: a read with receipts that dead-letters messages past
-- max_deliveries instead of delivering them.
CREATE OR REPLACE FUNCTION pgbroker.read(queue_name text, vt integer, qty integer, conditional jsonb DEFAULT '{}')
RETURNS SETOF pgbroker.delivery LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    q record;
BEGIN
    SELECT * INTO q FROM pgbroker._queue(queue_name);
    IF NOT FOUND THEN
        PERFORM pgbroker._table(queue_name);
    END IF;
    IF vt IS NULL OR vt < 0 OR qty IS NULL OR qty < 0 THEN
        PERFORM pgbroker._check_read_args(vt, qty);
    END IF;
    IF q.max_deliveries IS NULL THEN
        RETURN QUERY EXECUTE pgbroker._run_read(q.stored_name, q.ready_from, vt, qty, conditional, true);
    ELSE
        RETURN QUERY SELECT * FROM pgbroker._deliver(q.stored_name, q.ready_from, q.max_deliveries, vt, qty,
                                                     conditional);
    END IF;
END;
$$;

-- Read and deliver for a queue with max_deliveries (pgbroker.read's body once
-- the queue and arguments are checked; without max_deliveries the callers run
-- the read statement themselves).
CREATE FUNCTION pgbroker._deliver(stored_name text, ready_from bigint, max_deliveries integer, vt integer,
                                  qty integer, conditional jsonb)
RETURNS SETOF pgbroker.delivery LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    statement text := pgbroker._run_read(stored_name, ready_from, vt, qty, conditional, true);
    d pgbroker.delivery;
    batch pgbroker.delivery[] := '{}';
    over bigint[];
BEGIN
    -- The statement returns its rows in msg_id order.
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

CREATE OR REPLACE FUNCTION pgmq.pop(queue_name TEXT, qty INTEGER DEFAULT 1)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    q record;
    qtable text;
BEGIN
    SELECT * INTO q FROM pgbroker._queue(queue_name);
    IF NOT FOUND THEN
        PERFORM pgbroker._table(queue_name);
    END IF;
    IF qty IS NULL OR qty < 0 THEN
        PERFORM pgbroker._check_read_args(0, qty);
    END IF;
    qtable := lower('q_' || queue_name);
    IF random() < 0.0625 THEN
        PERFORM pgbroker._advance_head(q.stored_name, qtable);
    END IF;
    RETURN QUERY EXECUTE format('EXECUTE %I(%s, NULL, %L, NULL, %s)', pgbroker._prepared(qtable, 'pop'), qty,
                                clock_timestamp(), q.ready_from);
END;
$$;

------------------------------------------------------------------------------
-- Sends
------------------------------------------------------------------------------

-- As in 0008's _send_many, returning the statement that inserts the batch
-- instead of running it: run it with EXECUTE ... USING msgs, headers, delay.
-- Sends stay dynamic SQL: planning a plain INSERT costs about what running a
-- prepared one through EXECUTE does (55-60 us of backend CPU either way),
-- and the values then travel as parameters, never as literals to parse again.
CREATE FUNCTION pgbroker._send_sql(queue_name text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    qtable text := lower('q_' || queue_name);
    q record;
    max_size bigint;
BEGIN
    SELECT * INTO q FROM pgbroker._queue(queue_name);
    IF NOT FOUND THEN
        PERFORM pgbroker._table(queue_name);
    END IF;
    IF msgs IS NULL OR cardinality(msgs) = 0
       OR (headers IS NOT NULL AND cardinality(headers) <> cardinality(msgs)) THEN
        PERFORM pgbroker._check_batch(msgs, headers);
    END IF;
    -- A message's size counts its headers too: both are stored in its row.
    IF cardinality(msgs) = 1 THEN
        max_size := pg_column_size(msgs[1]) + coalesce(pg_column_size(headers[1]), 0);
    ELSE
        SELECT max(pg_column_size(m.msg) + coalesce(pg_column_size(m.hdr), 0)) INTO max_size
        FROM unnest(msgs, headers) AS m(msg, hdr);
    END IF;
    -- Without pgbroker.max_message_bytes the limit is 1 MiB (pgbroker._check_message_size).
    IF max_size > 1048576 OR coalesce(current_setting('pgbroker.max_message_bytes', true), '') <> '' THEN
        PERFORM pgbroker._check_message_size(max_size);
    END IF;
    IF q.max_depth IS NOT NULL THEN
        PERFORM pgbroker._check_depth(queue_name, qtable, cardinality(msgs));
    END IF;
    -- The transaction id before the msg_ids: queue_head's advances rely on it.
    PERFORM pg_current_xact_id();
    IF cardinality(msgs) = 1 THEN
        RETURN format('INSERT INTO pgmq.%I (vt, message, headers) VALUES (coalesce($3, now()), $1[1], $2[1])'
                      ' RETURNING msg_id', qtable);
    END IF;
    RETURN format(
        $Q$
        INSERT INTO pgmq.%I (vt, message, headers)
        SELECT coalesce($3, now()), m.msg, m.hdr
        FROM unnest($1, $2) WITH ORDINALITY AS m(msg, hdr, n)
        ORDER BY m.n
        RETURNING msg_id
        $Q$, qtable);
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker._send_many(queue_name text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE pgbroker._send_sql(queue_name, msgs, headers, delay) USING msgs, headers, delay;
END;
$$;

-- Every send and send_batch form, as in 0001, in PL/pgSQL rather than SQL:
-- a SQL function that is not inlined is planned again on every call. The
-- delay is worked out first, as the SQL forms evaluated it as an argument.

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB, delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    m jsonb[] := ARRAY[msg];
    h jsonb[] := ARRAY[headers];
    d timestamptz := pgbroker._check_delay_time(delay);
BEGIN
    RETURN QUERY EXECUTE pgbroker._send_sql(queue_name, m, h, d) USING m, h, d;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    m jsonb[] := ARRAY[msg];
    h jsonb[] := NULL;
    d timestamptz := NULL;
BEGIN
    RETURN QUERY EXECUTE pgbroker._send_sql(queue_name, m, h, d) USING m, h, d;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    m jsonb[] := ARRAY[msg];
    h jsonb[] := ARRAY[headers];
    d timestamptz := NULL;
BEGIN
    RETURN QUERY EXECUTE pgbroker._send_sql(queue_name, m, h, d) USING m, h, d;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    m jsonb[] := ARRAY[msg];
    h jsonb[] := NULL;
    d timestamptz := pgbroker._delay_to_time(delay);
BEGIN
    RETURN QUERY EXECUTE pgbroker._send_sql(queue_name, m, h, d) USING m, h, d;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    m jsonb[] := ARRAY[msg];
    h jsonb[] := NULL;
    d timestamptz := pgbroker._check_delay_time(delay);
BEGIN
    RETURN QUERY EXECUTE pgbroker._send_sql(queue_name, m, h, d) USING m, h, d;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB, delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    m jsonb[] := ARRAY[msg];
    h jsonb[] := ARRAY[headers];
    d timestamptz := pgbroker._delay_to_time(delay);
BEGIN
    RETURN QUERY EXECUTE pgbroker._send_sql(queue_name, m, h, d) USING m, h, d;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[], delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    m jsonb[] := msgs;
    h jsonb[] := headers;
    d timestamptz := pgbroker._check_delay_time(delay);
BEGIN
    RETURN QUERY EXECUTE pgbroker._send_sql(queue_name, m, h, d) USING m, h, d;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    m jsonb[] := msgs;
    h jsonb[] := NULL;
    d timestamptz := NULL;
BEGIN
    RETURN QUERY EXECUTE pgbroker._send_sql(queue_name, m, h, d) USING m, h, d;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    m jsonb[] := msgs;
    h jsonb[] := headers;
    d timestamptz := NULL;
BEGIN
    RETURN QUERY EXECUTE pgbroker._send_sql(queue_name, m, h, d) USING m, h, d;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    m jsonb[] := msgs;
    h jsonb[] := NULL;
    d timestamptz := pgbroker._delay_to_time(delay);
BEGIN
    RETURN QUERY EXECUTE pgbroker._send_sql(queue_name, m, h, d) USING m, h, d;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    m jsonb[] := msgs;
    h jsonb[] := NULL;
    d timestamptz := pgbroker._check_delay_time(delay);
BEGIN
    RETURN QUERY EXECUTE pgbroker._send_sql(queue_name, m, h, d) USING m, h, d;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[], delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    m jsonb[] := msgs;
    h jsonb[] := headers;
    d timestamptz := pgbroker._delay_to_time(delay);
BEGIN
    RETURN QUERY EXECUTE pgbroker._send_sql(queue_name, m, h, d) USING m, h, d;
END;
$$;

------------------------------------------------------------------------------
-- Fenced acks
------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgbroker.ack(queue_name text, receipts text[], archive boolean DEFAULT true)
RETURNS SETOF bigint LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    held record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgbroker._queue(queue_name)) THEN
        PERFORM pgbroker._table(queue_name);
    END IF;
    held := pgbroker._held(receipts);
    IF archive IS NULL THEN
        PERFORM pgbroker._check_arg(false, 'archive must be true or false, got NULL');
    END IF;
    RETURN QUERY EXECUTE pgbroker._run_ack(lower('q_' || queue_name), held.msg_ids, held.read_cts,
                                           held.leases, archive);
END;
$$;

CREATE FUNCTION pgbroker._run_ack(qtable text, msg_ids bigint[], read_cts integer[], leases bigint[],
                                  archive boolean)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    op text := CASE WHEN archive THEN 'ack_a' ELSE 'ack_d' END;
    stmt text := pgbroker._statement_name(qtable, op);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_prepared_statements s WHERE s.name = stmt) THEN
        EXECUTE pgbroker._statement(qtable, op);
    END IF;
    RETURN format('EXECUTE %I(%L, %L, %L)', stmt, msg_ids, read_cts, leases);
END;
$$;

------------------------------------------------------------------------------
-- Consume: ack the previous batch, read the next, in one call
------------------------------------------------------------------------------

-- The consumer's loop in one statement: acknowledge the receipts of the batch
-- just processed (as pgbroker.ack does: fenced, stale receipts skipped and
-- changing nothing; archive NULL follows the queue policy's ack_mode, as
-- pgbroker.complete) and read the next batch (as pgbroker.read does). One
-- round trip and one commit a batch instead of two. With no receipts it is a
-- read. Use pgbroker.ack when you need to know which receipts held.
CREATE FUNCTION pgbroker.consume(queue_name text, vt integer, qty integer,
                                 receipts text[] DEFAULT NULL, archive boolean DEFAULT NULL)
RETURNS SETOF pgbroker.delivery LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    q record;
    qtable text;
    held record;
BEGIN
    SELECT * INTO q FROM pgbroker._queue(queue_name);
    IF NOT FOUND THEN
        PERFORM pgbroker._table(queue_name);
    END IF;
    IF vt IS NULL OR vt < 0 OR qty IS NULL OR qty < 0 THEN
        PERFORM pgbroker._check_read_args(vt, qty);
    END IF;
    qtable := lower('q_' || queue_name);
    IF cardinality(receipts) > 0 THEN
        held := pgbroker._held(receipts);
        EXECUTE pgbroker._run_ack(qtable, held.msg_ids, held.read_cts, held.leases,
                                  coalesce(archive, coalesce(q.ack_mode, 'archive') = 'archive'));
    END IF;
    IF q.max_deliveries IS NULL THEN
        RETURN QUERY EXECUTE pgbroker._run_read(q.stored_name, q.ready_from, vt, qty, '{}'::jsonb, true);
    ELSE
        RETURN QUERY SELECT * FROM pgbroker._deliver(q.stored_name, q.ready_from, q.max_deliveries, vt, qty,
                                                     '{}'::jsonb);
    END IF;
END;
$$;

------------------------------------------------------------------------------
-- set_vt: as in 0001, and a message it makes ready again lowers ready_from
------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name TEXT, msg_ids BIGINT[], vt TIMESTAMP WITH TIME ZONE)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
    changed pgmq.message_record[];
    lowest bigint;
BEGIN
    PERFORM pgbroker._check_arg(vt IS NOT NULL, 'vt must be a timestamp, got NULL');
    EXECUTE format(
        $Q$
        WITH changed AS (
            UPDATE pgmq.%I SET vt = $2 WHERE msg_id = ANY($1)
            RETURNING msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers
        )
        SELECT coalesce(array_agg(c ORDER BY c.msg_id), '{}') FROM changed c
        $Q$, qtable)
    INTO changed USING msg_ids, vt;
    SELECT min(c.msg_id) INTO lowest FROM unnest(changed) c WHERE c.read_ct = 0 AND c.vt <= c.enqueued_at;
    IF lowest IS NOT NULL THEN
        UPDATE pgbroker.queue_head h SET ready_from = lowest
        WHERE h.queue_name = pgbroker._stored_name(set_vt.queue_name) AND h.ready_from > lowest;
    END IF;
    RETURN QUERY SELECT * FROM unnest(changed);
END;
$$;

------------------------------------------------------------------------------
-- Receipts: as in 0002, checked and split in one statement instead of two
------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgbroker._held(receipts text[], OUT msg_ids bigint[], OUT read_cts integer[],
                                          OUT leases bigint[])
LANGUAGE plpgsql STABLE AS $$
DECLARE
    all_ok boolean;
    bad text;
BEGIN
    -- Each receipt is checked once (OFFSET 0 keeps the check from being inlined
    -- into every use) and split only when it passed, so a malformed one never
    -- reaches a cast.
    SELECT coalesce(bool_and(c.ok), true),
           coalesce(array_agg(CASE WHEN c.ok THEN split_part(c.r, ':', 1)::bigint END), '{}'),
           coalesce(array_agg(CASE WHEN c.ok THEN split_part(c.r, ':', 2)::integer END), '{}'),
           coalesce(array_agg(CASE WHEN c.ok THEN split_part(c.r, ':', 3)::bigint END), '{}')
    INTO all_ok, msg_ids, read_cts, leases
    FROM (SELECT r, pgbroker._receipt_ok(r) IS TRUE AS ok FROM unnest(receipts) r OFFSET 0) c;
    IF NOT all_ok THEN
        SELECT r INTO bad FROM unnest(receipts) r WHERE pgbroker._receipt_ok(r) IS NOT TRUE LIMIT 1;
        PERFORM pgbroker._parse_receipt(bad);  -- raises PB007 naming it
    END IF;
END;
$$;

-- The least-privilege roles (pgbroker install --roles): consume is a consumer's call.
INSERT INTO pgbroker.role_function (role_kind, function_schema, function_name)
VALUES ('consumer', 'pgbroker', 'consume');
