-- FIFO groups (pgmq 1.13 read_grouped*, create_fifo_index*).
--
-- A message's group is headers->>'x-pgmq-group'; messages without it share
-- one default group. Within a group messages are delivered strictly in
-- msg_id order, one consumer at a time:
--
-- * A group's *head* is its oldest message still in the queue, whatever its
--   state. The group is eligible only when its head is visible: an earlier
--   message that is in flight (read, lease running), nacked for later, or
--   sent with a delay holds back the whole group, as in pgmq (its
--   read_grouped skips a group with any earlier message whose vt is in the
--   future; its read_grouped_rr/_head require the head to be visible).
-- * From an eligible group a read takes a *run*: consecutive visible messages
--   from the head, stopping at the first one that is not visible. pgmq takes
--   every visible message of the group instead, so after a nack it can hand
--   out a message while an earlier one of its group is still in flight; the
--   run rule never does.
--
-- Why grouped readers exclude each other by a row lock on the group's head,
-- and not by a per-queue advisory lock: a transaction-level advisory lock is
-- held until the reader commits, so one consumer that reads and processes in
-- a single transaction would stall every grouped reader of the queue. The head
-- row lock is exactly the group's mutex: a reader owns a group only if it can
-- lock the head (SKIP LOCKED, so readers never wait on each other) and the head
-- is still visible when locked (READ COMMITTED re-checks the latest row
-- version). Once the owner commits, the head is in flight and keeps the group
-- out of reach until it is acknowledged or its lease runs out. Messages after
-- the head are only taken by the head's owner; they are locked too, and a run
-- stops at any message it cannot lock (a non-grouped caller touching it).
--
-- What no reader-side lock can fix: msg_id order is not commit order. If two
-- producers send to one group and the later msg_id commits first, it can be
-- delivered before the earlier one exists for readers (pgmq has the same
-- limit). Producers that need strict order within a group send sequentially.
-- Mixing pgmq.read/pop with grouped reads on one queue also voids the group
-- guarantees: plain reads ignore groups.
--
-- Visible means what it means for pgmq.read: vt <= the reader's clock (a
-- ready message has vt = enqueued_at). pgbroker._visible_sql is not reused:
-- it picks across the whole queue in msg_id order through the ready and
-- timed indexes, while a grouped read looks at each group's head and run.
--
-- Cost: finding the heads walks one index entry per group when the FIFO index
-- exists (pgmq.create_fifo_index), else aggregates the whole queue table as
-- pgmq does; a run is one index range scan. Run create_fifo_index on any
-- queue read by group.

-- The group key, written once: the FIFO index is built on this expression and
-- every grouped query filters on it. The SQL function is inlined by the
-- planner, so queries match the index. The default group's key is pgmq's, so a
-- message sent with that key explicitly lands in the default group as in pgmq.
-- Never change this body in place: indexes built on it would silently disagree.
CREATE OR REPLACE FUNCTION pgbroker._fifo_group(headers jsonb)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(headers->>'x-pgmq-group', '_default_fifo_group')
$$;

-- The name of a queue table's FIFO index.
CREATE OR REPLACE FUNCTION pgbroker._fifo_index_name(qtable text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT qtable || '_fifo_idx'
$$;

-- Head msg_ids of the groups whose head is visible at $1 (the reader's clock),
-- oldest first, as one bigint[].
CREATE OR REPLACE FUNCTION pgbroker._fifo_heads_sql(qtable text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF to_regclass(format('pgmq.%I', pgbroker._fifo_index_name(qtable))) IS NOT NULL THEN
        -- Loose index scan: jump from one group to the next on the FIFO index,
        -- one probe per group, instead of reading every message.
        RETURN format(
            $Q$
            WITH RECURSIVE heads(grp, msg_id, vt) AS (
                (SELECT pgbroker._fifo_group(headers), msg_id, vt FROM pgmq.%1$I
                 ORDER BY pgbroker._fifo_group(headers), msg_id LIMIT 1)
                UNION ALL
                SELECT nxt.grp, nxt.msg_id, nxt.vt
                FROM heads h
                CROSS JOIN LATERAL (
                    SELECT pgbroker._fifo_group(headers) AS grp, msg_id, vt FROM pgmq.%1$I
                    WHERE pgbroker._fifo_group(headers) > h.grp
                    ORDER BY pgbroker._fifo_group(headers), msg_id LIMIT 1) nxt
            )
            SELECT coalesce(array_agg(msg_id ORDER BY msg_id), '{}') FROM heads WHERE vt <= $1
            $Q$, qtable);
    END IF;
    RETURN format(
        $Q$
        WITH heads(msg_id) AS (
            SELECT min(msg_id) FROM pgmq.%1$I GROUP BY pgbroker._fifo_group(headers)
        )
        SELECT coalesce(array_agg(q.msg_id ORDER BY q.msg_id), '{}')
        FROM heads h JOIN pgmq.%1$I q ON q.msg_id = h.msg_id
        WHERE q.vt <= $1
        $Q$, qtable);
END;
$$;

-- Own up to $3 groups: lock the first heads of $1 (candidate heads, oldest
-- first) that nobody else has locked and that are still visible at $2.
-- Returns the owned heads, oldest first, as one bigint[].
CREATE OR REPLACE FUNCTION pgbroker._fifo_own_sql(qtable text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format(
        $Q$
        SELECT ARRAY(
            SELECT msg_id FROM pgmq.%I
            WHERE msg_id = ANY ($1) AND vt <= $2
            ORDER BY msg_id
            LIMIT $3
            FOR UPDATE SKIP LOCKED)
        $Q$, qtable)
$$;

-- Lease runs of owned groups and return them. $1 = owned heads (group
-- priority = position), $2 = longest run to take from one group, $3 = batch
-- size, $4 = vt seconds, $5 = the reader's clock. batch_order arranges the
-- batch over (prio, rn) = (group priority, position in the group's run).
CREATE OR REPLACE FUNCTION pgbroker._fifo_take_sql(qtable text, batch_order text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format(
        $Q$
        WITH owned AS (
            SELECT o.head, o.prio, pgbroker._fifo_group(h.headers) AS grp
            FROM unnest($1::bigint[]) WITH ORDINALITY AS o(head, prio)
            JOIN pgmq.%1$I h ON h.msg_id = o.head
        ),
        win AS MATERIALIZED (
            SELECT o.prio, w.msg_id, w.visible,
                   row_number() OVER (PARTITION BY o.prio ORDER BY w.msg_id) AS rn
            FROM owned o
            CROSS JOIN LATERAL (
                SELECT q.msg_id, q.vt <= $5 AS visible
                FROM pgmq.%1$I q
                WHERE pgbroker._fifo_group(q.headers) = o.grp AND q.msg_id >= o.head
                ORDER BY q.msg_id
                LIMIT $2) w
        ),
        run AS MATERIALIZED (
            -- Stop each group at its first message that is not visible.
            SELECT prio, msg_id, rn
            FROM (SELECT win.*, bool_and(visible) OVER (PARTITION BY prio ORDER BY rn) AS unbroken
                  FROM win) x
            WHERE unbroken
        ),
        picked AS MATERIALIZED (
            -- The batch, before locking: per group still a prefix of its run,
            -- since every order used ranks a group's messages by rn.
            SELECT prio, msg_id, rn FROM run ORDER BY %2$s LIMIT $3
        ),
        locked AS MATERIALIZED (
            -- Heads are ours already; other rows could be held by a non-grouped
            -- caller, and are re-checked on their latest version. Only the
            -- batch is locked: a row lock writes the row.
            SELECT q.msg_id FROM pgmq.%1$I q
            WHERE q.msg_id = ANY (ARRAY(SELECT msg_id FROM picked)) AND q.vt <= $5
            FOR UPDATE SKIP LOCKED
        ),
        taken AS MATERIALIZED (
            -- ...and stop each group at its first message that could not be locked.
            SELECT prio, msg_id, rn
            FROM (SELECT p.*, bool_and(l.msg_id IS NOT NULL) OVER (PARTITION BY p.prio ORDER BY p.rn) AS unbroken
                  FROM picked p LEFT JOIN locked l USING (msg_id)) x
            WHERE unbroken
        ),
        leased AS (
            UPDATE pgmq.%1$I q
            SET vt = clock_timestamp() + make_interval(secs => $4),
                read_ct = q.read_ct + 1,
                last_read_at = clock_timestamp()
            FROM taken t WHERE q.msg_id = t.msg_id
            RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message, q.headers,
                      t.prio, t.rn
        )
        SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers
        FROM leased ORDER BY %2$s
        $Q$, qtable, batch_order)
$$;

-- The three grouped reads differ only in how many groups they own at once,
-- how much of each run they take, and how they order the batch:
--   fill: SQS FIFO. The oldest eligible group's run first, then the next
--         group's, until the batch is full. Groups are owned one at a time,
--         so a reader never locks a group it will not use.
--   rr:   round-robin. Up to qty groups; the 1st message of each (in order
--         of their heads), then the 2nd of each, ...
--   head: up to qty groups, one message (the head) from each.
--
-- A queue's pause and limits (20_policies.sql, 56_limits.sql): a paused
-- queue gives nothing; max_in_flight and the rate limit cap how many messages
-- a read takes (fewer, never others: the groups' order is pgmq's).
-- Priorities are not followed: they would reorder a group, or the groups
-- against pgmq's rule. max_in_flight_per_key is not followed yet (a group
-- whose head's key is full could be skipped like one whose head is in
-- flight); a group is one consumer at a time already: make the key the group.
CREATE OR REPLACE FUNCTION pgbroker._read_grouped(queue_name text, vt integer, qty integer, mode text)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql
-- A read is never compiled, however large the backlog (50_reads.sql).
SET jit = off AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
    q record;
    limited boolean := false;
    limits record;
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
    SELECT * INTO q FROM pgbroker._queue(queue_name);
    IF qty = 0 OR (qty IS NULL AND mode = 'fill') OR q.read_mode = 'paused' THEN
        RETURN;
    END IF;
    IF q.read_mode = 'limited' THEN
        limited := true;
        SELECT * INTO limits FROM pgbroker._limit_budget(q.stored_name, qty, false);
        IF limits.budget <= 0 THEN
            RETURN;
        END IF;
        qty := least(qty, limits.budget);
        remaining := qty;
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
            GET DIAGNOSTICS got = ROW_COUNT;
            remaining := qty - got;
        END IF;
    ELSE
        RAISE EXCEPTION 'unknown grouped read mode %', quote_literal(mode) USING ERRCODE = 'PB007';
    END IF;
    IF limited THEN
        PERFORM pgbroker._limit_charge(q.stored_name, limits.available, limits.clock, qty - remaining);
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

------------------------------------------------------------------------------
-- pgmq's grouped reads: fill (read_grouped), rr and head, each with a poll form
------------------------------------------------------------------------------

-- Read FIFO groups (header x-pgmq-group): fill qty from the oldest ready group's run
-- of messages, then the next group's, never passing a group's invisible message.
-- Returns: up to qty messages, hidden for vt seconds.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.read_grouped(queue_name TEXT, vt INTEGER, qty INTEGER)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._read_grouped(queue_name, vt, qty, 'fill');
$$;

-- Read FIFO groups round-robin: the head of each ready group in turn, then the
-- next message of each, until qty.
-- Returns: up to qty messages, hidden for vt seconds.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.read_grouped_rr(queue_name TEXT, vt INTEGER, qty INTEGER)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._read_grouped(queue_name, vt, qty, 'rr');
$$;

-- Read only the head message of each ready FIFO group, up to qty groups.
-- Returns: up to qty messages, hidden for vt seconds.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.read_grouped_head(queue_name TEXT, vt INTEGER, qty INTEGER)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._read_grouped(queue_name, vt, qty, 'head');
$$;

-- pgmq.read_grouped, waiting up to max_poll_seconds while nothing is ready.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.read_grouped_with_poll(
    queue_name TEXT, vt INTEGER, qty INTEGER,
    max_poll_seconds INTEGER DEFAULT 5, poll_interval_ms INTEGER DEFAULT 100)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._read_grouped_with_poll(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, 'fill');
$$;

-- pgmq.read_grouped_rr, waiting up to max_poll_seconds while nothing is ready.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.read_grouped_rr_with_poll(
    queue_name TEXT, vt INTEGER, qty INTEGER,
    max_poll_seconds INTEGER DEFAULT 5, poll_interval_ms INTEGER DEFAULT 100)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._read_grouped_with_poll(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, 'rr');
$$;

-- pgmq.read_grouped_head, waiting up to max_poll_seconds while nothing is ready.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.read_grouped_head_with_poll(
    queue_name TEXT, vt INTEGER, qty INTEGER,
    max_poll_seconds INTEGER DEFAULT 5, poll_interval_ms INTEGER DEFAULT 100)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._read_grouped_with_poll(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, 'head');
$$;

------------------------------------------------------------------------------
-- The FIFO index. pgmq builds a GIN index on headers, which helps neither the
-- per-group walk nor msg_id order; a btree on (group, msg_id) serves both:
-- heads are its first entry per group, a run is a range scan of it.
------------------------------------------------------------------------------

-- Create the index that FIFO-group reads use on a queue (a btree on group and
-- msg_id); a repeat gives a NOTICE. Best created before the queue fills: the
-- build holds off sends.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.create_fifo_index(queue_name TEXT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
BEGIN
    -- The lock create/drop take for this name: two concurrent calls would
    -- otherwise race on IF NOT EXISTS and one would fail on the catalog.
    PERFORM pgbroker._queue_turn(queue_name);
    -- Not CONCURRENTLY: that cannot run inside a function. The build holds off
    -- sends (not reads) for its duration, so create the index early.
    -- Checked first rather than IF NOT EXISTS; a repeat gives the notice of
    -- pgmq's CREATE INDEX IF NOT EXISTS.
    IF to_regclass(format('pgmq.%I', pgbroker._fifo_index_name(qtable))) IS NULL THEN
        EXECUTE format('CREATE INDEX %I ON pgmq.%I (pgbroker._fifo_group(headers), msg_id)',
                       pgbroker._fifo_index_name(qtable), qtable);
    ELSE
        RAISE NOTICE 'relation "%" already exists, skipping', pgbroker._fifo_index_name(qtable)
            USING ERRCODE = 'duplicate_table';
    END IF;
END;
$$;

-- The FIFO index on every queue.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.create_fifo_indexes_all()
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    name text;
BEGIN
    FOR name IN SELECT m.queue_name FROM pgmq.meta m ORDER BY m.queue_name LOOP
        PERFORM pgmq.create_fifo_index(name);
    END LOOP;
END;
$$;
