-- Failures: retries with back-off, and dead letters, by the queue's policy
-- (20_policies.sql).
--
-- pgbroker.fail gives a message back with the policy's back-off, or
-- dead-letters it after max_deliveries; pgbroker.read dead-letters a message
-- that reached max_deliveries without an ack or a failure report
-- (pgbroker._deliver, 50_reads.sql).
--
-- Each failure reported is kept with the message, in its header
-- x-pgbroker-attempts: the latest 10, each {delivery, error, traceback,
-- failed_at} (the traceback when the consumer gave one). The next delivery
-- shows the handler what went wrong before; a dead letter carries them all.
--
-- A dead letter is the message as it was sent (payload and headers) plus a
-- header x-pgbroker-dead-letter: {queue, msg_id, deliveries, error,
-- enqueued_at, dead_lettered_at}. It goes to the policy's dead-letter queue as
-- a new message, or, without one, to the queue's own archive (keeping its
-- msg_id). pgbroker.dead_letters, dead_letter, replay_dead_letters and
-- purge_dead_letters find a queue's dead letters wherever its policy sends
-- them now, and know each by the msg_id it had in the queue (the one its
-- consumers saw and logged), never by its id in the dead-letter queue.

------------------------------------------------------------------------------
-- Dead letters
------------------------------------------------------------------------------

-- The table a queue's dead letters go to: its dead-letter queue, or its
-- archive.
CREATE OR REPLACE FUNCTION pgbroker._dead_letter_table(p pgbroker.queue_policy)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p.dead_letter_queue IS NULL THEN pgbroker._table(p.queue_name, 'a')
                ELSE pgbroker._table(p.dead_letter_queue) END;
$$;

-- Move messages (locked by the caller) out of their queue because they cannot
-- be processed. ``deliveries_counted`` is 0 when the last delivery failed,
-- and -1 when pgbroker.read caught them: that read was not a delivery. The
-- error is cut to 2,000 characters: a header, not a log. Dead letters are
-- never refused by the dead-letter queue's max_depth or the message size
-- limit: they were accepted once, and refusing would leave a poison message
-- circulating (or stop every read of its queue).
CREATE OR REPLACE FUNCTION pgbroker._dead_letter(queue_name text, msg_ids bigint[], error text, deliveries_counted integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    p pgbroker.queue_policy := pgbroker.policy(queue_name);
    letters bigint;
    moved text := format(
        $Q$
        moved AS (
            DELETE FROM pgmq.%I WHERE msg_id = ANY($1)
            RETURNING msg_id, read_ct, enqueued_at, last_read_at, vt, message,
                      coalesce(headers, '{}'::jsonb) || jsonb_build_object('x-pgbroker-dead-letter',
                          jsonb_build_object('queue', $2::text, 'msg_id', msg_id,
                                             'deliveries', read_ct + $4, 'error', left($3, 2000),
                                             'enqueued_at', enqueued_at,
                                             'dead_lettered_at', clock_timestamp())) AS headers
        )
        $Q$, pgbroker._table(queue_name));
BEGIN
    IF p.dead_letter_queue IS NULL THEN
        EXECUTE format(
            $Q$
            WITH %s
            INSERT INTO pgmq.%I (msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers)
            SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers FROM moved
            $Q$, moved, pgbroker._dead_letter_table(p))
            USING msg_ids, p.queue_name, error, deliveries_counted;
        GET DIAGNOSTICS letters = ROW_COUNT;
    ELSE
        -- A new message of the dead-letter queue, ready at once (vt = enqueued_at, as a send makes it).
        EXECUTE format(
            $Q$
            WITH %s
            INSERT INTO pgmq.%I (vt, message, headers)
            SELECT now(), message, headers FROM moved ORDER BY msg_id
            $Q$, moved, pgbroker._dead_letter_table(p))
            USING msg_ids, p.queue_name, error, deliveries_counted;
        GET DIAGNOSTICS letters = ROW_COUNT;
    END IF;
    PERFORM pgbroker._count_failures(p.queue_name, 0, letters);  -- 96_monitoring.sql
END;
$$;

-- Failed attempts kept per message: the latest ones, where the cause of a
-- poison message shows; older ones only repeat it.
CREATE OR REPLACE FUNCTION pgbroker._attempts_kept()
RETURNS integer LANGUAGE sql IMMUTABLE AS $$ SELECT 10 $$;

-- Record a failed delivery of a message (locked by the caller) in its header
-- x-pgbroker-attempts. The error keeps its first 2,000 characters, the
-- traceback its last 8,000 (where a traceback names the cause): headers, not
-- a log.
CREATE OR REPLACE FUNCTION pgbroker._record_attempt(queue_name text, msg_id bigint, error text, traceback text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format(
        $Q$
        UPDATE pgmq.%I SET headers = coalesce(headers, '{}'::jsonb) || jsonb_build_object('x-pgbroker-attempts', (
            SELECT jsonb_agg(attempt ORDER BY n)
            FROM jsonb_array_elements(coalesce(headers -> 'x-pgbroker-attempts', '[]'::jsonb)
                                      || jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
                                             'delivery', read_ct, 'error', left($2, 2000),
                                             'traceback', right($3, 8000), 'failed_at', clock_timestamp()))))
                 WITH ORDINALITY AS a(attempt, n)
            WHERE n > jsonb_array_length(coalesce(headers -> 'x-pgbroker-attempts', '[]'::jsonb)) + 1
                      - pgbroker._attempts_kept()))
        WHERE msg_id = $1
        $Q$, pgbroker._table(queue_name))
        USING msg_id, error, traceback;
END;
$$;

-- A consumer failed to process messages it holds: give each back with the
-- policy's back-off, or dead-letter it when this was its last allowed
-- delivery. Each failure is kept with its message (x-pgbroker-attempts).
-- Arguments: error: what went wrong (a line); traceback: where, when the
--   consumer has one; default_max_deliveries: the caller's limit for a queue
--   whose policy sets none (pgbroker's worker passes its own, 25 by default,
--   so that a failing message does not come back for ever); the policy's
--   max_deliveries wins when set; NULL: none.
-- Returns: (msg_id, 'retry' | 'dead_lettered') for the receipts that still
--   held; stale ones are skipped and change nothing.
-- Errors: PB007 when default_max_deliveries is below 1.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.fail(queue_name text, receipts text[], error text DEFAULT NULL,
                                         traceback text DEFAULT NULL, default_max_deliveries integer DEFAULT NULL)
RETURNS TABLE (msg_id bigint, outcome text) LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    p pgbroker.queue_policy := pgbroker.policy(queue_name);
    max_deliveries constant integer := coalesce(p.max_deliveries, default_max_deliveries);
    one text;
    held record;
    retried bigint := 0;
BEGIN
    PERFORM pgbroker._check_arg(default_max_deliveries IS NULL OR default_max_deliveries >= 1,
        format('default_max_deliveries must be >= 1 (NULL: none), got %s', default_max_deliveries));
    FOREACH one IN ARRAY coalesce(receipts, '{}') LOOP
        held := pgbroker._parse_receipt(one);
        IF max_deliveries IS NOT NULL AND held.read_ct >= max_deliveries THEN
            -- Lock the row and check the receipt first, so that a stale one moves nothing.
            CONTINUE WHEN NOT EXISTS (SELECT 1 FROM pgbroker.extend(queue_name, ARRAY[one], 0));
            PERFORM pgbroker._record_attempt(queue_name, held.msg_id, coalesce(error, 'failed (no error given)'),
                                             traceback);
            PERFORM pgbroker._dead_letter(queue_name, ARRAY[held.msg_id],
                                          coalesce(error, 'failed (no error given)'), 0);
            outcome := 'dead_lettered';
        ELSE
            CONTINUE WHEN NOT EXISTS (
                SELECT 1 FROM pgbroker.nack(queue_name, ARRAY[one], pgbroker.retry_delay(p, held.read_ct)));
            PERFORM pgbroker._record_attempt(queue_name, held.msg_id, coalesce(error, 'failed (no error given)'),
                                             traceback);
            outcome := 'retry';
            retried := retried + 1;
        END IF;
        msg_id := held.msg_id;
        RETURN NEXT;
    END LOOP;
    IF retried > 0 THEN
        PERFORM pgbroker._count_failures(p.queue_name, retried, 0);  -- 96_monitoring.sql
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.fail(queue_name text, receipt text, error text DEFAULT NULL,
                                         traceback text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    result text;
BEGIN
    SELECT f.outcome INTO result FROM pgbroker.fail(queue_name, ARRAY[receipt], error, traceback) f;
    IF result IS NULL THEN
        PERFORM pgbroker._raise_stale(queue_name, receipt);
    END IF;
    RETURN result;
END;
$$;

-- The msg_id a dead letter had in its queue, its id in the dead-letter API:
-- the header's (in a dead-letter queue the row has a new one; in the archive
-- the two are the same).
CREATE OR REPLACE FUNCTION pgbroker._letter_id(headers jsonb)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT (headers -> 'x-pgbroker-dead-letter' ->> 'msg_id')::bigint;
$$;

-- A queue's dead letters, oldest first: up to qty after msg_id after_msg_id.
-- Each has the msg_id it had in the queue (the one its consumers saw), wherever
-- it went.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.dead_letters(queue_name text, qty integer DEFAULT 100, after_msg_id bigint DEFAULT 0)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql STABLE AS $$
DECLARE
    p pgbroker.queue_policy := pgbroker.policy(queue_name);
BEGIN
    PERFORM pgbroker._check_read_args(0, qty);
    RETURN QUERY EXECUTE format(
        $Q$
        SELECT pgbroker._letter_id(headers), read_ct, enqueued_at, last_read_at, vt, message, headers
        FROM pgmq.%I
        WHERE headers -> 'x-pgbroker-dead-letter' ->> 'queue' = $1 AND pgbroker._letter_id(headers) > $2
        ORDER BY 1 LIMIT $3
        $Q$, pgbroker._dead_letter_table(p))
    USING p.queue_name, coalesce(after_msg_id, 0), qty;
END;
$$;

-- One dead letter of a queue, by the msg_id it had in the queue, with the
-- failed attempts it carries (header x-pgbroker-attempts): none when there is
-- no such letter.
-- Since: 0.2.0
CREATE OR REPLACE FUNCTION pgbroker.dead_letter(queue_name text, msg_id bigint)
RETURNS SETOF pgmq.message_record LANGUAGE sql STABLE AS $$
    SELECT * FROM pgbroker.dead_letters(queue_name, 1, msg_id - 1) d WHERE d.msg_id = dead_letter.msg_id;
$$;

-- Send a queue's dead letters back to it as new messages (the
-- x-pgbroker-dead-letter and x-pgbroker-attempts headers removed, deliveries
-- counted from 0 again): all of them, or those of msg_ids (the ids they had in
-- the queue, as pgbroker.dead_letters gives them). A replay is sent anew whatever its dedup
-- key (34_dedup.sql): the key is left out, or its window would swallow the
-- replay and the letter would be lost. The queue's max_depth applies, all or
-- nothing. Returns (dead_letter_id, msg_id): the letter's id, and the new
-- message's id in the queue.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.replay_dead_letters(queue_name text, msg_ids bigint[] DEFAULT NULL)
RETURNS TABLE (dead_letter_id bigint, msg_id bigint) LANGUAGE plpgsql AS $$
DECLARE
    p pgbroker.queue_policy := pgbroker.policy(queue_name);
    letter_ids bigint[];
    messages jsonb[];
    letter_headers jsonb[];
BEGIN
    EXECUTE format(
        $Q$
        WITH letters AS (
            DELETE FROM pgmq.%I
            WHERE headers -> 'x-pgbroker-dead-letter' ->> 'queue' = $1
              AND ($2::bigint[] IS NULL OR pgbroker._letter_id(headers) = ANY ($2))
            RETURNING pgbroker._letter_id(headers) AS msg_id, message,
                      nullif(headers - 'x-pgbroker-dead-letter' - 'x-pgbroker-attempts' - 'x-pgbroker-dedup-key',
                             '{}'::jsonb) AS headers
        )
        SELECT array_agg(msg_id ORDER BY msg_id), array_agg(message ORDER BY msg_id),
               array_agg(headers ORDER BY msg_id)
        FROM letters
        $Q$, pgbroker._dead_letter_table(p))
        INTO letter_ids, messages, letter_headers
        USING p.queue_name, msg_ids;
    IF letter_ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM unnest(letter_ids,
                                      ARRAY(SELECT pgbroker._send_many(p.queue_name, messages, letter_headers, NULL, true)));
END;
$$;

-- Delete a queue's dead letters: all of them, or those of msg_ids (the ids
-- they had in the queue). Returns how many.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.purge_dead_letters(queue_name text, msg_ids bigint[] DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    p pgbroker.queue_policy := pgbroker.policy(queue_name);
    purged bigint;
BEGIN
    EXECUTE format(
        $Q$
        DELETE FROM pgmq.%I
        WHERE headers -> 'x-pgbroker-dead-letter' ->> 'queue' = $1
          AND ($2::bigint[] IS NULL OR pgbroker._letter_id(headers) = ANY ($2))
        $Q$, pgbroker._dead_letter_table(p))
        USING p.queue_name, msg_ids;
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN purged;
END;
$$;
