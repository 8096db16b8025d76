-- pgbroker migration 0013: where reads start looking for due messages
-- (queue_head.timed_from, the timed index's counterpart of ready_from), and a
-- fix to how both bounds wait for the transactions they must not pass.
--
-- A read finds redeliveries and delayed messages in the timed index (on vt),
-- from the oldest due time. An acked message leaves its entry there, with its
-- lease's end, until VACUUM; once that time has passed the entry lies in the
-- range every read scans, so every read walked the dead entries of every
-- message acked since the last VACUUM: 549 buffers a read after ~100,000
-- acks here, for a queue with nothing due at all. Reads now scan vt from
-- queue_head.timed_from, a time below which no timed message can be due.
--
-- Why the bound is safe. Every writer of a timed vt but set_vt writes a vt at
-- or after the time its writing statement runs: a lease, nack or extend
-- writes clock_timestamp() + seconds, a delayed send a time after its
-- transaction's start (else the message is ready, not timed). The advance
-- takes two steps, like ready_from's:
--   1. it records a candidate T, its clock minus a margin (1 s), then takes
--      its own transaction id X: any writer that computed a vt below T had
--      its id before X (reads lock their rows, and so take their id, before
--      computing the lease; an UPDATE takes its id right after computing its
--      first row, microseconds, which the margin covers);
--   2. a later advance, once every transaction older than X has ended (a
--      snapshot's xmin has reached X), sees every timed row with a vt below T
--      that will ever be committed, so timed_from becomes the earliest vt of
--      those in [timed_from, T), or T.
-- Not covered: pgmq.set_vt, which writes any vt, so it lowers timed_from
-- itself (as it lowers ready_from); and a delayed send given a time more
-- than the margin in the past yet after its transaction began (a long
-- transaction), which may be found late.
--
-- Late is never lost: once every 10 s per queue the advance sweeps below the
-- bound for a due timed message and lowers timed_from to it. Whatever a
-- writer did, a due message is read at the latest after the next sweep.
--
-- The fix. 0012 took as its candidate's transaction id a snapshot's xmax,
-- which is the last finished id plus one, not the next id to be given: a
-- send still open that held the newest id was not older than it, and the
-- next advance could move ready_from past the send's message. Candidates now
-- carry the advancing transaction's own id, taken after reading the sequence
-- and the clock, so only a transaction that has no id yet records them (a
-- read advances before it leases, an ack before it deletes).
--
-- Behaviour (results, order, errors) is unchanged; reads get cheaper.

ALTER TABLE pgbroker.queue_head
    -- no timed message has a smaller vt (NULL: no bound yet)
    ADD COLUMN timed_from timestamptz,
    -- the candidate of the next advance: timed rows with a vt below timed_next
    -- were written by transactions older than timed_next_xmax
    ADD COLUMN timed_next timestamptz,
    ADD COLUMN timed_next_xmax xid8,
    -- when the last sweep below timed_from ran
    ADD COLUMN timed_swept_at timestamptz;

-- As in 0012, with the timed scan starting at the queue's timed_from. The
-- bound is a subquery (an InitPlan, read once a call) on the queue's name as
-- written in the statement, so no caller passes it.
CREATE OR REPLACE FUNCTION pgbroker._visible_from_sql(qtable text, conditional jsonb)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    ready_rule constant text := 'WHERE read_ct = 0 AND vt <= enqueued_at ';
    timed_rule constant text := 'WHERE NOT (read_ct = 0 AND vt <= enqueued_at) AND vt <= $3 ';
    visible text := pgbroker._visible_sql(qtable, conditional);
BEGIN
    IF strpos(visible, ready_rule) = 0 OR strpos(visible, timed_rule) = 0 THEN
        RAISE EXCEPTION 'pgbroker._visible_sql no longer has the rules this function extends';
    END IF;
    visible := replace(visible, ready_rule, ready_rule || 'AND msg_id >= $5 ');
    RETURN replace(visible, timed_rule, timed_rule || format(
        $B$AND vt >= coalesce((SELECT h.timed_from FROM pgbroker.queue_head h
                               WHERE h.queue_name = (SELECT m.queue_name FROM pgmq.meta m
                                                     WHERE lower(m.queue_name) = %L)), '-infinity') $B$,
        substr(qtable, 3)));
END;
$$;

-- Lower a queue's timed_from to vt (a writer that may write a vt below it).
CREATE FUNCTION pgbroker._lower_timed_from(stored_name text, vt timestamptz)
RETURNS void LANGUAGE sql AS $$
    UPDATE pgbroker.queue_head h SET timed_from = $2
    WHERE h.queue_name = $1 AND h.timed_from > $2;
$$;

-- Move a queue's bounds up (see the header and 0012's), and sweep below
-- timed_from when a sweep is due; a no-op unless this transaction is the one
-- advancing the queue now. Each bound moves in two steps: a candidate, then,
-- once every transaction older than the candidate's id has ended, the bound.
CREATE OR REPLACE FUNCTION pgbroker._advance_head(stored_name text, qtable text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    margin constant interval := '1 second';
    sweep_every constant interval := '10 seconds';
    due_sql constant text := format(
        'SELECT min(vt) FROM pgmq.%I WHERE NOT (read_ct = 0 AND vt <= enqueued_at) AND vt >= $1 AND vt < $2',
        qtable);
    before pgbroker.queue_head;
    h pgbroker.queue_head;
    oldest xid8;
    first_ready bigint;
    first_due timestamptz;
    seq text;
    record_ready boolean;
    record_timed boolean;
    mine xid8;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_try_advisory_xact_lock(hashtext('pgbroker.head:' || qtable)) THEN
        RETURN;
    END IF;
    SELECT * INTO before FROM pgbroker.queue_head qh WHERE qh.queue_name = stored_name;
    IF NOT FOUND THEN
        INSERT INTO pgbroker.queue_head (queue_name, ready_from) VALUES (stored_name, 0)
        ON CONFLICT DO NOTHING;
        RETURN;  -- the insert took an id: the next advance records the candidates
    END IF;
    h := before;
    SELECT pg_snapshot_xmin(pg_current_snapshot()) INTO oldest;

    IF h.next_xmax IS NOT NULL AND oldest >= h.next_xmax THEN
        EXECUTE format('SELECT min(msg_id) FROM pgmq.%I'
                       ' WHERE read_ct = 0 AND vt <= enqueued_at AND msg_id >= $1 AND msg_id <= $2', qtable)
            INTO first_ready USING h.ready_from, h.next_from;
        h.ready_from := greatest(h.ready_from, coalesce(first_ready, h.next_from + 1));
        h.next_from := NULL;
        h.next_xmax := NULL;
    END IF;
    IF h.timed_from IS NOT NULL AND (h.timed_swept_at IS NULL OR h.timed_swept_at < clock_timestamp() - sweep_every) THEN
        EXECUTE due_sql INTO first_due USING '-infinity'::timestamptz, h.timed_from;
        h.timed_from := least(h.timed_from, first_due);
        h.timed_swept_at := clock_timestamp();
    END IF;
    IF h.timed_next_xmax IS NOT NULL AND oldest >= h.timed_next_xmax THEN
        EXECUTE due_sql INTO first_due USING coalesce(h.timed_from, '-infinity'), h.timed_next;
        h.timed_from := greatest(h.timed_from, coalesce(first_due, h.timed_next));
        h.timed_next := NULL;
        h.timed_next_xmax := NULL;
    END IF;

    record_ready := h.next_xmax IS NULL;
    record_timed := h.timed_next_xmax IS NULL;
    IF (record_ready OR record_timed) AND pg_current_xact_id_if_assigned() IS NULL THEN
        seq := pg_get_serial_sequence(format('pgmq.%I', qtable), 'msg_id');
        IF record_ready AND seq IS NOT NULL THEN
            EXECUTE format('SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM %s', seq)
                INTO h.next_from;
        END IF;
        IF record_timed THEN
            h.timed_next := clock_timestamp() - margin;
        END IF;
        mine := pg_current_xact_id();  -- after reading them: see the header
        IF record_ready AND seq IS NOT NULL THEN
            h.next_xmax := mine;
        END IF;
        IF record_timed THEN
            h.timed_next_xmax := mine;
        END IF;
    END IF;

    IF h IS NOT DISTINCT FROM before THEN
        RETURN;
    END IF;
    -- Conditional on the bounds read: a concurrent lowering (set_vt) wins.
    UPDATE pgbroker.queue_head qh
    SET ready_from = h.ready_from, next_from = h.next_from, next_xmax = h.next_xmax,
        timed_from = h.timed_from, timed_next = h.timed_next, timed_next_xmax = h.timed_next_xmax,
        timed_swept_at = h.timed_swept_at
    WHERE qh.queue_name = stored_name AND qh.ready_from = before.ready_from
      AND qh.timed_from IS NOT DISTINCT FROM before.timed_from;
END;
$$;

-- As in 0012: a message set_vt makes ready again lowers ready_from, and one
-- it leaves timed lowers timed_from.
CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name TEXT, msg_ids BIGINT[], vt TIMESTAMP WITH TIME ZONE)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
    changed pgmq.message_record[];
    lowest bigint;
    stored text;
BEGIN
    PERFORM pgbroker._check_arg(vt IS NOT NULL, 'vt must be a timestamp, got NULL');
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
