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

-- Claim a key for a send: NULL when this send may store its message (the
-- key was free or its time over; the caller records the msg_id), or the
-- msg_id of the message that holds the key.
CREATE OR REPLACE FUNCTION pgbroker._dedup_claim(stored_name text, dedup_key text, window_seconds integer, mode text)
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
CREATE OR REPLACE FUNCTION pgbroker._send_deduplicated(stored_name text, msgs jsonb[], headers jsonb[], delay timestamptz)
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
-- NULL), its idempotency keys too, at most batch_size rows a call; returns
-- how many went.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.trim_dedup_keys(queue_name text DEFAULT NULL, batch_size integer DEFAULT 10000)
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
    -- Idempotency keys (below) whose time is over, in the same budget.
    DELETE FROM pgbroker.idempotency_keys k WHERE (k.queue_name, k.idempotency_key) IN (
        SELECT i.queue_name, i.idempotency_key FROM pgbroker.idempotency_keys i
        WHERE (trim_dedup_keys.queue_name IS NULL OR lower(i.queue_name) = lower(trim_dedup_keys.queue_name))
          AND i.expires_at < clock_timestamp()
        LIMIT greatest(batch_size - removed, 0));
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN removed + n;
END;
$$;

-- Idempotent sends: a request retried with the same idempotency key gets the
-- first answer again, and sends nothing.
--
-- A client that lost the answer to a send (a connection cut while the send
-- committed, a proxy's time-out) cannot know whether it was stored. Sent
-- again with the same key, the batch is stored at most once: the key, a
-- digest of the request and the msg_ids are written in the send's own
-- transaction, so they commit or vanish with the messages. A second request
-- with the key waits for the first one's transaction (the primary key's
-- uncommitted entry), then returns its msg_ids; the same key with another
-- request (other messages, headers or delay) is refused with PB009, since
-- answering with the first one's msg_ids would hide a different send. A
-- key is held for window_seconds (24 hours by default); after that it may be
-- used again. Keys are per queue and scope: a sender may name a scope of its
-- own (the HTTP API names the API key), so that one sender's keys neither
-- answer nor refuse another's; pgbroker.trim_dedup_keys removes those whose
-- time is over.

-- The scope a sender's keys are stored under: '' for none (every sender of
-- the queue's), else the scope named within the sender's login
-- (session_user, which no SET ROLE changes). A scope is the login's own:
-- another login naming 'api key 7' (the HTTP API's scope for its key 7) has
-- keys of its own, and learns neither whether the API key used one nor its
-- msg_ids. (A server whose login changes starts a new key space.)
CREATE OR REPLACE FUNCTION pgbroker._idempotency_scope(scope text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF scope IS NULL THEN
        RETURN '';
    END IF;
    PERFORM pgbroker._check_arg(length(scope) <= 255, 'idempotency scope must be at most 255 characters');
    RETURN to_jsonb(ARRAY[session_user::text, scope])::text;
END;
$$;

-- Claim idempotency_key of a send to a queue (tbl pgbroker.idempotency_keys,
-- its owner named in column owner_column) or a stream (the stream's table),
-- within the sender's stored scope (_idempotency_scope): NULL when the key was free or its
-- time over (the caller sends and records its ids with _idempotency_record),
-- else the ids of the request that holds it; PB009 when that request was
-- another one.
CREATE OR REPLACE FUNCTION pgbroker._idempotency_claim(
    tbl text, owner_column text, owner text, scope text, idempotency_key text, digest bytea,
    window_seconds integer)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    claimed boolean;
    held_digest bytea;
    held_ids bigint[];
    held_expires timestamptz;
BEGIN
    PERFORM pgbroker._check_arg(idempotency_key IS NOT NULL AND length(idempotency_key) BETWEEN 1 AND 255,
        'idempotency_key must be 1 to 255 characters');
    PERFORM pgbroker._check_arg(window_seconds IS NOT NULL AND window_seconds BETWEEN 1 AND 2592000,
        format('window_seconds must be between 1 and 2592000, got %s', coalesce(window_seconds::text, 'NULL')));
    LOOP
        EXECUTE format(
            'INSERT INTO pgbroker.%I (%I, scope, idempotency_key, request_digest, ids, expires_at)'
            ' VALUES ($1, $5, $2, $3, ''{}'', clock_timestamp() + make_interval(secs => $4))'
            ' ON CONFLICT DO NOTHING RETURNING true', tbl, owner_column)
            INTO claimed USING owner, idempotency_key, digest, window_seconds, scope;
        IF claimed THEN
            RETURN NULL;
        END IF;
        -- A new statement: it sees the row of a request that committed while
        -- the insert waited.
        EXECUTE format(
            'SELECT request_digest, ids, expires_at FROM pgbroker.%I'
            ' WHERE %I = $1 AND scope = $3 AND idempotency_key = $2 FOR UPDATE', tbl, owner_column)
            INTO held_digest, held_ids, held_expires USING owner, idempotency_key, scope;
        CONTINUE WHEN held_digest IS NULL;  -- trimmed meanwhile: claim it afresh
        IF held_expires <= clock_timestamp() THEN
            EXECUTE format('DELETE FROM pgbroker.%I WHERE %I = $1 AND scope = $3 AND idempotency_key = $2',
                tbl, owner_column) USING owner, idempotency_key, scope;
            CONTINUE;
        END IF;
        IF held_digest <> digest THEN
            RAISE EXCEPTION 'idempotency key % was used for another request to %',
                quote_literal(idempotency_key), quote_literal(owner)
                USING ERRCODE = 'PB009',
                      HINT = 'Retry a request with its own key and exactly the same body; use a new key for a new request.';
        END IF;
        RETURN held_ids;
    END LOOP;
END;
$$;

-- Record the ids a claimed key's send got (see _idempotency_claim).
CREATE OR REPLACE FUNCTION pgbroker._idempotency_record(
    tbl text, owner_column text, owner text, scope text, idempotency_key text, sent bigint[])
RETURNS bigint[] LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('UPDATE pgbroker.%I SET ids = $3 WHERE %I = $1 AND scope = $4 AND idempotency_key = $2',
        tbl, owner_column) USING owner, idempotency_key, sent, scope;
    RETURN sent;
END;
$$;

-- A request's digest: what makes a retry the same request.
CREATE OR REPLACE FUNCTION pgbroker._idempotency_digest(VARIADIC parts jsonb[])
RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
    SELECT sha256(convert_to(to_jsonb(parts)::text, 'UTF8'));
$$;

-- A request's headers as its digest takes them: without the W3C trace context
-- (traceparent, tracestate), which a traced client writes anew on every try of
-- the same request (pgbroker.tracing), so that a retry is still the same request.
CREATE OR REPLACE FUNCTION pgbroker._idempotency_headers(headers jsonb[])
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_agg(h - ARRAY['traceparent', 'tracestate'] ORDER BY i)
    FROM unnest(headers) WITH ORDINALITY AS u(h, i);
$$;

-- Send msgs (headers, delay in seconds as pgmq.send_batch takes them) once
-- for idempotency_key; the same call again returns the same msg_ids.
-- Arguments: window_seconds: how long the key is held (1 s to 30 days);
--   scope: whose key it is (up to 255 characters; NULL: the queue's
--   senders without a scope): the same key in another scope is another key,
--   and a scope is the login's that names it (the same scope named by
--   another login is another one).
-- Returns: the msg_ids, in the order of msgs: the first call's, each time.
-- Errors: PB009 when the key was used for another request within its window;
--   PB007 for an empty key, one over 255 characters, a scope over 255, or a
--   window out of range.
-- Since: 0.2.0
CREATE OR REPLACE FUNCTION pgbroker.send_idempotent(
    queue_name text, idempotency_key text, msgs jsonb[], headers jsonb[] DEFAULT NULL,
    delay integer DEFAULT 0, window_seconds integer DEFAULT 86400, scope text DEFAULT NULL)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    stored varchar;
    held bigint[];
BEGIN
    -- Before the key is looked at: a caller refused the queue learns nothing of its keys.
    PERFORM pgbroker._authorize('producer', queue_name);
    PERFORM pgbroker._table(queue_name);
    stored := pgbroker._stored_name(queue_name);
    held := pgbroker._idempotency_claim('idempotency_keys', 'queue_name', stored,
        pgbroker._idempotency_scope(scope), idempotency_key, pgbroker._idempotency_digest(
            to_jsonb(msgs), pgbroker._idempotency_headers(headers), to_jsonb(delay)), window_seconds);
    IF held IS NULL THEN
        held := pgbroker._idempotency_record('idempotency_keys', 'queue_name', stored,
            pgbroker._idempotency_scope(scope), idempotency_key, ARRAY(SELECT pgmq.send_batch(queue_name, msgs, headers, delay)));
    END IF;
    RETURN QUERY SELECT unnest(held);
END;
$$;
