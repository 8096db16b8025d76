-- pgbroker migration 0008: per-queue delivery policy, beyond pgmq.
--
-- A queue may have a policy row: how often a message may be delivered, how
-- long to back off after a failure, where poison messages go, whether an ack
-- archives or deletes, how deep the queue may grow, and how long the archive
-- is kept. The worker runtime and the CLI only call the functions here, so
-- every consumer of the queue, in any language, follows the same rules:
--   pgbroker.complete(queue, receipts)     ack with the policy's ack_mode;
--   pgbroker.fail(queue, receipt, error)   nack with the policy's back-off, or
--                                          dead-letter after max_deliveries;
--   pgbroker.read(...)                     dead-letters, instead of delivering,
--                                          a message that already had
--                                          max_deliveries (its consumers died
--                                          or let their leases run out);
--   every send                             refuses (PB006) to grow the queue
--                                          past max_depth;
--   pgbroker.trim_archive(queue)           applies the archive retention.
-- Plain pgmq.read/delete/archive are untouched: pgmq clients keep pgmq's rules.
--
-- A dead letter is the message as it was sent (payload and headers) plus a
-- header x-pgbroker-dead-letter: {queue, msg_id, deliveries, error,
-- enqueued_at, dead_lettered_at}. It goes to the policy's dead-letter queue as
-- a new message, or, without one, to the queue's own archive (keeping its
-- msg_id). pgbroker.dead_letters, replay_dead_letters and purge_dead_letters
-- find a queue's dead letters wherever its policy sends them now.

-- No column defaults: the defaults are written once, in pgbroker.policy().
CREATE TABLE pgbroker.queue_policy (
    queue_name varchar PRIMARY KEY
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE,
    max_deliveries integer CHECK (max_deliveries >= 1),                       -- NULL: unlimited
    backoff text NOT NULL CHECK (backoff IN ('fixed', 'exponential')),
    backoff_base_seconds integer NOT NULL CHECK (backoff_base_seconds >= 0),
    backoff_max_seconds integer NOT NULL,
    backoff_jitter boolean NOT NULL,
    dead_letter_queue varchar                                                 -- NULL: the archive
        REFERENCES pgmq.meta (queue_name) ON DELETE SET NULL,
    ack_mode text NOT NULL CHECK (ack_mode IN ('archive', 'delete')),
    max_depth bigint CHECK (max_depth >= 1),                                  -- NULL: unbounded
    archive_retention_seconds bigint CHECK (archive_retention_seconds >= 1),  -- NULL: forever
    archive_max_rows bigint CHECK (archive_max_rows >= 1),                    -- NULL: unbounded
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK (backoff_max_seconds >= backoff_base_seconds),
    CHECK (dead_letter_queue IS DISTINCT FROM queue_name)
);

-- The policy in force: the queue's row, or the defaults when it has none.
-- pgbroker.read asks on every call, so the usual case is one statement: a
-- probe of meta (as pgbroker._table makes) and one of the policy table.
CREATE FUNCTION pgbroker.policy(queue_name text)
RETURNS pgbroker.queue_policy LANGUAGE plpgsql STABLE AS $$
DECLARE
    hit record;
    found_policy pgbroker.queue_policy;
BEGIN
    SELECT m.queue_name AS stored, p AS row INTO hit
    FROM pgmq.meta m LEFT JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
    WHERE lower(m.queue_name) = lower(policy.queue_name);
    IF NOT FOUND THEN
        PERFORM pgbroker._table(queue_name);  -- PB001/PB002, naming the problem
    END IF;
    found_policy := hit.row;
    IF found_policy.queue_name IS NULL THEN
        found_policy.queue_name := hit.stored;
        found_policy.backoff := 'exponential';
        found_policy.backoff_base_seconds := 1;
        found_policy.backoff_max_seconds := 300;
        found_policy.backoff_jitter := true;
        found_policy.ack_mode := 'archive';
        found_policy.updated_at := now();
        -- max_deliveries, dead_letter_queue, max_depth and the retention stay NULL: off.
    END IF;
    RETURN found_policy;
END;
$$;

-- Every queue's policy, by queue name.
CREATE FUNCTION pgbroker.policies()
RETURNS SETOF pgbroker.queue_policy LANGUAGE sql STABLE AS $$
    SELECT p.* FROM pgmq.meta m CROSS JOIN LATERAL pgbroker.policy(m.queue_name) p ORDER BY m.queue_name;
$$;

-- Change a queue's policy; returns it. A NULL argument leaves that setting as
-- it is; 0 turns max_deliveries, max_depth, archive_retention_seconds and
-- archive_max_rows off, and '' removes the dead-letter queue.
CREATE FUNCTION pgbroker.set_policy(
    queue_name text,
    max_deliveries integer DEFAULT NULL,
    backoff text DEFAULT NULL,
    backoff_base_seconds integer DEFAULT NULL,
    backoff_max_seconds integer DEFAULT NULL,
    backoff_jitter boolean DEFAULT NULL,
    dead_letter_queue text DEFAULT NULL,
    ack_mode text DEFAULT NULL,
    max_depth bigint DEFAULT NULL,
    archive_retention_seconds bigint DEFAULT NULL,
    archive_max_rows bigint DEFAULT NULL
)
RETURNS pgbroker.queue_policy LANGUAGE plpgsql AS $$
DECLARE
    p pgbroker.queue_policy;
    dlq varchar;
BEGIN
    PERFORM pgbroker._table(queue_name);
    PERFORM pgbroker._check_arg(max_deliveries IS NULL OR max_deliveries >= 0,
        format('max_deliveries must be >= 0 (0: unlimited), got %s', max_deliveries));
    PERFORM pgbroker._check_arg(backoff IS NULL OR backoff IN ('fixed', 'exponential'),
        format('backoff must be ''fixed'' or ''exponential'', got %L', backoff));
    PERFORM pgbroker._check_arg(backoff_base_seconds IS NULL OR backoff_base_seconds >= 0,
        format('backoff_base_seconds must be >= 0, got %s', backoff_base_seconds));
    PERFORM pgbroker._check_arg(backoff_max_seconds IS NULL OR backoff_max_seconds >= 0,
        format('backoff_max_seconds must be >= 0, got %s', backoff_max_seconds));
    PERFORM pgbroker._check_arg(ack_mode IS NULL OR ack_mode IN ('archive', 'delete'),
        format('ack_mode must be ''archive'' or ''delete'', got %L', ack_mode));
    PERFORM pgbroker._check_arg(max_depth IS NULL OR max_depth >= 0,
        format('max_depth must be >= 0 (0: unbounded), got %s', max_depth));
    PERFORM pgbroker._check_arg(archive_retention_seconds IS NULL OR archive_retention_seconds >= 0,
        format('archive_retention_seconds must be >= 0 (0: forever), got %s', archive_retention_seconds));
    PERFORM pgbroker._check_arg(archive_max_rows IS NULL OR archive_max_rows >= 0,
        format('archive_max_rows must be >= 0 (0: unbounded), got %s', archive_max_rows));
    IF dead_letter_queue <> '' THEN
        PERFORM pgbroker._table(dead_letter_queue);
        dlq := pgbroker._stored_name(dead_letter_queue);
        PERFORM pgbroker._check_arg(dlq <> pgbroker._stored_name(queue_name),
            'a queue cannot be its own dead-letter queue',
            'Create a separate queue, e.g. ''' || queue_name || '_dlq''.');
    END IF;

    -- Changes of one queue's policy take turns (as its create and drop do), so
    -- that two callers changing different settings both keep theirs; the read
    -- below is a new statement, so it sees the previous caller's commit.
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.queue:' || lower(queue_name)));
    p := pgbroker.policy(queue_name);
    p.max_deliveries := CASE WHEN max_deliveries = 0 THEN NULL
                             ELSE coalesce(max_deliveries, p.max_deliveries) END;
    p.backoff := coalesce(backoff, p.backoff);
    p.backoff_base_seconds := coalesce(backoff_base_seconds, p.backoff_base_seconds);
    p.backoff_max_seconds := coalesce(backoff_max_seconds, p.backoff_max_seconds);
    p.backoff_jitter := coalesce(backoff_jitter, p.backoff_jitter);
    p.dead_letter_queue := CASE WHEN dead_letter_queue = '' THEN NULL
                                ELSE coalesce(dlq, p.dead_letter_queue) END;
    p.ack_mode := coalesce(ack_mode, p.ack_mode);
    p.max_depth := CASE WHEN max_depth = 0 THEN NULL ELSE coalesce(max_depth, p.max_depth) END;
    p.archive_retention_seconds := CASE WHEN archive_retention_seconds = 0 THEN NULL
                                        ELSE coalesce(archive_retention_seconds, p.archive_retention_seconds) END;
    p.archive_max_rows := CASE WHEN archive_max_rows = 0 THEN NULL
                               ELSE coalesce(archive_max_rows, p.archive_max_rows) END;
    PERFORM pgbroker._check_arg(p.backoff_max_seconds >= p.backoff_base_seconds,
        format('backoff_max_seconds (%s) must be >= backoff_base_seconds (%s)',
               p.backoff_max_seconds, p.backoff_base_seconds),
        'Exponential back-off doubles from the base up to the max; fixed back-off uses the base.');
    p.updated_at := now();

    INSERT INTO pgbroker.queue_policy VALUES (p.*)
    ON CONFLICT ON CONSTRAINT queue_policy_pkey DO UPDATE SET
        max_deliveries = EXCLUDED.max_deliveries,
        backoff = EXCLUDED.backoff,
        backoff_base_seconds = EXCLUDED.backoff_base_seconds,
        backoff_max_seconds = EXCLUDED.backoff_max_seconds,
        backoff_jitter = EXCLUDED.backoff_jitter,
        dead_letter_queue = EXCLUDED.dead_letter_queue,
        ack_mode = EXCLUDED.ack_mode,
        max_depth = EXCLUDED.max_depth,
        archive_retention_seconds = EXCLUDED.archive_retention_seconds,
        archive_max_rows = EXCLUDED.archive_max_rows,
        updated_at = EXCLUDED.updated_at;
    RETURN p;
END;
$$;

-- Seconds to wait before the next delivery after the read_ct-th one failed.
-- Exponential back-off doubles from the base up to the max; jitter draws the
-- delay from its upper half, so that messages that failed together (a
-- dependency down) come back spread out rather than all at once.
CREATE FUNCTION pgbroker.retry_delay(p pgbroker.queue_policy, read_ct integer)
RETURNS integer LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN p.backoff_jitter THEN ceil(d / 2.0 + random() * d / 2.0)::integer ELSE d END
    FROM (SELECT CASE p.backoff
                     WHEN 'fixed' THEN p.backoff_base_seconds
                     ELSE least(p.backoff_max_seconds::numeric,
                                p.backoff_base_seconds * power(2::numeric, least(greatest(read_ct - 1, 0), 40)))
                 END::integer AS d) AS delay;
$$;

------------------------------------------------------------------------------
-- Acknowledging by policy
------------------------------------------------------------------------------

-- Ack many with the policy's ack_mode (archive or delete); returns the
-- msg_ids whose receipts still held, as pgbroker.ack does.
CREATE FUNCTION pgbroker.complete(queue_name text, receipts text[])
RETURNS SETOF bigint LANGUAGE sql AS $$
    SELECT pgbroker.ack(queue_name, receipts, (pgbroker.policy(queue_name)).ack_mode = 'archive');
$$;

------------------------------------------------------------------------------
-- Dead letters
------------------------------------------------------------------------------

-- The table a queue's dead letters go to: its dead-letter queue, or its archive.
CREATE FUNCTION pgbroker._dead_letter_table(p pgbroker.queue_policy)
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
CREATE FUNCTION pgbroker._dead_letter(queue_name text, msg_ids bigint[], error text, deliveries_counted integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    p pgbroker.queue_policy := pgbroker.policy(queue_name);
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
    ELSE
        -- A new message of the dead-letter queue, ready at once (vt = enqueued_at, as a send makes it).
        EXECUTE format(
            $Q$
            WITH %s
            INSERT INTO pgmq.%I (vt, message, headers)
            SELECT now(), message, headers FROM moved ORDER BY msg_id
            $Q$, moved, pgbroker._dead_letter_table(p))
            USING msg_ids, p.queue_name, error, deliveries_counted;
    END IF;
END;
$$;

-- A consumer failed to process messages it holds: give each back with the
-- policy's back-off, or dead-letter it when this was its last allowed
-- delivery. Returns (msg_id, 'retry' | 'dead_lettered') for the receipts that
-- still held; stale ones are skipped and change nothing.
CREATE FUNCTION pgbroker.fail(queue_name text, receipts text[], error text DEFAULT NULL)
RETURNS TABLE (msg_id bigint, outcome text) LANGUAGE plpgsql AS $$
DECLARE
    p pgbroker.queue_policy := pgbroker.policy(queue_name);
    one text;
    held record;
BEGIN
    FOREACH one IN ARRAY coalesce(receipts, '{}') LOOP
        held := pgbroker._parse_receipt(one);
        IF p.max_deliveries IS NOT NULL AND held.read_ct >= p.max_deliveries THEN
            -- Lock the row and check the receipt first, so that a stale one moves nothing.
            CONTINUE WHEN NOT EXISTS (SELECT 1 FROM pgbroker.extend(queue_name, ARRAY[one], 0));
            PERFORM pgbroker._dead_letter(queue_name, ARRAY[held.msg_id],
                                          coalesce(error, 'failed (no error given)'), 0);
            outcome := 'dead_lettered';
        ELSE
            CONTINUE WHEN NOT EXISTS (
                SELECT 1 FROM pgbroker.nack(queue_name, ARRAY[one], pgbroker.retry_delay(p, held.read_ct)));
            outcome := 'retry';
        END IF;
        msg_id := held.msg_id;
        RETURN NEXT;
    END LOOP;
END;
$$;

CREATE FUNCTION pgbroker.fail(queue_name text, receipt text, error text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    result text;
BEGIN
    SELECT f.outcome INTO result FROM pgbroker.fail(queue_name, ARRAY[receipt], error) f;
    IF result IS NULL THEN
        PERFORM pgbroker._raise_stale(queue_name, receipt);
    END IF;
    RETURN result;
END;
$$;

-- Read like pgmq.read with a receipt per message, honouring max_deliveries:
-- a message that was already delivered max_deliveries times (each consumer
-- died or let its lease run out) is dead-lettered instead of delivered again,
-- so a read may return fewer messages than qty while more are waiting.
CREATE OR REPLACE FUNCTION pgbroker.read(queue_name text, vt integer, qty integer, conditional jsonb DEFAULT '{}')
RETURNS SETOF pgbroker.delivery LANGUAGE plpgsql AS $$
DECLARE
    max_deliveries integer := (pgbroker.policy(queue_name)).max_deliveries;
    batch pgbroker.delivery[];
    over bigint[];
BEGIN
    IF max_deliveries IS NULL THEN
        RETURN QUERY SELECT m.*, pgbroker.receipt(m.msg_id, m.read_ct, m.vt)
                     FROM pgmq.read(queue_name, vt, qty, conditional) m;
        RETURN;
    END IF;
    batch := ARRAY(SELECT ROW(m.*, pgbroker.receipt(m.msg_id, m.read_ct, m.vt))::pgbroker.delivery
                   FROM pgmq.read(queue_name, vt, qty, conditional) m ORDER BY m.msg_id);
    over := ARRAY(SELECT b.msg_id FROM unnest(batch) b WHERE b.read_ct > max_deliveries);
    IF cardinality(over) > 0 THEN
        PERFORM pgbroker._dead_letter(queue_name, over,
            format('delivered %s times without an ack or a failure report '
                   '(its consumers died or let their leases run out)', max_deliveries),
            -1);
    END IF;
    RETURN QUERY SELECT * FROM unnest(batch) b WHERE b.read_ct <= max_deliveries;
END;
$$;

-- As in 0002, but polling pgbroker.read, so that waiting reads honour
-- max_deliveries too. (pgbroker._poll returns message records: the receipt is
-- made again from msg_id, read_ct and vt, as pgbroker.read makes it.)
CREATE OR REPLACE FUNCTION pgbroker.read_with_poll(
    queue_name text, vt integer, qty integer,
    max_poll_seconds integer DEFAULT 5, poll_interval_ms integer DEFAULT 100,
    conditional jsonb DEFAULT '{}')
RETURNS SETOF pgbroker.delivery LANGUAGE sql AS $$
    SELECT m.*, pgbroker.receipt(m.msg_id, m.read_ct, m.vt)
    FROM pgbroker._poll(
        format('SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers'
               ' FROM pgbroker.read(%L, %s, %s, %L)',
               queue_name, coalesce(vt::text, 'NULL'), coalesce(qty::text, 'NULL'), conditional),
        max_poll_seconds, poll_interval_ms) m;
$$;

-- A queue's dead letters, oldest first: up to qty after msg_id after_msg_id
-- (ids of the table they are in: the dead-letter queue, or the archive).
CREATE FUNCTION pgbroker.dead_letters(queue_name text, qty integer DEFAULT 100, after_msg_id bigint DEFAULT 0)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql STABLE AS $$
DECLARE
    p pgbroker.queue_policy := pgbroker.policy(queue_name);
BEGIN
    PERFORM pgbroker._check_read_args(0, qty);
    RETURN QUERY EXECUTE format(
        $Q$
        SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers FROM pgmq.%I
        WHERE headers -> 'x-pgbroker-dead-letter' ->> 'queue' = $1 AND msg_id > $2
        ORDER BY msg_id LIMIT $3
        $Q$, pgbroker._dead_letter_table(p))
    USING p.queue_name, coalesce(after_msg_id, 0), qty;
END;
$$;

-- Send a queue's dead letters back to it as new messages (the
-- x-pgbroker-dead-letter header removed, deliveries counted from 0 again):
-- all of them, or those of msg_ids. The queue's max_depth applies, all or
-- nothing. Returns (dead_letter_id, msg_id): the letter's id where it was,
-- and the new message's id in the queue.
CREATE FUNCTION pgbroker.replay_dead_letters(queue_name text, msg_ids bigint[] DEFAULT NULL)
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
            WHERE headers -> 'x-pgbroker-dead-letter' ->> 'queue' = $1 AND ($2::bigint[] IS NULL OR msg_id = ANY ($2))
            RETURNING msg_id, message, nullif(headers - 'x-pgbroker-dead-letter', '{}'::jsonb) AS headers
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
                                      ARRAY(SELECT pgbroker._send_many(p.queue_name, messages, letter_headers, NULL)));
END;
$$;

-- Delete a queue's dead letters: all of them, or those of msg_ids. Returns how many.
CREATE FUNCTION pgbroker.purge_dead_letters(queue_name text, msg_ids bigint[] DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    p pgbroker.queue_policy := pgbroker.policy(queue_name);
    purged bigint;
BEGIN
    EXECUTE format(
        $Q$
        DELETE FROM pgmq.%I
        WHERE headers -> 'x-pgbroker-dead-letter' ->> 'queue' = $1 AND ($2::bigint[] IS NULL OR msg_id = ANY ($2))
        $Q$, pgbroker._dead_letter_table(p))
        USING p.queue_name, msg_ids;
    GET DIAGNOSTICS purged = ROW_COUNT;
    RETURN purged;
END;
$$;

------------------------------------------------------------------------------
-- Backpressure
------------------------------------------------------------------------------

-- Refuse a send that would take the queue past its max_depth. The cheap
-- upper bound (ids handed out minus the oldest id present) settles almost
-- every send in two index probes; only near the limit is the queue counted,
-- and then at most max_depth + 1 rows (an index-only walk, ~10 ms per 100,000
-- rows: keep max_depth in that range, it is a safety limit). In-flight and
-- delayed messages count: they are still in the queue. Concurrent senders
-- may overshoot by what their uncommitted transactions hold: the limit
-- protects the disk, it is not a counter.
CREATE FUNCTION pgbroker._check_depth(queue_name text, qtable text, incoming integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    max_depth bigint;
    upper_bound bigint;
    depth bigint;
BEGIN
    SELECT p.max_depth INTO max_depth
    FROM pgmq.meta m JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
    WHERE lower(m.queue_name) = lower(_check_depth.queue_name);
    IF max_depth IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format('SELECT (SELECT last_value FROM %s) - coalesce((SELECT min(msg_id) FROM pgmq.%I), 0) + 1',
                   pg_get_serial_sequence(format('pgmq.%I', qtable), 'msg_id'), qtable) INTO upper_bound;
    IF upper_bound + incoming <= max_depth THEN
        RETURN;
    END IF;
    EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM pgmq.%I LIMIT $1) AS q', qtable)
        INTO depth USING max_depth + 1;
    IF depth + incoming > max_depth THEN
        RAISE EXCEPTION 'queue "%" is full: % messages in it, % more would pass its max_depth of %',
            queue_name, depth, incoming, max_depth
            USING ERRCODE = 'PB006',
                  HINT = 'Consume faster, send again later (the clients'' send(..., wait=seconds) does), '
                         'or raise the limit: pgbroker policy set ' || queue_name || ' --max-depth N';
    END IF;
END;
$$;

-- As in 0001, with the depth check before the insert.
CREATE OR REPLACE FUNCTION pgbroker._send_many(queue_name text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
    max_size bigint;
BEGIN
    PERFORM pgbroker._check_batch(msgs, headers);
    -- A message's size counts its headers too: both are stored in its row.
    -- unnest(msgs, headers) walks both arrays once; headers[n] per row would
    -- walk the array for every message (quadratic in the batch).
    SELECT max(pg_column_size(m.msg) + coalesce(pg_column_size(m.hdr), 0)) INTO max_size
    FROM unnest(msgs, headers) AS m(msg, hdr);
    PERFORM pgbroker._check_message_size(max_size);
    PERFORM pgbroker._check_depth(queue_name, qtable, cardinality(msgs));
    RETURN QUERY EXECUTE format(
        $Q$
        INSERT INTO pgmq.%I (vt, message, headers)
        SELECT coalesce($3, now()), m.msg, m.hdr
        FROM unnest($1, $2) WITH ORDINALITY AS m(msg, hdr, n)
        ORDER BY m.n
        RETURNING msg_id
        $Q$, qtable)
    USING msgs, headers, delay;
END;
$$;

------------------------------------------------------------------------------
-- Archive retention (for non-partitioned queues; partitioned archives follow
-- pg_partman's retention, see 0006). Deletes at most batch_size rows per
-- call, so that each call is a short transaction; callers repeat until it
-- returns 0 (pgbroker maintain does).
------------------------------------------------------------------------------

CREATE FUNCTION pgbroker.trim_archive(queue_name text, batch_size integer DEFAULT 10000)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    atable text := pgbroker._table(queue_name, 'a');
    p pgbroker.queue_policy := pgbroker.policy(queue_name);
    deleted bigint := 0;
    n bigint;
    cutoff timestamptz;
BEGIN
    PERFORM pgbroker._check_arg(batch_size IS NOT NULL AND batch_size >= 1,
        format('batch_size must be >= 1, got %s', coalesce(batch_size::text, 'NULL')));
    IF p.archive_retention_seconds IS NOT NULL THEN
        EXECUTE format(
            $Q$
            DELETE FROM pgmq.%1$I WHERE msg_id IN (
                SELECT msg_id FROM pgmq.%1$I WHERE archived_at < now() - make_interval(secs => $1)
                ORDER BY archived_at LIMIT $2)
            $Q$, atable) USING p.archive_retention_seconds, batch_size;
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END IF;
    IF p.archive_max_rows IS NOT NULL AND deleted < batch_size THEN
        -- The archived_at of the archive_max_rows-th newest row (a walk of
        -- that many entries of the archived_at index); older rows go. Rows
        -- archived by one statement share archived_at, so those tied with it
        -- stay: at least archive_max_rows rows are kept.
        EXECUTE format('SELECT archived_at FROM pgmq.%I ORDER BY archived_at DESC OFFSET $1 LIMIT 1', atable)
            INTO cutoff USING p.archive_max_rows - 1;
        IF cutoff IS NOT NULL THEN
            EXECUTE format(
                $Q$
                DELETE FROM pgmq.%1$I WHERE msg_id IN (
                    SELECT msg_id FROM pgmq.%1$I WHERE archived_at < $1 ORDER BY archived_at LIMIT $2)
                $Q$, atable) USING cutoff, batch_size - deleted;
            GET DIAGNOSTICS n = ROW_COUNT;
            deleted := deleted + n;
        END IF;
    END IF;
    RETURN deleted;
END;
$$;

-- Peek at messages without leasing them (dashboards, debugging).
CREATE FUNCTION pgbroker.peek(queue_name text, qty integer DEFAULT 10, after_msg_id bigint DEFAULT 0)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql STABLE AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
BEGIN
    PERFORM pgbroker._check_read_args(0, qty);
    RETURN QUERY EXECUTE format(
        'SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers FROM pgmq.%I'
        ' WHERE msg_id > $1 ORDER BY msg_id LIMIT $2', qtable)
    USING coalesce(after_msg_id, 0), qty;
END;
$$;
