-- Acks: what ends or changes a delivery.
--
-- pgmq's delete, archive and set_vt act on msg_ids, whoever holds the
-- message (unfenced, as in pgmq). pgbroker's ack, nack and extend act on
-- receipts (40_receipts.sql) and only while the receipt still holds: a stale
-- receipt is skipped in the batch forms and fails with PB003 in the single
-- ones. An ack archives (the default) or deletes; pgbroker.complete and
-- pgbroker.consume follow the queue policy's ack_mode instead.

------------------------------------------------------------------------------
-- Unfenced, as in pgmq
------------------------------------------------------------------------------

-- Delete messages by msg_id, whoever holds them (unfenced, as in pgmq).
-- Returns: the msg_ids deleted (the array form), or whether it was (the single one).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.delete(queue_name TEXT, msg_ids BIGINT[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_remove(queue_name, msg_ids, false);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.delete(queue_name TEXT, msg_id BIGINT)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    RETURN EXISTS (SELECT 1 FROM pgbroker._route_remove(queue_name, ARRAY[msg_id], false));
END;
$$;

-- Move messages into the queue's archive, keeping their msg_ids.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.archive(queue_name TEXT, msg_ids BIGINT[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_remove(queue_name, msg_ids, true);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.archive(queue_name TEXT, msg_id BIGINT)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    RETURN EXISTS (SELECT 1 FROM pgbroker._route_remove(queue_name, ARRAY[msg_id], true));
END;
$$;

-- Set the messages' visibility time, whatever it was; returns them. As the
-- only writer of an arbitrary vt, it keeps queue_head's bounds
-- (50_reads.sql) below what it writes: a message it makes ready again
-- lowers ready_from, and one it leaves timed lowers timed_from.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name TEXT, msg_ids BIGINT[], vt TIMESTAMP WITH TIME ZONE)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    qtable text := pgbroker._pgmq_table(queue_name);
    changed pgmq.message_record[];
    lowest bigint;
    stored text;
BEGIN
    -- Any vt, as pgmq: NULL fails on a message found (23502), not on none.
    EXECUTE format(
        $Q$
        WITH changed AS (
            UPDATE pgmq.%I SET vt = $2 WHERE msg_id = ANY($1)
            RETURNING msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers
        )
        SELECT coalesce(array_agg(c ORDER BY c.msg_id), '{}') FROM changed c
        $Q$, qtable)
    INTO changed USING msg_ids, vt;
    stored := pgbroker._stored_name(set_vt.queue_name);
    SELECT min(c.msg_id) INTO lowest FROM unnest(changed) c WHERE c.read_ct = 0 AND c.vt <= c.enqueued_at;
    IF lowest IS NOT NULL THEN
        PERFORM pgbroker._lower_head(stored, lowest, NULL);
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(changed) c WHERE NOT (c.read_ct = 0 AND c.vt <= c.enqueued_at)) THEN
        PERFORM pgbroker._lower_timed_from(stored, vt);
    END IF;
    RETURN QUERY SELECT * FROM unnest(changed);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name TEXT, msg_ids BIGINT[], vt INTEGER)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    RETURN QUERY SELECT * FROM pgmq.set_vt(queue_name, msg_ids, clock_timestamp() + make_interval(secs => vt));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name TEXT, msg_id BIGINT, vt TIMESTAMP WITH TIME ZONE)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgmq.set_vt(queue_name, ARRAY[msg_id], vt);
$$;

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name TEXT, msg_id BIGINT, vt INTEGER)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgmq.set_vt(queue_name, ARRAY[msg_id], vt);
$$;

------------------------------------------------------------------------------
-- Fenced, by receipt
------------------------------------------------------------------------------

-- Ack deliveries by their receipts: archive the messages (the default) or
-- delete them, through the ack route (90_routes.sql).
-- Arguments: receipts (or receipt): what the read returned; archive: false
--   to delete.
-- Returns: the msg_ids acked. The batch form skips stale receipts, which
--   change nothing.
-- Errors: PB003 from the single form when its receipt no longer holds.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.ack(queue_name text, receipts text[], archive boolean DEFAULT true)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_ack(queue_name, receipts, archive, false);
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.ack(queue_name text, receipt text, archive boolean DEFAULT true)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    acked bigint;
BEGIN
    SELECT a INTO acked FROM pgbroker.ack(queue_name, ARRAY[receipt], archive) a;
    IF acked IS NULL THEN
        PERFORM pgbroker._raise_stale(queue_name, receipt);
    END IF;
    RETURN acked;
END;
$$;

-- The ack statement of a queue the routes do not hold, as the text to run
-- (pgbroker._statement_call, 50_reads.sql).
CREATE OR REPLACE FUNCTION pgbroker._run_ack(qtable text, msg_ids bigint[], read_cts integer[], leases bigint[],
                                  archive boolean)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgbroker._statement_call(qtable, CASE WHEN archive THEN 'ack_a' ELSE 'ack_d' END,
                                    quote_nullable(msg_ids), quote_nullable(read_cts), quote_nullable(leases));
END;
$$;

-- Nack deliveries: make the messages visible again after delay seconds.
-- Arguments: receipts (or receipt): what the read returned; delay: seconds,
--   >= 0.
-- Returns: the msg_ids whose receipts still held (the batch form skips the
--   others); the single form, its msg_id.
-- Errors: PB007 on a NULL or negative delay; PB003 from the single form when
--   its receipt no longer holds.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.nack(queue_name text, receipts text[], delay integer DEFAULT 0)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    qtable text := pgbroker._table(queue_name);
    held record := pgbroker._held(receipts);
BEGIN
    PERFORM pgbroker._check_arg(delay IS NOT NULL AND delay >= 0,
        format('delay must be a number of seconds >= 0, got %s', coalesce(delay::text, 'NULL')));
    RETURN QUERY EXECUTE format(
        $Q$
        WITH released AS (
            UPDATE pgmq.%I q SET vt = clock_timestamp() + make_interval(secs => $4)
            WHERE q.msg_id = ANY($1)
              AND (q.msg_id, q.read_ct, pgbroker._micros(q.vt)) IN (SELECT * FROM unnest($1, $2, $3))
              AND q.vt > clock_timestamp()
            RETURNING q.msg_id
        )
        SELECT msg_id FROM released ORDER BY msg_id
        $Q$, qtable)
    USING held.msg_ids, held.read_cts, held.leases, delay;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.nack(queue_name text, receipt text, delay integer DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    released bigint;
BEGIN
    SELECT n INTO released FROM pgbroker.nack(queue_name, ARRAY[receipt], delay) n;
    IF released IS NULL THEN
        PERFORM pgbroker._raise_stale(queue_name, receipt);
    END IF;
    RETURN released;
END;
$$;

-- Extend leases: each now ends vt seconds from now.
-- Arguments: receipts (or receipt): what the read returned; vt: seconds, >= 0.
-- Returns: a new receipt for each message whose receipt still held (the
--   batch form skips the others); the single form, the new receipt.
-- Errors: PB007 on a NULL or negative vt; PB003 from the single form when its
--   receipt no longer holds.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.extend(queue_name text, receipts text[], vt integer)
RETURNS TABLE (msg_id bigint, receipt text) LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    qtable text := pgbroker._table(queue_name);
    held record := pgbroker._held(receipts);
BEGIN
    PERFORM pgbroker._check_arg(vt IS NOT NULL AND vt >= 0,
        format('vt must be a number of seconds >= 0, got %s', coalesce(vt::text, 'NULL')));
    RETURN QUERY EXECUTE format(
        $Q$
        WITH extended AS (
            UPDATE pgmq.%I q SET vt = clock_timestamp() + make_interval(secs => $4)
            WHERE q.msg_id = ANY($1)
              AND (q.msg_id, q.read_ct, pgbroker._micros(q.vt)) IN (SELECT * FROM unnest($1, $2, $3))
              AND q.vt > clock_timestamp()
            RETURNING q.msg_id, q.read_ct, q.vt
        )
        SELECT msg_id, pgbroker.receipt(msg_id, read_ct, vt) FROM extended ORDER BY msg_id
        $Q$, qtable)
    USING held.msg_ids, held.read_cts, held.leases, vt;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.extend(queue_name text, receipt text, vt integer)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    renewed text;
BEGIN
    SELECT e.receipt INTO renewed FROM pgbroker.extend(queue_name, ARRAY[receipt], vt) e;
    IF renewed IS NULL THEN
        PERFORM pgbroker._raise_stale(queue_name, receipt);
    END IF;
    RETURN renewed;
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
-- read. Use pgbroker.ack when you need to know which receipts held. Errors
-- come in this order: the queue, the read arguments, the receipts.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.consume(queue_name text, vt integer, qty integer,
                                 receipts text[] DEFAULT NULL, archive boolean DEFAULT NULL)
RETURNS SETOF pgbroker.delivery LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
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

------------------------------------------------------------------------------
-- Acknowledging by policy
------------------------------------------------------------------------------

-- Ack many with the policy's ack_mode (archive or delete); returns the
-- msg_ids whose receipts still held, as pgbroker.ack does.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.complete(queue_name text, receipts text[])
RETURNS SETOF bigint LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT pgbroker.ack(queue_name, receipts, (pgbroker.policy(queue_name)).ack_mode = 'archive');
$$;
