-- Notify: NOTIFY on insert, pgmq's enable_notify_insert family.
--
-- A queue with notify enabled gets an AFTER INSERT trigger that sends
-- NOTIFY "pgmq.q_<name>.INSERT" (pgmq's channel, empty payload) at most once
-- per throttle interval. <name> is the queue's name as stored in pgmq.meta,
-- that is as given to create: MyQueue's channel is "pgmq.q_MyQueue.INSERT",
-- as in pgmq 1.13.1 (before it, pgmq never notified for such a queue). Postgres delivers a NOTIFY only when the
-- sending transaction commits, so a rolled-back send never wakes anyone, and
-- it folds identical notifications of one transaction into one.
--
-- Notifications are not free: a notifying transaction holds Postgres'
-- cluster-wide notify lock from its pre-commit until it has committed (WAL
-- flush included), so notifying transactions commit one at a time, and many
-- of them queueing for that lock at once is slow. Measured on 2 cores, 8
-- concurrent senders of single messages (pgbench, synchronous_commit=off):
-- ~3,300 sends/s without notify and with a 250 ms throttle; with throttle 0,
-- ~2,100 here and ~2,700 for pgmq (both let one notifying sender at a time
-- through), but only ~700-1,200 when every sender notifies regardless.
--
-- Where this differs from pgmq, and why:
-- * The trigger is per statement, not per row: a batch of 10,000 messages
--   costs one throttle check, not 10,000. It has no transition table (that
--   would copy every inserted row just to learn whether there was one), so an
--   INSERT of zero rows may notify: a spurious wake-up costs a waiter one
--   empty read.
-- * The trigger carries the queue's stored name as its argument (as pgmq
--   1.13.1's does), so mixed-case queues notify; pgmq 1.13.0 looked the
--   throttle up by the lower-cased table name and never found them.
-- * Senders never wait for each other. pgmq updates the throttle row when the
--   interval has passed (with throttle 0: on every insert) and holds its lock
--   until commit, so a sender in a long transaction stalls every other sender
--   of the queue until it commits. Here a sender claims the row with SKIP
--   LOCKED; when another sender holds it, that sender has claimed the
--   notification and sends it at its own commit, which also covers this one.
--   See pgbroker._notify_insert for the wake-ups this can lose.
-- * The table is logged: pgmq's is unlogged, so after a crash the throttle
--   rows are gone while the triggers remain, and notify stops silently.
-- * Senders in REPEATABLE READ or SERIALIZABLE transactions never lock or
--   update the row (that would fail their send with a serialization error
--   whenever another sender had just notified): they notify when their
--   snapshot says the interval has passed, without recording it.
--
-- Waiting clients must treat a notification as a hint and keep polling as a
-- fallback; pgbroker.listen does.

-- The channel of a queue's inserts, from its name as stored in pgmq.meta;
-- defined here only, so that the trigger and every client agree.
CREATE OR REPLACE FUNCTION pgbroker._insert_channel(stored_name text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 'pgmq.q_' || stored_name || '.INSERT';
$$;

-- The channel a queue's inserts are announced on, for a name in any case:
-- "pgmq.q_MyQueue.INSERT" for the queue created as MyQueue.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.notify_channel(queue_name text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    PERFORM pgbroker._table(queue_name);  -- PB002 for a queue never created
    RETURN pgbroker._insert_channel(pgbroker._stored_name(queue_name));
END;
$$;

-- TG_ARGV[0] = the queue's name as stored in pgmq.meta. Triggers made by
-- 0.1.0 also carry the lower-cased channel it used, as TG_ARGV[1]: the
-- channel is derived here instead, so they announce on the current one.
--
-- Wake-ups this trades away, each bounded by the waiting client's fallback poll:
-- * (as pgmq) a message sent within the throttle interval after a notified
--   one is not announced;
-- * a sender that finds the row claimed by another relies on that sender's
--   notification (throttle 0 included: notifying every sender regardless
--   makes them queue for the notify lock, see above). If the claimer commits
--   first, a waiter it wakes may read before this sender's message is
--   committed; if the claimer rolls back, nobody notifies. The next claim
--   after it announces both.
-- pgmq avoids the second case only by making senders wait for each other.
CREATE OR REPLACE FUNCTION pgbroker._notify_insert()
RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    throttle pgmq.notify_insert_throttle;
BEGIN
    -- No lock: most sends of a busy queue stop here, inside the interval.
    SELECT * INTO throttle FROM pgmq.notify_insert_throttle t WHERE t.queue_name = TG_ARGV[0];
    IF NOT FOUND
       OR clock_timestamp() < throttle.last_notified_at
                              + throttle.throttle_interval_ms * interval '1 millisecond' THEN
        RETURN NULL;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- Claim the interval. The re-check sees the latest committed row, so
        -- a claim committed since the SELECT above wins over ours.
        UPDATE pgmq.notify_insert_throttle t
        SET last_notified_at = clock_timestamp()
        WHERE t.queue_name = (SELECT l.queue_name FROM pgmq.notify_insert_throttle l
                              WHERE l.queue_name = TG_ARGV[0]
                              FOR NO KEY UPDATE SKIP LOCKED)
          AND clock_timestamp() >= t.last_notified_at + t.throttle_interval_ms * interval '1 millisecond';
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    PERFORM pg_notify(pgbroker._insert_channel(TG_ARGV[0]), NULL);
    RETURN NULL;
END;
$$;

-- Whether notify's trigger is on the queue table.
CREATE OR REPLACE FUNCTION pgbroker._notify_trigger_exists(qtable text)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = format('pgmq.%I', qtable)::regclass AND tgname = 'pgbroker_notify_insert');
$$;

-- The notice pgmq's DROP TRIGGER IF EXISTS gives for its trigger (pgbroker's
-- trigger has another name).
CREATE OR REPLACE FUNCTION pgbroker._pgmq_no_trigger_notice(qtable text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE NOTICE 'trigger "trigger_notify_queue_insert_listeners" for relation "pgmq.%" does not exist, skipping',
        qtable;
END;
$$;

-- Enable notify on a queue, or change its throttle when it is enabled.
-- Checks and errors are pgmq's, in pgmq's order (0015); a NULL throttle
-- fails on the table's NOT NULL, as in pgmq.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.enable_notify_insert(queue_name text, throttle_interval_ms integer DEFAULT 250)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    stored text;
    qtable text;
BEGIN
    PERFORM pgbroker._pgmq_check_characters(queue_name);
    PERFORM pgbroker._pgmq_check(coalesce(throttle_interval_ms >= 0, true), 'throttle_interval_ms must be non-negative',
        'It is the least number of milliseconds between two notifications; 0 notifies on every send.');
    -- Serialise with create and drop of the same queue, as they do with each other.
    PERFORM pgbroker._queue_turn(queue_name);
    stored := pgbroker._stored_name(queue_name);
    IF stored IS NULL THEN
        PERFORM pgbroker._pgmq_raise(
            format('Queue "%s" does not exist. Create it first using pgmq.create()', queue_name), 'PB002',
            pgbroker._no_queue_hint(queue_name));
    END IF;
    qtable := lower('q_' || stored);
    -- pgmq disables first: its DROP TRIGGER IF EXISTS gives a notice when
    -- notify was not enabled.
    IF NOT pgbroker._notify_trigger_exists(qtable) THEN
        PERFORM pgbroker._pgmq_no_trigger_notice(qtable);
    END IF;
    INSERT INTO pgmq.notify_insert_throttle AS t (queue_name, throttle_interval_ms)
    VALUES (stored, enable_notify_insert.throttle_interval_ms)
    ON CONFLICT ON CONSTRAINT notify_insert_throttle_queue_name_key DO UPDATE
        SET throttle_interval_ms = excluded.throttle_interval_ms,
            last_notified_at = to_timestamp(0);
    -- Re-enabling only changes the row: creating a trigger locks out the
    -- queue's senders, so it is done once.
    IF NOT pgbroker._notify_trigger_exists(qtable) THEN
        EXECUTE format(
            'CREATE TRIGGER pgbroker_notify_insert AFTER INSERT ON pgmq.%I '
            'FOR EACH STATEMENT EXECUTE FUNCTION pgbroker._notify_insert(%L)',
            qtable, stored);
    END IF;
END;
$$;

-- Disable notify; for a queue that does not exist, pgmq's notice (its DROP
-- TRIGGER IF EXISTS finds no table) and nothing else.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.disable_notify_insert(queue_name text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    stored text;
BEGIN
    PERFORM pgbroker._pgmq_check_characters(queue_name);
    IF queue_name IS NULL THEN
        PERFORM pgbroker._pgmq_no_queue(queue_name);
    END IF;
    PERFORM pgbroker._queue_turn(queue_name);
    stored := pgbroker._stored_name(queue_name);
    IF stored IS NULL THEN
        RAISE NOTICE 'relation "pgmq.%" does not exist, skipping', lower('q_' || queue_name);
        RETURN;
    END IF;
    IF pgbroker._notify_trigger_exists(lower('q_' || stored)) THEN
        EXECUTE format('DROP TRIGGER pgbroker_notify_insert ON pgmq.%I', lower('q_' || stored));
    ELSE
        PERFORM pgbroker._pgmq_no_trigger_notice(lower('q_' || stored));
    END IF;
    DELETE FROM pgmq.notify_insert_throttle t WHERE t.queue_name = stored;
END;
$$;

-- Change the throttle of a queue that has notify enabled.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.update_notify_insert(queue_name text, throttle_interval_ms integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    stored text;
BEGIN
    PERFORM pgbroker._pgmq_check(coalesce(throttle_interval_ms >= 0, true),
        format('throttle_interval_ms must be non-negative, got: %s', throttle_interval_ms),
        'It is the least number of milliseconds between two notifications; 0 notifies on every send.');
    stored := pgbroker._stored_name(queue_name);
    IF stored IS NULL THEN
        PERFORM pgbroker._pgmq_raise(
            format('Queue "%s" does not exist. Create the queue first using pgmq.create()', queue_name), 'PB002',
            pgbroker._no_queue_hint(queue_name));
    END IF;
    UPDATE pgmq.notify_insert_throttle t
    SET throttle_interval_ms = update_notify_insert.throttle_interval_ms,
        last_notified_at = to_timestamp(0)
    WHERE t.queue_name = stored;
    IF NOT FOUND THEN
        PERFORM pgbroker._pgmq_raise(
            format('Queue "%s" does not have notify_insert enabled. Enable it first using '
                   'pgmq.enable_notify_insert()', queue_name), 'PB007',
            format('Enable it first: SELECT pgmq.enable_notify_insert(%L);', stored));
    END IF;
END;
$$;

-- The queues with insert notifications enabled, with each one's throttle.
-- Returns: queue_name, throttle_interval_ms, last_notified_at per queue.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.list_notify_insert_throttles()
RETURNS TABLE (queue_name text, throttle_interval_ms integer, last_notified_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT t.queue_name, t.throttle_interval_ms, t.last_notified_at
    FROM pgmq.notify_insert_throttle t
    ORDER BY t.queue_name;
$$;
