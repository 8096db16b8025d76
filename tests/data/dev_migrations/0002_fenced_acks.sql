-- pgbroker migration 0002: fenced acknowledgement, beyond pgmq.
--
-- A read hands out a receipt per message: '<msg_id>:<read_ct>:<lease>' where
-- lease is the message's vt in microseconds since the epoch. read_ct tells
-- one delivery from the next; vt changes with every read, nack and extend.
-- So a receipt is valid only while (read_ct, vt) are still the ones it was
-- issued for and the lease has not run out: a consumer whose lease expired,
-- or whose message was redelivered, nacked or extended by someone else, can
-- no longer ack, nack or extend it. pgmq's unfenced delete/archive by msg_id
-- stay for compatibility.
--
-- extend returns a new receipt (the old one is spent), like a fencing token.
-- Every function here is SQL, so any language can use fenced acks.

-- A timestamp as whole microseconds since the epoch: the lease in a receipt.
-- Receipts are compared in this integer form, so no text ever has to be
-- turned back into a timestamp exactly.
-- STABLE, not IMMUTABLE: extract() from a timestamptz is STABLE, and a SQL
-- function is only inlined into its caller when it claims no more than its
-- body is (inlining saves a function call per message on every read).
CREATE FUNCTION pgbroker._micros(ts timestamptz)
RETURNS bigint LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT (extract(epoch FROM ts) * 1000000)::bigint;
$$;

CREATE FUNCTION pgbroker.receipt(msg_id bigint, read_ct integer, vt timestamptz)
RETURNS text LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT msg_id || ':' || read_ct || ':' || pgbroker._micros(vt);
$$;

CREATE FUNCTION pgbroker._parse_receipt(receipt text, OUT msg_id bigint, OUT read_ct integer, OUT lease bigint)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    parts text[];
BEGIN
    IF receipt ~ '^[0-9]{1,19}:[0-9]{1,10}:-?[0-9]{1,19}$' THEN
        parts := string_to_array(receipt, ':');
        -- Range checks as numerics, so an out-of-range number is a malformed
        -- receipt (PB007) rather than a cast error.
        IF parts[1]::numeric <= 9223372036854775807 AND parts[2]::numeric <= 2147483647
           AND parts[3]::numeric BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
            msg_id := parts[1]::bigint;
            read_ct := parts[2]::integer;
            lease := parts[3]::bigint;
            RETURN;
        END IF;
    END IF;
    RAISE EXCEPTION 'malformed receipt %: expected <msg_id>:<read_ct>:<lease>, three integers',
        coalesce(quote_literal(receipt), 'NULL')
        USING ERRCODE = 'PB007',
              HINT = 'Pass the receipt exactly as pgbroker.read returned it.';
END;
$$;

-- Receipts as arrays (msg_ids, read_cts, leases), for the batch operations: one
-- set-based statement that checks every receipt first (PB007 for the first
-- malformed one) instead of a PL/pgSQL call per receipt. The batch statements
-- then find their rows with ``msg_id = ANY(msg_ids)``, a primary-key probe
-- the planner cannot mistake for a join over the whole queue.
CREATE FUNCTION pgbroker._receipt_ok(receipt text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT receipt ~ '^[0-9]{1,19}:[0-9]{1,10}:-?[0-9]{1,19}$'
       AND split_part(receipt, ':', 1)::numeric <= 9223372036854775807
       AND split_part(receipt, ':', 2)::numeric <= 2147483647
       AND split_part(receipt, ':', 3)::numeric BETWEEN -9223372036854775808 AND 9223372036854775807;
$$;

CREATE FUNCTION pgbroker._held(receipts text[], OUT msg_ids bigint[], OUT read_cts integer[], OUT leases bigint[])
LANGUAGE plpgsql STABLE AS $$
DECLARE
    bad text;
BEGIN
    SELECT r INTO bad FROM unnest(receipts) r WHERE pgbroker._receipt_ok(r) IS NOT TRUE LIMIT 1;
    IF FOUND THEN
        PERFORM pgbroker._parse_receipt(bad);  -- raises PB007 naming it
    END IF;
    SELECT coalesce(array_agg(split_part(r, ':', 1)::bigint), '{}'),
           coalesce(array_agg(split_part(r, ':', 2)::integer), '{}'),
           coalesce(array_agg(split_part(r, ':', 3)::bigint), '{}')
    INTO msg_ids, read_cts, leases
    FROM unnest(receipts) r;
END;
$$;

-- Why a receipt no longer holds, or NULL while it does. Clients call this
-- after a batch ack left a receipt out, to explain it without raising inside
-- the caller's transaction.
CREATE FUNCTION pgbroker.stale_reason(queue_name text, receipt text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
    r record := pgbroker._parse_receipt(receipt);
    cur record;
BEGIN
    EXECUTE format('SELECT read_ct, vt, clock_timestamp() AS now FROM pgmq.%I WHERE msg_id = $1', qtable)
        INTO cur USING r.msg_id;
    IF cur IS NULL THEN
        RETURN 'it is no longer in the queue (acknowledged, deleted, archived or popped)';
    ELSIF cur.read_ct <> r.read_ct THEN
        RETURN format('it was delivered again (delivery %s; the receipt is for delivery %s)',
                      cur.read_ct, r.read_ct);
    ELSIF pgbroker._micros(cur.vt) <> r.lease THEN
        RETURN 'its lease was changed by a nack, extend or set_vt after this receipt was issued';
    ELSIF cur.vt <= cur.now THEN
        RETURN format('its lease expired at %s', cur.vt);
    END IF;
    RETURN NULL;
END;
$$;

CREATE FUNCTION pgbroker._raise_stale(queue_name text, receipt text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'stale receipt for message % in queue "%": %',
        (pgbroker._parse_receipt(receipt)).msg_id, queue_name,
        coalesce(pgbroker.stale_reason(queue_name, receipt), 'its lease ended as it was used')
        USING ERRCODE = 'PB003',
              HINT = 'Another consumer may now hold the message; extend leases before they run out.';
END;
$$;

-- A delivered message: pgmq.message_record's fields and the receipt.
CREATE TYPE pgbroker.delivery AS (
    msg_id BIGINT,
    read_ct INTEGER,
    enqueued_at TIMESTAMP WITH TIME ZONE,
    last_read_at TIMESTAMP WITH TIME ZONE,
    vt TIMESTAMP WITH TIME ZONE,
    message JSONB,
    headers JSONB,
    receipt TEXT
);

-- Read like pgmq.read, with a receipt per message.
CREATE FUNCTION pgbroker.read(queue_name text, vt integer, qty integer, conditional jsonb DEFAULT '{}')
RETURNS SETOF pgbroker.delivery LANGUAGE sql AS $$
    SELECT m.*, pgbroker.receipt(m.msg_id, m.read_ct, m.vt)
    FROM pgmq.read(queue_name, vt, qty, conditional) m;
$$;

CREATE FUNCTION pgbroker.read_with_poll(
    queue_name text, vt integer, qty integer,
    max_poll_seconds integer DEFAULT 5, poll_interval_ms integer DEFAULT 100,
    conditional jsonb DEFAULT '{}')
RETURNS SETOF pgbroker.delivery LANGUAGE sql AS $$
    SELECT m.*, pgbroker.receipt(m.msg_id, m.read_ct, m.vt)
    FROM pgmq.read_with_poll(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, conditional) m;
$$;

-- Ack many: archive (default) or delete the messages whose receipts still
-- hold; returns their msg_ids. Stale receipts are skipped and change nothing.
CREATE FUNCTION pgbroker.ack(queue_name text, receipts text[], archive boolean DEFAULT true)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
    held record := pgbroker._held(receipts);
BEGIN
    PERFORM pgbroker._check_arg(archive IS NOT NULL, 'archive must be true or false, got NULL');
    RETURN QUERY EXECUTE format(
        $Q$
        WITH removed AS (
            DELETE FROM pgmq.%1$I q
            WHERE q.msg_id = ANY($1)
              AND (q.msg_id, q.read_ct, pgbroker._micros(q.vt)) IN (SELECT * FROM unnest($1, $2, $3))
              AND q.vt > clock_timestamp()
            RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message, q.headers
        ),
        archived AS (
            INSERT INTO pgmq.%2$I (msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers)
            SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers FROM removed
            WHERE $4
        )
        SELECT msg_id FROM removed ORDER BY msg_id
        $Q$, qtable, 'a' || substr(qtable, 2))
    USING held.msg_ids, held.read_cts, held.leases, archive;
END;
$$;

CREATE FUNCTION pgbroker.ack(queue_name text, receipt text, archive boolean DEFAULT true)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    acked bigint;
BEGIN
    SELECT a INTO acked FROM pgbroker.ack(queue_name, ARRAY[receipt], archive) a;
    IF acked IS NULL THEN
        PERFORM pgbroker._raise_stale(queue_name, receipt);
    END IF;
    RETURN acked;
END;
$$;

-- Nack many: make the messages visible again after delay seconds; returns
-- the msg_ids whose receipts still held.
CREATE FUNCTION pgbroker.nack(queue_name text, receipts text[], delay integer DEFAULT 0)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
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

CREATE FUNCTION pgbroker.nack(queue_name text, receipt text, delay integer DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    released bigint;
BEGIN
    SELECT n INTO released FROM pgbroker.nack(queue_name, ARRAY[receipt], delay) n;
    IF released IS NULL THEN
        PERFORM pgbroker._raise_stale(queue_name, receipt);
    END IF;
    RETURN released;
END;
$$;

-- Extend many: the lease now ends vt seconds from now; returns a new
-- receipt for each message whose receipt still held.
CREATE FUNCTION pgbroker.extend(queue_name text, receipts text[], vt integer)
RETURNS TABLE (msg_id bigint, receipt text) LANGUAGE plpgsql AS $$
DECLARE
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

CREATE FUNCTION pgbroker.extend(queue_name text, receipt text, vt integer)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    renewed text;
BEGIN
    SELECT e.receipt INTO renewed FROM pgbroker.extend(queue_name, ARRAY[receipt], vt) e;
    IF renewed IS NULL THEN
        PERFORM pgbroker._raise_stale(queue_name, receipt);
    END IF;
    RETURN renewed;
END;
$$;
