-- pgbroker migration 0018: the functions of schema pgmq take every argument
-- pgmq 1.13 takes, with pgmq's outcome (docs/compatibility.md; this was D1).
--
-- Until now a negative or NULL vt or delay, a NULL qty, a negative
-- max_poll_seconds or a poll_interval_ms <= 0 was refused with PB007 in
-- pgmq.read, read_with_poll, pop, send, send_batch, set_vt and the grouped
-- reads and their poll forms, where pgmq computes a vt in the past, reads or
-- pops without a limit, returns at once or polls without sleeping, or fails
-- with the NOT NULL violation of column vt (23502) on the first row it
-- writes. The pgmq functions now do what pgmq does: such calls take paths of
-- their own (the hot path only tests the arguments), which scan as pgmq
-- scans, and a read that leases into the past lowers queue_head's timed
-- bound first, as set_vt does. pgbroker's own functions (pgbroker.read,
-- read_with_poll, consume, nack, extend, peek) and the Python clients still
-- refuse such values with PB007 (InvalidArgument).

-- pgmq's integer delay as a visibility time (its sends take what they are
-- given, 0018): none for 0 (ready at once, as pgbroker._delay_to_time), a time
-- in the past for a negative delay (visible at once), NULL for NULL (which the
-- callers send through pgbroker._pgmq_send_without_vt first).
CREATE FUNCTION pgbroker._pgmq_delay_to_time(delay integer)
RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF delay = 0 THEN
        RETURN NULL;
    END IF;
    RETURN clock_timestamp() + make_interval(secs => delay);
END;
$$;

-- A send of schema pgmq given a NULL delay (0018): it fails as pgmq's INSERT
-- fails, with the NOT NULL violation of column vt (23502), once the batch and
-- the queue have passed pgmq's checks. (The send route's NULL means "no
-- delay".) pgbroker's own functions and clients refuse it (PB007).
CREATE FUNCTION pgbroker._pgmq_send_without_vt(queue_name text, msgs jsonb[], headers jsonb[])
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._check_batch(msgs, headers);
    RETURN QUERY EXECUTE format(
        'INSERT INTO pgmq.%I (vt, message, headers)'
        ' SELECT NULL, m.msg, m.hdr FROM unnest($1, $2) AS m(msg, hdr) RETURNING msg_id',
        pgbroker._pgmq_table(queue_name))
    USING msgs, headers;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB, delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, ARRAY[msg], ARRAY[headers]);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], ARRAY[headers], delay);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, ARRAY[msg], NULL);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], NULL,
                                                    pgbroker._pgmq_delay_to_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, ARRAY[msg], NULL);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], NULL, delay);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB, delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, ARRAY[msg], ARRAY[headers]);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], ARRAY[headers],
                                                    pgbroker._pgmq_delay_to_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[],
                                delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, msgs, headers);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers, delay);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, msgs, NULL);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, NULL,
                                                    pgbroker._pgmq_delay_to_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, msgs, NULL);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, NULL, delay);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[], delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, msgs, headers);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers,
                                                    pgbroker._pgmq_delay_to_time(delay));
END;
$$;

-- pgmq.read for the arguments pgmq accepts and pgbroker's reads refuse (0018):
-- a negative or NULL vt, a NULL qty. They run as pgmq runs them: every row
-- with vt <= now, oldest first, up to qty (NULL: no limit), leased until now
-- + vt, so a negative vt leaves them visible at once and a NULL one fails on
-- the first row touched with the NOT NULL violation of column vt (23502);
-- nothing visible, nothing fails. The scan ignores the queue's bounds (these
-- calls are rare), and a lease that ends in the past lowers timed_from first,
-- as set_vt does, so the next read finds those messages at once. Rows come
-- in msg_id order, as every read's do here.
CREATE FUNCTION pgbroker._pgmq_read_as_given(queue_name text, vt integer, qty integer, conditional jsonb)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
    lease interval := make_interval(secs => vt);
BEGIN
    IF vt < 0 THEN
        PERFORM pgbroker._lower_timed_from(pgbroker._stored_name(queue_name), clock_timestamp() + lease);
    END IF;
    RETURN QUERY EXECUTE format(
        $Q$
        WITH picked AS (
            SELECT msg_id FROM pgmq.%1$I
            WHERE vt <= clock_timestamp() AND ($3 IS NULL OR $3 = '{}'::jsonb OR message @> $3)
            ORDER BY msg_id
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ), leased AS (
            UPDATE pgmq.%1$I m
            SET last_read_at = clock_timestamp(), vt = clock_timestamp() + $2, read_ct = m.read_ct + 1
            FROM picked WHERE m.msg_id = picked.msg_id
            RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers
        )
        SELECT * FROM leased ORDER BY msg_id
        $Q$, qtable)
    USING qty, lease, conditional;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.read(queue_name TEXT, vt INTEGER, qty INTEGER, conditional JSONB DEFAULT '{}')
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
BEGIN
    IF (vt IS NULL OR vt < 0 OR qty IS NULL) AND coalesce(qty >= 0, true) THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_read_as_given(queue_name, vt, qty, conditional);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_read(queue_name, vt, qty, conditional);
END;
$$;

-- pgbroker._poll with pgmq's terms for the arguments it refuses (0018): a
-- negative max_poll_seconds returns nothing without reading (pgmq's deadline
-- has passed before its first read), a NULL one polls until rows come, and a
-- poll_interval_ms <= 0 or NULL reads again without sleeping. (A
-- max_poll_seconds of 0 reads once: docs/compatibility.md, D13.)
CREATE FUNCTION pgbroker._pgmq_poll(read_statement text, max_poll_seconds integer, poll_interval_ms integer)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + make_interval(secs => max_poll_seconds);
    got bigint;
BEGIN
    IF max_poll_seconds >= 0 AND poll_interval_ms > 0 THEN
        RETURN QUERY SELECT * FROM pgbroker._poll(read_statement, max_poll_seconds, poll_interval_ms);
        RETURN;
    END IF;
    IF max_poll_seconds < 0 THEN
        RETURN;
    END IF;
    LOOP
        RETURN QUERY EXECUTE read_statement;
        GET DIAGNOSTICS got = ROW_COUNT;
        EXIT WHEN got > 0 OR clock_timestamp() >= deadline;  -- no deadline: until rows come
        IF poll_interval_ms > 0 THEN
            PERFORM pg_sleep(poll_interval_ms / 1000.0);
        END IF;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.read_with_poll(
    queue_name TEXT,
    vt INTEGER,
    qty INTEGER,
    max_poll_seconds INTEGER DEFAULT 5,
    poll_interval_ms INTEGER DEFAULT 100,
    conditional JSONB DEFAULT '{}'
)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT * FROM pgbroker._pgmq_poll(
        format('SELECT * FROM pgmq.read(%L, %s, %s, %L)', queue_name, coalesce(vt::text, 'NULL'),
               coalesce(qty::text, 'NULL'), conditional),
        max_poll_seconds, poll_interval_ms);
$$;

-- pgmq.pop with a NULL qty, which pgmq takes as no limit (0018): every
-- visible message, deleted and returned in msg_id order.
CREATE FUNCTION pgbroker._pgmq_pop_all(queue_name text)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format(
        $Q$
        WITH picked AS (
            SELECT msg_id FROM pgmq.%1$I WHERE vt <= clock_timestamp() ORDER BY msg_id FOR UPDATE SKIP LOCKED
        ), popped AS (
            DELETE FROM pgmq.%1$I q USING picked WHERE q.msg_id = picked.msg_id
            RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message, q.headers
        )
        SELECT * FROM popped ORDER BY msg_id
        $Q$, pgbroker._pgmq_table(queue_name));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.pop(queue_name TEXT, qty INTEGER DEFAULT 1)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
BEGIN
    IF qty IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_pop_all(queue_name);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_pop(queue_name, qty);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name TEXT, msg_ids BIGINT[], vt TIMESTAMP WITH TIME ZONE)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
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
        UPDATE pgbroker.queue_head h SET ready_from = lowest
        WHERE h.queue_name = stored AND h.ready_from > lowest;
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
    RETURN QUERY SELECT * FROM pgmq.set_vt(queue_name, msg_ids, clock_timestamp() + make_interval(secs => vt));
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker._read_grouped(queue_name text, vt integer, qty integer, mode text)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
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
    IF qty = 0 OR (qty IS NULL AND mode = 'fill') OR pgbroker.is_paused(queue_name) THEN  -- paused: 20_policies.sql
        RETURN;
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
        END IF;
    ELSE
        RAISE EXCEPTION 'unknown grouped read mode %', quote_literal(mode) USING ERRCODE = 'PB007';
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker._read_grouped_with_poll(
    queue_name text, vt integer, qty integer, max_poll_seconds integer, poll_interval_ms integer, mode text)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    -- Reads at least once, like pgmq.read_with_poll here (pgmq's grouped poll
    -- forms return nothing without reading when max_poll_seconds is 0).
    SELECT * FROM pgbroker._pgmq_poll(
        format('SELECT * FROM pgbroker._read_grouped(%L, %s, %s, %L)', queue_name,
               coalesce(vt::text, 'NULL'), coalesce(qty::text, 'NULL'), mode),
        max_poll_seconds, poll_interval_ms);
$$;
