-- Bridge: what the RabbitMQ bridge (pgbroker.bridge) needs, beyond pgmq.
--
-- Outbound keeps a publish record: pgbroker.ack_published acks like
-- pgbroker.complete (fenced by receipts, with the policy's ack_mode), and
-- when the message is archived its archive row carries a header
-- x-pgbroker-published: {at, exchange, routing_key} saying where and when the
-- broker confirmed it. Failures go through pgbroker.fail (65_failures.sql)
-- unchanged.
--
-- Inbound de-duplicates AMQP redeliveries: pgbroker.receive_many sends only
-- the messages whose AMQP message_id the queue has not seen within the
-- window, and records the ids in the same transaction as the send, so a
-- redelivery after a crash between the Postgres commit and the AMQP ack is
-- recognised. pgbroker.prune_inbound_seen forgets ids older than the window.
--
-- The least-privilege roles (88_roles.sql): an outbound bridge consumes, an
-- inbound bridge produces (and prunes what it recorded).

-- Ack with a publish record per message (published[n] belongs to
-- receipts[n]); returns the msg_ids whose receipts still held, as
-- pgbroker.ack does. Stale receipts change nothing: the caller's lease ran
-- out, so another bridge may publish that message again.
-- Errors: PB005 for a publish record over the size limit of a message.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.ack_published(queue_name text, receipts text[], published jsonb[])
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    qtable text := pgbroker._table(queue_name);
    held record := pgbroker._held(receipts);
BEGIN
    PERFORM pgbroker._check_arg(cardinality(receipts) = cardinality(published),
        format('published has %s entries for %s receipts',
               coalesce(cardinality(published), 0), coalesce(cardinality(receipts), 0)),
        'Give one publish record per receipt.');
    -- Within the size limit of a message: the archive keeps the record, and a consumer's acks
    -- must not write there more than a producer's sends may.
    PERFORM pgbroker._check_message_size((SELECT coalesce(max(pg_column_size(r)), 0) FROM unnest(published) r));
    IF (pgbroker.policy(queue_name)).ack_mode = 'delete' THEN
        RETURN QUERY SELECT pgbroker.ack(queue_name, receipts, false);
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format(
        $Q$
        WITH removed AS (
            DELETE FROM pgmq.%1$I q
            USING unnest($1, $2, $3, $4) AS r(msg_id, read_ct, lease, record)
            WHERE q.msg_id = ANY($1)
              AND (q.msg_id, q.read_ct, pgbroker._micros(q.vt)) = (r.msg_id, r.read_ct, r.lease)
              AND q.vt > clock_timestamp()
            RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message,
                      coalesce(q.headers, '{}'::jsonb)
                          || jsonb_build_object('x-pgbroker-published', r.record) AS headers
        ),
        archived AS (
            INSERT INTO pgmq.%2$I (msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers)
            SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers FROM removed
        )
        SELECT msg_id FROM removed ORDER BY msg_id
        $Q$, qtable, 'a' || substr(qtable, 2))
    USING held.msg_ids, held.read_cts, held.leases, published;
END;
$$;

-- Send the messages whose message_id (messages[n] has message_ids[n]) the
-- queue has not seen within seen_within; record them as seen. Returns
-- (message_id, msg_id) for each sent message; the others were duplicates. A
-- NULL message_id cannot be recognised again: that message is always sent.
-- Two transactions receiving the same id take turns on its row (the second
-- waits for the first to commit or roll back), so a redelivery that races the
-- first delivery is still sent once.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.receive_many(
    queue_name text, message_ids text[], messages jsonb[], headers jsonb[], seen_within interval)
RETURNS TABLE (message_id text, msg_id bigint) LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('producer', queue_name);
    stored varchar;
    fresh_ids text[];
    fresh_messages jsonb[];
    fresh_headers jsonb[];
BEGIN
    PERFORM pgbroker._table(queue_name);
    stored := pgbroker._stored_name(queue_name);
    PERFORM pgbroker._check_arg(cardinality(message_ids) = cardinality(messages)
                                AND cardinality(headers) = cardinality(messages),
        'message_ids, messages and headers must have one entry per message');
    PERFORM pgbroker._check_arg(seen_within IS NOT NULL AND seen_within >= interval '0',
        format('seen_within must be an interval >= 0, got %s', coalesce(seen_within::text, 'NULL')));

    WITH batch AS (
        SELECT b.id, b.msg, b.hdr, b.n FROM unnest(message_ids, messages, headers) WITH ORDINALITY AS b(id, msg, hdr, n)
    ),
    -- The first of equal ids in one batch stands for all of them.
    firsts AS (
        SELECT DISTINCT ON (id) id, n FROM batch WHERE id IS NOT NULL ORDER BY id, n
    ),
    claimed AS (
        INSERT INTO pgbroker.inbound_seen AS s (queue_name, message_id, seen_at)
        SELECT stored, id, now() FROM firsts ORDER BY id
        ON CONFLICT ON CONSTRAINT inbound_seen_pkey DO UPDATE SET seen_at = EXCLUDED.seen_at
            WHERE s.seen_at < now() - seen_within
        RETURNING s.message_id
    ),
    fresh AS (
        SELECT f.n FROM firsts f JOIN claimed c ON c.message_id = f.id
    )
    SELECT array_agg(b.id ORDER BY b.n), array_agg(b.msg ORDER BY b.n), array_agg(b.hdr ORDER BY b.n)
    INTO fresh_ids, fresh_messages, fresh_headers
    FROM batch b
    WHERE b.id IS NULL OR b.n IN (SELECT fresh.n FROM fresh);
    IF fresh_ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM unnest(fresh_ids,
                                      ARRAY(SELECT pgbroker._send_many(queue_name, fresh_messages, fresh_headers, NULL)));
END;
$$;

-- A prune's window and batch (PB007 otherwise): the window at least a minute
-- (a negative or tiny one would wipe the memory that stops a redelivery from
-- being sent twice, for every queue, and any producer may prune), the batch
-- from 1 to 100,000 rows (one short transaction).
CREATE OR REPLACE FUNCTION pgbroker._check_prune_args(seen_within interval, batch_size integer)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgbroker._check_arg(seen_within >= interval '1 minute',
        format('seen_within must be an interval of at least 1 minute, got %s', coalesce(seen_within::text, 'NULL')),
        'Prune with the window the inbound bridge de-duplicates over (its seen_within).');
    PERFORM pgbroker._check_arg(batch_size BETWEEN 1 AND 100000,
        format('batch_size must be from 1 to 100000, got %s', coalesce(batch_size::text, 'NULL')));
END;
$$;

-- Forget inbound message ids seen longer than seen_within ago, of one queue
-- or (queue_name NULL) of all, at most batch_size per call (a short
-- transaction); returns how many went. Callers repeat until 0.
-- Errors: 42501 for a role granted some queues only (pgbroker grant producer)
--   and another queue, or every queue (NULL).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.prune_inbound_seen(seen_within interval, batch_size integer DEFAULT 10000,
                                            queue_name text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    -- A queue's ids are forgotten by those who may send to it (its inbound bridge prunes them);
    -- every queue's only by a producer of every queue: no grant covers NULL.
    authorized constant boolean := pgbroker._authorize('producer', queue_name);
    stored varchar;
    pruned bigint;
BEGIN
    PERFORM pgbroker._check_prune_args(seen_within, batch_size);
    IF queue_name IS NOT NULL THEN
        PERFORM pgbroker._table(queue_name);
        stored := pgbroker._stored_name(queue_name);
    END IF;
    DELETE FROM pgbroker.inbound_seen WHERE (inbound_seen.queue_name, message_id) IN (
        SELECT s.queue_name, s.message_id FROM pgbroker.inbound_seen s
        WHERE s.seen_at < now() - seen_within AND (stored IS NULL OR s.queue_name = stored)
        ORDER BY s.seen_at LIMIT batch_size);
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$$;
