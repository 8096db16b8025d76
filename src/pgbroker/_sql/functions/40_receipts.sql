-- Receipts: what fences acknowledgement, beyond pgmq.
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
-- Receipts are made and checked in SQL, so any language can use fenced acks;
-- the fenced operations themselves (ack, nack, extend) are in 60_acks.sql.

-- A timestamp as whole microseconds since the epoch: the lease in a receipt.
-- Receipts are compared in this integer form, so no text ever has to be
-- turned back into a timestamp exactly.
-- STABLE, not IMMUTABLE: extract() from a timestamptz is STABLE, and a SQL
-- function is only inlined into its caller when it claims no more than its
-- body is (inlining saves a function call per message on every read).
CREATE OR REPLACE FUNCTION pgbroker._micros(ts timestamptz)
RETURNS bigint LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT (extract(epoch FROM ts) * 1000000)::bigint;
$$;

-- The receipt of a delivery.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.receipt(msg_id bigint, read_ct integer, vt timestamptz)
RETURNS text LANGUAGE sql STABLE STRICT PARALLEL SAFE AS $$
    SELECT msg_id || ':' || read_ct || ':' || pgbroker._micros(vt);
$$;

-- A receipt's three parts; PB007 naming it when it is malformed.
CREATE OR REPLACE FUNCTION pgbroker._parse_receipt(receipt text, OUT msg_id bigint, OUT read_ct integer, OUT lease bigint)
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

-- Whether a receipt is well formed, as _parse_receipt judges it, without
-- raising.
CREATE OR REPLACE FUNCTION pgbroker._receipt_ok(receipt text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT receipt ~ '^[0-9]{1,19}:[0-9]{1,10}:-?[0-9]{1,19}$'
       AND split_part(receipt, ':', 1)::numeric <= 9223372036854775807
       AND split_part(receipt, ':', 2)::numeric <= 2147483647
       AND split_part(receipt, ':', 3)::numeric BETWEEN -9223372036854775808 AND 9223372036854775807;
$$;

-- Receipts as arrays (msg_ids, read_cts, leases), for the batch operations: one
-- set-based statement that checks and splits every receipt (PB007 for the
-- first malformed one) instead of a PL/pgSQL call per receipt. The batch
-- statements then find their rows with ``msg_id = ANY(msg_ids)``, a
-- primary-key probe the planner cannot mistake for a join over the whole queue.
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

-- Why a receipt no longer holds, or NULL while it does. Clients call this
-- after a batch ack left a receipt out, to explain it without raising inside
-- the caller's transaction.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.stale_reason(queue_name text, receipt text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
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

-- Fail with PB003 for a receipt that did not hold, saying why.
CREATE OR REPLACE FUNCTION pgbroker._raise_stale(queue_name text, receipt text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'stale receipt for message % in queue "%": %',
        (pgbroker._parse_receipt(receipt)).msg_id, queue_name,
        coalesce(pgbroker.stale_reason(queue_name, receipt), 'its lease ended as it was used')
        USING ERRCODE = 'PB003',
              HINT = 'Another consumer may now hold the message; extend leases before they run out.';
END;
$$;
