-- Spark: what the PySpark connector (pgbroker.spark) keeps in the database.
--
-- Spark's exactly-once needs three things from a source and a sink: a batch
-- that can be read again exactly as it was, a sink that recognises a batch it
-- already wrote, and source messages released only after their batch is
-- committed. Everything here serves one of them, in SQL so that the rules are
-- written once and any client can inspect them:
--
-- * Log mode (Spark is the queue's only consumer, or reads the archive):
--   offsets are msg_ids. msg_id order is not commit order, so a stream that
--   reads "msg_id > last" loses the message of a producer that took its id
--   early and committed late. pgbroker.spark_safe_watermark returns the
--   largest msg_id below which nothing can still appear. pgbroker.spark_release
--   archives or deletes a committed range.
-- * Claim mode (Spark shares the queue with other consumers): a micro-batch
--   is a claim, messages leased through pgbroker.read and recorded with their
--   receipts under (consumer, seq), so that a restarted query reads the same
--   batch again; leases are renewed through pgbroker.extend while the batch is
--   in flight and acknowledged through pgbroker.ack once Spark committed it.
-- * Exactly-once sink: a writer task records (query, batch, partition) in the
--   same transaction as the messages it sends; a retried or replayed task
--   finds the key and sends nothing.

------------------------------------------------------------------------------
-- Log mode
------------------------------------------------------------------------------

-- The largest msg_id M such that every message with msg_id <= M is either
-- committed or will never exist: a stream that reads up to M now and later
-- reads only above M loses nothing. NULL when a transaction that may still
-- commit such a message did not end within wait_ms (the caller keeps its old
-- offset and asks again later).
--
-- How: read the last msg_id handed out by the queue's sequence (L), then list
-- the transactions holding ROW EXCLUSIVE on the queue table. Any transaction
-- that took an id <= L took that lock before it called nextval (INSERT and
-- COPY open their target table first) and keeps it until it ends, so it is
-- in the list; once every listed transaction has ended, each id <= L is
-- committed, rolled back, or was never used. New transactions take ids > L.
-- Nothing is locked: producers never wait for this function; it waits for
-- them, only for those that were already writing. Needs the sequence to hand
-- out ids one at a time (CACHE 1, increment 1: identity columns' default);
-- a cache lets a session hold ids <= L that it has not used yet.
--
-- ignore_pids: backends known never to send to the queue (the caller's own
-- releaser, which only deletes), not worth waiting for.
--
-- With archive = true the stream reads the archive, which receives old ids
-- whenever a message is acknowledged: the watermark then also stays below the
-- oldest message still in the queue table, and waits for writers of the
-- archive as well.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_safe_watermark(queue_name text, archive boolean DEFAULT false,
                                              wait_ms integer DEFAULT 2000,
                                              ignore_pids integer[] DEFAULT '{}')
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
    tables oid[];
    seq regclass;
    seq_row record;
    issued bigint;
    writers text[];
    deadline timestamptz;
    oldest_queued bigint;
BEGIN
    PERFORM pgbroker._check_arg(archive IS NOT NULL, 'archive must be true or false, got NULL');
    PERFORM pgbroker._check_arg(wait_ms IS NOT NULL AND wait_ms >= 0,
        format('wait_ms must be >= 0, got %s', coalesce(wait_ms::text, 'NULL')));
    -- Each statement below must see what committed before it started.
    PERFORM pgbroker._check_arg(current_setting('transaction_isolation') = 'read committed',
        format('spark_safe_watermark needs READ COMMITTED, not %s',
               upper(current_setting('transaction_isolation'))),
        'Call it in its own transaction (autocommit).');

    seq := pg_get_serial_sequence(format('pgmq.%I', qtable), 'msg_id')::regclass;
    SELECT s.seqcache, s.seqincrement INTO seq_row FROM pg_sequence s WHERE s.seqrelid = seq;
    IF seq_row.seqcache <> 1 OR seq_row.seqincrement <> 1 THEN
        RAISE EXCEPTION 'the msg_id sequence of queue "%" has CACHE % and INCREMENT %: log mode needs 1 and 1',
            queue_name, seq_row.seqcache, seq_row.seqincrement
            USING ERRCODE = 'PB007',
                  HINT = format('ALTER SEQUENCE %s CACHE 1 INCREMENT 1; or read the queue in claim mode.', seq);
    END IF;

    tables := ARRAY[format('pgmq.%I', qtable)::regclass::oid];
    IF archive THEN
        tables := tables || format('pgmq.%I', 'a' || substr(qtable, 2))::regclass::oid;
    END IF;

    -- 1. The last id handed out (NULL: none yet). Sequences are not
    --    transactional: this is the latest value, whatever our snapshot.
    issued := coalesce(pg_sequence_last_value(seq), 0);

    -- 2. Who may still commit one of those ids.
    --    (A prepared transaction has no pid: it is waited for.)
    writers := pgbroker._writers(tables, ignore_pids);

    -- 3. Wait for them to end. A virtual transaction id is never reused by a
    --    later transaction, so once it is gone from pg_locks, so is the writer.
    deadline := clock_timestamp() + wait_ms * interval '1 millisecond';
    WHILE cardinality(writers) > 0 LOOP
        IF clock_timestamp() >= deadline THEN
            RETURN NULL;
        END IF;
        PERFORM pg_sleep(0.002);
        writers := ARRAY(SELECT w FROM unnest(writers) w WHERE w = ANY (pgbroker._writers(tables, ignore_pids)));
    END LOOP;

    -- 4. The archive receives any message still in the queue, whatever its id.
    IF archive THEN
        EXECUTE format('SELECT min(msg_id) FROM pgmq.%I', qtable) INTO oldest_queued;
        IF oldest_queued IS NOT NULL THEN
            issued := least(issued, oldest_queued - 1);
        END IF;
    END IF;
    RETURN issued;
END;
$$;

-- Release a range Spark has committed: archive (or delete) every message with
-- after_id < msg_id <= up_to. Cumulative and idempotent, because Spark may
-- skip a commit call or repeat one; returns how many messages it moved.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_release(queue_name text, after_id bigint, up_to bigint,
                                       archive boolean DEFAULT true)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
    released bigint;
BEGIN
    PERFORM pgbroker._check_arg(after_id IS NOT NULL AND up_to IS NOT NULL,
        'after_id and up_to must not be NULL');
    PERFORM pgbroker._check_arg(archive IS NOT NULL, 'archive must be true or false, got NULL');
    EXECUTE format(
        $Q$
        WITH removed AS (
            DELETE FROM pgmq.%1$I WHERE msg_id > $1 AND msg_id <= $2
            RETURNING msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers
        ),
        archived AS (
            INSERT INTO pgmq.%2$I (msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers)
            SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers FROM removed
            WHERE $3
        )
        SELECT count(*) FROM removed
        $Q$, qtable, 'a' || substr(qtable, 2))
    INTO released
    USING after_id, up_to, archive;
    RETURN released;
END;
$$;

-- Register (or find) a consumer of a queue; returns its released_seq, the
-- offset a new streaming query starts from.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_consumer(consumer text, queue_name text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    stored varchar;
    found pgbroker.spark_consumers;
BEGIN
    PERFORM pgbroker._table(queue_name);  -- PB001/PB002 for a bad or missing queue
    PERFORM pgbroker._check_arg(consumer IS NOT NULL AND consumer <> '',
        'consumer must be a non-empty name',
        'Name the streaming query, for example ''orders-to-lake''; keep the name across restarts.');
    SELECT m.queue_name INTO stored FROM pgmq.meta m WHERE lower(m.queue_name) = lower(spark_consumer.queue_name);
    INSERT INTO pgbroker.spark_consumers AS c (consumer, queue_name) VALUES (consumer, stored)
    ON CONFLICT ON CONSTRAINT spark_consumers_pkey DO NOTHING;
    SELECT * INTO found FROM pgbroker.spark_consumers c WHERE c.consumer = spark_consumer.consumer;
    IF found.queue_name <> stored THEN
        RAISE EXCEPTION 'consumer "%" already reads queue "%", not "%"', consumer, found.queue_name, stored
            USING ERRCODE = 'PB007',
                  HINT = 'Give each streaming query its own consumer name.';
    END IF;
    RETURN found.released_seq;
END;
$$;

-- Claim up to qty messages as claim (consumer, seq), leased for vt seconds
-- through pgbroker.read; returns how many messages the claim holds (0: there
-- was nothing to read and no claim was recorded).
--
-- If the claim already exists (recorded before a crash, or Spark asked twice)
-- it is renewed and reused, never read anew: the batch must be the same.
-- With max_msg_id (Trigger.AvailableNow) a claim takes no message newer than
-- it: a read that got newer ones is rolled back and done again for as many
-- messages as it found at or below max_msg_id; if a concurrent reader still
-- makes the second read overshoot, its messages are kept (they are leased).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_claim(consumer text, seq bigint, qty integer, vt integer,
                                     max_msg_id bigint DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    owner pgbroker.spark_consumers;
    existing pgbroker.spark_claims;
    got pgbroker.delivery[];
    wanted integer := qty;
BEGIN
    PERFORM pgbroker._check_arg(qty IS NOT NULL AND qty >= 1, format('qty must be >= 1, got %s', qty));
    PERFORM pgbroker._check_arg(vt IS NOT NULL AND vt >= 1, format('vt must be >= 1 second, got %s', vt));
    -- Serialises every claim, renewal and release of one consumer.
    SELECT * INTO owner FROM pgbroker.spark_consumers c WHERE c.consumer = spark_claim.consumer FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown consumer "%"', consumer
            USING ERRCODE = 'PB007', HINT = 'Register it first: SELECT pgbroker.spark_consumer(consumer, queue).';
    END IF;
    SELECT * INTO existing FROM pgbroker.spark_claims c WHERE c.consumer = spark_claim.consumer AND c.seq = spark_claim.seq;
    IF FOUND THEN
        PERFORM pgbroker.spark_renew(consumer, vt);
        RETURN cardinality(existing.msg_ids);
    END IF;
    PERFORM pgbroker._check_arg(seq > owner.released_seq,
        format('claim %s of consumer "%s" was already released (released up to %s)',
               seq, consumer, owner.released_seq),
        'The checkpoint is older than the consumer''s state: use a new consumer name for a new checkpoint.');

    FOR attempt IN 1..2 LOOP
        BEGIN
            got := ARRAY(SELECT d FROM pgbroker.read(owner.queue_name, vt, wanted) d);
            IF attempt = 1 AND max_msg_id IS NOT NULL
               AND EXISTS (SELECT 1 FROM unnest(got) g WHERE g.msg_id > max_msg_id) THEN
                wanted := (SELECT count(*) FROM unnest(got) g WHERE g.msg_id <= max_msg_id);
                -- Undo the read: leaving the subtransaction by an error rolls it back.
                RAISE EXCEPTION 'claim overshot max_msg_id' USING ERRCODE = 'PBX01';
            END IF;
            EXIT;
        EXCEPTION WHEN SQLSTATE 'PBX01' THEN
            got := '{}';
            EXIT WHEN wanted = 0;
        END;
    END LOOP;

    IF cardinality(got) = 0 THEN
        RETURN 0;
    END IF;
    INSERT INTO pgbroker.spark_claims (consumer, seq, msg_ids, receipts)
    SELECT consumer, seq, array_agg(g.msg_id ORDER BY g.msg_id), array_agg(g.receipt ORDER BY g.msg_id)
    FROM unnest(got) g;
    RETURN cardinality(got);
END;
$$;

-- Renew the leases of every unreleased claim of a consumer for vt seconds
-- from now. A receipt that no longer holds becomes NULL: that message left
-- the claim. Returns how many leases were lost by this renewal.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_renew(consumer text, vt integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    queue varchar;
    claim pgbroker.spark_claims;
    renewed text[];
    lost integer := 0;
BEGIN
    PERFORM pgbroker._check_arg(vt IS NOT NULL AND vt >= 1, format('vt must be >= 1 second, got %s', vt));
    SELECT c.queue_name INTO queue FROM pgbroker.spark_consumers c WHERE c.consumer = spark_renew.consumer FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    FOR claim IN
        SELECT * FROM pgbroker.spark_claims c WHERE c.consumer = spark_renew.consumer ORDER BY c.seq FOR UPDATE
    LOOP
        WITH extended AS MATERIALIZED (
            SELECT e.msg_id, e.receipt FROM pgbroker.extend(queue, array_remove(claim.receipts, NULL), vt) e
        )
        SELECT array_agg(x.receipt ORDER BY u.n) INTO renewed
        FROM unnest(claim.msg_ids) WITH ORDINALITY AS u(msg_id, n)
        LEFT JOIN extended x ON x.msg_id = u.msg_id;
        lost := lost + cardinality(array_remove(claim.receipts, NULL)) - cardinality(array_remove(renewed, NULL));
        UPDATE pgbroker.spark_claims c SET receipts = renewed, renewed_at = now()
        WHERE c.consumer = claim.consumer AND c.seq = claim.seq;
    END LOOP;
    RETURN lost;
END;
$$;

-- Acknowledge (archive, or delete) the messages of every claim up to seq
-- through pgbroker.ack, and forget those claims. Cumulative and idempotent;
-- returns how many messages were acknowledged.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_release_claims(consumer text, up_to_seq bigint, archive boolean DEFAULT true)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    queue varchar;
    claim pgbroker.spark_claims;
    acked bigint := 0;
BEGIN
    PERFORM pgbroker._check_arg(up_to_seq IS NOT NULL, 'up_to_seq must not be NULL');
    PERFORM pgbroker._check_arg(archive IS NOT NULL, 'archive must be true or false, got NULL');
    SELECT c.queue_name INTO queue FROM pgbroker.spark_consumers c
    WHERE c.consumer = spark_release_claims.consumer FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown consumer "%"', consumer USING ERRCODE = 'PB007';
    END IF;
    FOR claim IN
        DELETE FROM pgbroker.spark_claims c
        WHERE c.consumer = spark_release_claims.consumer AND c.seq <= up_to_seq
        RETURNING *
    LOOP
        acked := acked + (SELECT count(*) FROM pgbroker.ack(queue, array_remove(claim.receipts, NULL), archive));
    END LOOP;
    UPDATE pgbroker.spark_consumers c SET released_seq = greatest(c.released_seq, up_to_seq)
    WHERE c.consumer = spark_release_claims.consumer;
    RETURN acked;
END;
$$;

-- Called first in a writer task's transaction: true when this task is to
-- send the partition, false when an earlier attempt already did (and
-- committed). A concurrent attempt for the same key waits here until the
-- first one commits or rolls back.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_sink_begin(query_id text, batch_id bigint, partition_id integer, queue_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pgbroker.spark_sink_commits (query_id, batch_id, partition_id, queue_name)
    VALUES (query_id, batch_id, partition_id, queue_name)
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END;
$$;

-- Record how many messages the partition sent (same transaction as begin).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_sink_finish(query_id text, batch_id bigint, partition_id integer, messages bigint)
RETURNS void LANGUAGE sql AS $$
    UPDATE pgbroker.spark_sink_commits c SET messages = spark_sink_finish.messages, committed_at = now()
    WHERE c.query_id = spark_sink_finish.query_id AND c.batch_id = spark_sink_finish.batch_id
      AND c.partition_id = spark_sink_finish.partition_id;
$$;

-- Forget the keys of batches before before_batch: Spark replays only the
-- last batch of a query, so older keys can never match again. Returns how
-- many keys were dropped.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_sink_forget(query_id text, before_batch bigint)
RETURNS bigint LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM pgbroker.spark_sink_commits c
        WHERE c.query_id = spark_sink_forget.query_id AND c.batch_id < before_batch
        RETURNING 1
    )
    SELECT count(*) FROM gone;
$$;

------------------------------------------------------------------------------
-- Pause and limits
------------------------------------------------------------------------------

-- A paused queue (pgbroker.pause) gives its consumers nothing, and a limited
-- one (max_in_flight, max_in_flight_per_key, rate_limit_per_second) gives them
-- only what its limits allow; Spark's streams are consumers like any other:
--
-- * Claim mode reads through pgbroker.read, so both already hold: a claim of a
--   paused queue finds nothing (no micro-batch until the queue resumes), and a
--   claim's messages stay leased, counting against max_in_flight, until their
--   batch is committed. pgbroker.spark_held_back tells the source why a claim
--   came back empty, so that it can say so, and so that Trigger.AvailableNow
--   waits for room instead of ending with messages left.
-- * Log mode on the queue table reads msg_id ranges without leases: a paused
--   queue gives it no new batch (pgbroker.spark_log_gate), but limits it cannot
--   honour (a batch takes every message below the watermark, with no lease to
--   count and no place to wait), so it refuses a limited queue rather than
--   break what the limits promise; claim mode is the way to read one.
-- * Log mode on the archive or with release=none, and batch reads (peeks),
--   consume nothing: neither applies.

-- Why a read of the queue may get nothing now although messages wait
-- (visible, and at or below up_to when given): 'paused', 'limited' (its
-- limits leave no room at the moment), or NULL (nothing holds them back, or
-- nothing visible waits).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_held_back(queue_name text, up_to bigint DEFAULT NULL)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);  -- PB001/PB002 for a bad or missing queue
    mode text := (SELECT q.read_mode FROM pgbroker._queue(queue_name) q);
    waiting boolean;
BEGIN
    IF mode NOT IN ('paused', 'limited') THEN
        RETURN NULL;
    END IF;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM pgmq.%I WHERE vt <= clock_timestamp() AND msg_id <= $1)',
                   qtable)
        INTO waiting USING coalesce(up_to, 9223372036854775807);
    RETURN CASE WHEN waiting THEN mode END;
END;
$$;

-- Whether a log-mode stream may take a new batch now: false while the queue
-- is paused; PB007 when the queue has limits (see above). consumes: whether
-- the stream releases (archives or deletes) what it reads; one that does not
-- (it reads the archive, or release=none) only looks, like a peek, and is
-- always allowed.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_log_gate(queue_name text, consumes boolean DEFAULT true)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);  -- PB001/PB002 for a bad or missing queue
    p pgbroker.queue_policy;
BEGIN
    PERFORM pgbroker._check_arg(consumes IS NOT NULL, 'consumes must be true or false, got NULL');
    IF NOT consumes THEN
        RETURN true;
    END IF;
    p := pgbroker.policy(queue_name);
    IF p.paused THEN
        RETURN false;
    END IF;
    IF pgbroker._read_mode(p) = 'limited' THEN
        RAISE EXCEPTION 'queue "%" has concurrency or rate limits (max_in_flight %, max_in_flight_per_key %, rate_limit_per_second %): log mode reads without leases and cannot honour them',
            queue_name, coalesce(p.max_in_flight::text, 'none'), coalesce(p.max_in_flight_per_key::text, 'none'),
            coalesce(p.rate_limit_per_second::text, 'none')
            USING ERRCODE = 'PB007',
                  HINT = format('Read it in claim mode (options mode=claim, consumer=NAME), which follows the limits; or turn them off: SELECT pgbroker.set_policy(%L, max_in_flight => 0, max_in_flight_per_key => 0, rate_limit_per_second => 0).', queue_name);
    END IF;
    RETURN true;
END;
$$;
