-- Reads: what a read may take, the hot statements, and where reads start.
--
-- The hot statements. Queue tables have a name per queue, so the engine's
-- statements are written per table: pgbroker._statement writes the read,
-- deliver (read with receipts), pop and ack statement of a queue table, so
-- that their text exists once; the visibility rule in them is
-- pgbroker._visible_sql's. The routes (90_routes.sql) hold these statements
-- for every routed queue as static SQL, planned once per session. A queue
-- the routes do not hold takes the dynamic path (pgbroker._statement_call):
-- called with the session's own rights, the statement is made a
-- session-level prepared statement the first time a backend runs it for the
-- queue (PREPARE, named pgb_<op>_<table>), and later calls run it with
-- EXECUTE: parsed, analysed and planned once per backend and queue. Called
-- through a SECURITY DEFINER entry point (the roles, 88_roles.sql), it runs
-- the query with its values written in instead, planned on each call: a
-- prepared statement belongs to the session, and the session is not trusted
-- (see _statement_call).
--   * The check for an existing statement reads pg_prepared_statements and
--     compares its text, so a DEALLOCATE ALL or DISCARD ALL (connection
--     poolers) only costs a new PREPARE, and an upgrade that changed the
--     text prepares it again.
--   * A prepared statement is re-analysed by the server when a table it uses
--     is dropped or altered, so a queue dropped and created again under the
--     same name (even as a partitioned queue) is found again; a dropped queue
--     still fails with PB002, since the dynamic path probes pgmq.meta first.
--   * Parameters of EXECUTE can only be values written into its text, so
--     values travel as literals (format %L); their text forms round-trip
--     exactly (jsonb, integers), and timestamps travel in ISO 8601 with a
--     numeric offset (pgbroker._instant_literal), whatever the session's date
--     settings.
--   * The hot functions run with plan_cache_mode = force_generic_plan: with
--     LIMIT $n, the server would otherwise judge the generic plan dearer than
--     a custom one (it guesses 10% of the table for the limit) and replan on
--     every call. The generic plans are the custom ones (ready and timed
--     index scans, primary-key probes): tests/engine/test_query_plans.py
--     checks them.
--   * The reads run with jit = off. A generic plan's cost grows with the
--     table (a tenth of it for LIMIT $n): past jit_above_cost, from about
--     ten million messages waiting, the server would compile the read with
--     LLVM at every execution (compiled code is not kept with a cached plan),
--     11-15 ms for a pop that takes 0.2. What a read does is a few index
--     probes: compiling never pays.
--
-- Where reads start (pgbroker.queue_head). Every delivered, acked or popped
-- message leaves a dead entry in the queue's indexes until VACUUM removes
-- it: at the low end of the ready index, and in the timed index under its
-- lease's end, which once passed lies in the range every read scans. A read
-- that walked them all from the start would visit ~300 (ready) and ~550
-- (timed) index pages after 100,000 messages consumed. Reads start instead
-- at two bounds per queue: ready_from, a msg_id below which no message can
-- be ready, and timed_from, a time below which no timed message can be due.
-- Now and then (one read or ack in sixteen) a caller moves them up
-- (pgbroker._advance_head). Sends take no lock for this; each bound moves in
-- two steps, a candidate and then the bound:
--   ready_from
--     1. An advance records a candidate: the queue sequence's last value V,
--        then its own transaction id X. A send takes its transaction id
--        before its msg_ids, so every msg_id <= V belongs to a transaction
--        older than X.
--     2. A later advance, once every transaction older than X has ended (a
--        snapshot's xmin has reached X), sees every message <= V that will
--        ever exist; ready_from becomes the first ready one in
--        [ready_from, V], or V + 1.
--   timed_from. Every writer of a timed vt but set_vt writes a vt at or after
--   the time its writing statement runs: a lease, nack or extend writes
--   clock_timestamp() + seconds, a delayed send a time after its
--   transaction's start (else the message is ready, not timed).
--     1. An advance records a candidate T, its clock minus a margin (1 s),
--        then takes its own transaction id X: any writer that computed a vt
--        below T had its id before X (reads lock their rows, and so take
--        their id, before computing the lease; an UPDATE takes its id right
--        after computing its first row, microseconds, which the margin
--        covers).
--     2. A later advance, once every transaction older than X has ended,
--        sees every timed row with a vt below T that will ever be committed,
--        so timed_from becomes the earliest vt of those in [timed_from, T),
--        or T.
-- Candidates carry the advancing transaction's own id, taken after reading
-- the sequence and the clock, so only a transaction that has no id yet
-- records them (a read advances before it leases, an ack before it deletes).
-- Step 2 waits for every older transaction of the cluster, the queue's
-- writers or not: one left idle in transaction, in any database, held both
-- bounds back for as long as it stayed, and every read walked the dead
-- entries of all the messages consumed meanwhile (linearly slower: 0.14 ->
-- 0.67 s a thousand messages over 60,000 consumed). So a candidate that the
-- horizon has held back for a second is confirmed by the queue's own
-- writers instead: every transaction that took a msg_id <= V, or wrote a vt
-- below T, holds ROW EXCLUSIVE on the queue table from before it did so
-- until it ends (an INSERT or UPDATE opens its table first). The writers
-- listed at any time after the candidate was taken (pg_locks,
-- pgbroker._writers) include every such transaction still running; once
-- none of them holds the lock any more, step 2 holds, as for the stream's
-- safe id (92_streams.sql) and the Spark watermark (82_spark.sql).
-- Only one transaction advances a queue at a time (a lock on the queue's row
-- of pgmq.meta, SKIP LOCKED: the others skip it), only in READ COMMITTED, and
-- only while the bounds are those it read, so a concurrent lowering wins.
-- The bounds are appended, never updated by an advance: each advance adds a
-- row to pgbroker.queue_head and removes the one it replaced, and a reader
-- takes the queue's newest row (pgbroker._queue_bounds), an index walk
-- backwards that meets it first. An UPDATE of one row left a version behind
-- at every advance, and while a transaction held back the xmin horizon
-- (the fallback above moves the bounds every second or two) every look-up
-- walked all the versions kept: 600 advances, 10 buffers a look-up; 30,000 (about
-- nine hours held), a read and delete 0.7 -> 1.8 ms.
-- pgmq.set_vt, which writes any vt, lowers both bounds itself (in place,
-- after the advancers' lock: pgbroker._lower_head): ready_from for a message it makes ready
-- again (a delayed, never-read message given a vt at or before its
-- enqueued_at), timed_from for one it leaves timed. Late is never lost: once
-- every 10 s per queue an advance sweeps below timed_from for a due timed
-- message and lowers the bound to it, so whatever a writer did, a due
-- message is read at the latest after the next sweep. Not covered: rows
-- inserted into a queue table by hand while readers run, queue sequences
-- given a CACHE above 1, and a delayed send given a time more than the
-- margin in the past yet after its transaction began (found late, by a
-- sweep).

------------------------------------------------------------------------------
-- What a read may take
------------------------------------------------------------------------------

-- The rows a read may take, oldest msg_id first, locked with SKIP LOCKED.
-- $1 = qty, $2 = conditional, $3 = the reader's clock. Every read and pop
-- statement is built on it, so that visibility is defined once (the grouped
-- reads of 70_fifo_groups.sql have their own rule, by group).
--
-- Timed messages (redeliveries, delayed sends) are searched from the oldest
-- due time, up to a window of 1000 due rows, then ordered by msg_id with the
-- ready ones. Within that window the order is exactly pgmq's; only when more
-- than 1000 timed messages are due at once do the earliest-due go first.
--
-- prioritized: the order is (priority DESC, msg_id) instead, priority being
-- pgbroker._priority(headers) (32_priorities.sql); the ready scan then walks
-- the queue's priority index from its top. Without it the text is the plain
-- one, so queues that use no priorities keep their statements.
CREATE OR REPLACE FUNCTION pgbroker._visible_sql(qtable text, conditional jsonb, prioritized boolean DEFAULT false)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format(
        $Q$
        ready AS (
            SELECT msg_id%3$s FROM pgmq.%1$I
            WHERE read_ct = 0 AND vt <= enqueued_at %2$s
            ORDER BY %4$smsg_id
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ),
        timed AS (
            -- ARRAY(...) makes the due rows an InitPlan probed by primary key;
            -- as a join the planner may walk the whole primary key instead.
            SELECT q.msg_id%5$s FROM pgmq.%1$I q
            WHERE q.msg_id = ANY (ARRAY(
                    SELECT msg_id FROM pgmq.%1$I
                    WHERE NOT (read_ct = 0 AND vt <= enqueued_at) AND vt <= $3 %2$s
                    ORDER BY vt
                    LIMIT 1000))
              AND NOT (q.read_ct = 0 AND q.vt <= q.enqueued_at) AND q.vt <= $3
            ORDER BY %6$sq.msg_id
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ),
        picked AS (
            SELECT msg_id FROM (SELECT msg_id%7$s FROM ready UNION ALL SELECT msg_id%7$s FROM timed) c
            ORDER BY %8$smsg_id
            LIMIT $1
        )
        $Q$,
        qtable,
        CASE WHEN conditional IS NULL OR conditional = '{}'::jsonb THEN ''
             ELSE 'AND message @> $2' END,
        CASE WHEN prioritized THEN ', pgbroker._priority(headers) AS priority' ELSE '' END,
        CASE WHEN prioritized THEN 'pgbroker._priority(headers) DESC, ' ELSE '' END,
        CASE WHEN prioritized THEN ', pgbroker._priority(q.headers) AS priority' ELSE '' END,
        CASE WHEN prioritized THEN 'pgbroker._priority(q.headers) DESC, ' ELSE '' END,
        CASE WHEN prioritized THEN ', priority' ELSE '' END,
        CASE WHEN prioritized THEN 'priority DESC, ' ELSE '' END)
$$;

-- pgbroker._visible_sql starting where the queue's bounds say: the ready scan
-- at $5 (the caller's ready_from), the timed scan at $6 (its timed_from; NULL
-- scans every due row). The caller reads both in one look-up of the queue's
-- bounds: a look-up in the statement (an InitPlan calling _queue_bounds) cost
-- a pop or read of one message a third of its time on top of the caller's.
CREATE OR REPLACE FUNCTION pgbroker._visible_from_sql(qtable text, conditional jsonb, prioritized boolean DEFAULT false)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    ready_rule constant text := 'WHERE read_ct = 0 AND vt <= enqueued_at ';
    timed_rule constant text := 'WHERE NOT (read_ct = 0 AND vt <= enqueued_at) AND vt <= $3 ';
    visible text := pgbroker._visible_sql(qtable, conditional, prioritized);
BEGIN
    IF strpos(visible, ready_rule) = 0 OR strpos(visible, timed_rule) = 0 THEN
        RAISE EXCEPTION 'pgbroker._visible_sql no longer has the rules this function extends';
    END IF;
    visible := replace(visible, ready_rule, ready_rule || 'AND msg_id >= $5 ');
    RETURN replace(visible, timed_rule, timed_rule || $B$AND vt >= coalesce($6, '-infinity'::timestamptz) $B$);
END;
$$;

-- The read arguments' checks, with their errors; the hot paths test the
-- arguments inline and call this only to raise.
CREATE OR REPLACE FUNCTION pgbroker._check_read_args(vt integer, qty integer)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgbroker._check_arg(vt IS NOT NULL AND vt >= 0,
        format('vt must be a number of seconds >= 0, got %s', coalesce(vt::text, 'NULL')),
        'vt is how long a read message stays invisible to other readers.');
    PERFORM pgbroker._check_arg(qty IS NOT NULL AND qty >= 0,
        format('qty must be >= 0, got %s', coalesce(qty::text, 'NULL')),
        'qty is the largest number of messages to return.');
END;
$$;

-- The read arguments' checks of pgmq's reads: a negative qty fails as
-- pgmq's LIMIT fails (2201W, pgbroker's PB007 in DETAIL); the rest as above.
CREATE OR REPLACE FUNCTION pgbroker._pgmq_check_read_args(vt integer, qty integer)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF qty < 0 THEN
        PERFORM pgbroker._pgmq_raise('LIMIT must not be negative', 'PB007',
            'qty is the largest number of messages to return.', format('qty must be >= 0, got %s', qty), '2201W');
    END IF;
    PERFORM pgbroker._check_read_args(vt, qty);
END;
$$;

------------------------------------------------------------------------------
-- The hot statements
------------------------------------------------------------------------------

-- The text of a queue's hot statement, as PREPARE <name>(types) AS <query>.
--   read / read_c      pgmq.read's rows (read_c: with a conditional, $2)
--   deliver / deliver_c pgbroker.read's rows (the receipt appended)
--   pop                pgmq.pop
--   ack_a / ack_d      pgbroker.ack (archive / delete)
-- and the reads of a queue with priorities (32_priorities.sql), in priority
-- order: read_p, read_pc, deliver_p, deliver_pc, pop_p.
-- Parameters follow pgbroker._visible_sql: $1 qty, $2 conditional, $3 the
-- reader's clock; then $4 the visibility timeout (reads), $5 the queue's
-- ready_from and $6 its timed_from. ack: $1 msg_ids, $2 read_cts, $3 leases.
-- A name longer than an identifier (63 bytes; a long queue name with the
-- longest ops) would be cut by the server and never found again: such names
-- carry the table name's md5 instead.
CREATE OR REPLACE FUNCTION pgbroker._statement_name(qtable text, op text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length('pgb_' || op || '_' || qtable) <= 63 THEN 'pgb_' || op || '_' || qtable
                ELSE 'pgb_' || op || '_' || md5(qtable) END;
$$;

-- The parameter types of op's statement (see above), in their order.
CREATE OR REPLACE FUNCTION pgbroker._statement_types(op text)
RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN op IN ('ack_a', 'ack_d') THEN ARRAY['bigint[]', 'integer[]', 'bigint[]']
                ELSE ARRAY['integer', 'jsonb', 'timestamptz', 'integer', 'bigint', 'timestamptz'] END;
$$;

-- A queue's hot statement for op (see _statement_name), the query alone.
-- Every name in it is schema-qualified or pg_catalog's. The lease and the pop
-- take the picked rows as an array (msg_id = ANY, probed by primary key), not
-- as a join: the generic plan guesses a tenth of the table for the pick's
-- LIMIT $1, and on a partitioned queue it then hashed every row of every
-- partition to join the few picked (0.3-0.4 s a pop of one message in a queue
-- of a million in 106 partitions).
CREATE OR REPLACE FUNCTION pgbroker._statement_query(qtable text, op text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    atable text := 'a' || substr(qtable, 2);
    columns text := 'q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message, q.headers';
    prioritized constant boolean := op IN ('read_p', 'read_pc', 'deliver_p', 'deliver_pc', 'pop_p');
    result_order constant text := CASE WHEN prioritized THEN 'pgbroker._priority(headers) DESC, msg_id'
                                       ELSE 'msg_id' END;
    partitioned constant boolean := EXISTS (
        SELECT FROM pg_catalog.pg_partitioned_table p
        WHERE p.partrelid = pg_catalog.to_regclass(format('pgmq.%I', qtable)));
    -- The rows of an array of msg_ids (%1$s), probed by primary key. In a queue
    -- partitioned by msg_id, between its least and greatest msg_id too, so that
    -- only the partitions that hold them are probed (run-time pruning takes a
    -- range, never an array's elements). A plain queue has no use for the range,
    -- and its two subqueries cost a pop of one message 7% (15 clients).
    rows_of constant text := 'q.msg_id = ANY (%1$s)' || CASE WHEN partitioned THEN
        ' AND q.msg_id BETWEEN (SELECT min(i) FROM unnest(%1$s) i) AND (SELECT max(i) FROM unnest(%1$s) i)'
        ELSE '' END;
    -- The rows a read or pop picked, and those an ack, delete or archive is given ($1).
    picked_rows constant text := format(rows_of, 'ARRAY(SELECT msg_id FROM picked)');
    given_rows constant text := format(rows_of, '$1');
BEGIN
    IF op IN ('read', 'read_c', 'deliver', 'deliver_c', 'read_p', 'read_pc', 'deliver_p', 'deliver_pc') THEN
        RETURN format(
            $Q$
            WITH %1$s,
            leased AS (
                UPDATE pgmq.%2$I q
                SET vt = clock_timestamp() + make_interval(secs => $4),
                    read_ct = q.read_ct + 1,
                    last_read_at = clock_timestamp()
                WHERE %6$s
                RETURNING %3$s
            )
            SELECT *%4$s FROM leased ORDER BY %5$s
            $Q$,
            pgbroker._visible_from_sql(qtable, CASE WHEN op LIKE '%c' THEN '{"c": 1}'::jsonb END, prioritized),
            qtable, columns,
            CASE WHEN op LIKE 'deliver%' THEN ', pgbroker.receipt(msg_id, read_ct, vt)' ELSE '' END,
            result_order, picked_rows);
    ELSIF op IN ('pop', 'pop_p') THEN
        RETURN format(
            $Q$
            WITH %1$s,
            popped AS (
                DELETE FROM pgmq.%2$I q WHERE %5$s
                RETURNING %3$s
            )
            SELECT * FROM popped ORDER BY %4$s
            $Q$, pgbroker._visible_from_sql(qtable, NULL, prioritized), qtable, columns, result_order, picked_rows);
    ELSIF op IN ('ack_a', 'ack_d') THEN
        RETURN format(
            $Q$
            WITH removed AS (
                DELETE FROM pgmq.%1$I q
                WHERE %5$s
                  -- A hashed subplan, not a join: a partitioned queue's range above makes
                  -- the planner expect a row or two here, and it then rescanned the
                  -- receipts for each (300 acks: 45,000 comparisons, 12 ms).
                  AND ((q.msg_id, q.read_ct, pgbroker._micros(q.vt)) IN (SELECT * FROM unnest($1, $2, $3))) IS TRUE
                  AND q.vt > clock_timestamp()
                RETURNING %3$s
            )%4$s
            SELECT msg_id FROM removed ORDER BY msg_id
            $Q$, qtable, atable, columns,
            CASE WHEN op = 'ack_a' THEN format(
                $A$,
            archived AS (
                INSERT INTO pgmq.%I (msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers)
                SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers FROM removed
            )$A$, atable) ELSE '' END, given_rows);
    ELSIF op IN ('remove_a', 'remove_d') THEN
        -- pgmq.archive and pgmq.delete: by msg_id, whoever holds the message (unfenced).
        RETURN CASE WHEN op = 'remove_d' THEN format(
            'DELETE FROM pgmq.%I q WHERE %s RETURNING q.msg_id', qtable, given_rows)
        ELSE format(
            $Q$
            WITH moved AS (
                DELETE FROM pgmq.%1$I q WHERE %3$s
                RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message, q.headers
            )
            INSERT INTO pgmq.%2$I (msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers)
            SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers FROM moved
            RETURNING msg_id
            $Q$, qtable, atable, given_rows) END;
    END IF;
    RAISE EXCEPTION 'pgbroker._statement_query: unknown operation %', quote_literal(op) USING ERRCODE = 'PB007';
END;
$$;

-- A queue's hot statement for op as PREPARE <name> (<types>) AS <query>.
CREATE OR REPLACE FUNCTION pgbroker._statement(qtable text, op text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN format('PREPARE %I (%s) AS %s', pgbroker._statement_name(qtable, op),
                  array_to_string(pgbroker._statement_types(op), ', '), pgbroker._statement_query(qtable, op));
END;
$$;

-- A timestamp as a literal that reads back as the same instant in any
-- session: its JSON form, ISO 8601 with a numeric offset. Its text form does
-- not: under DateStyle SQL or Postgres it names the zone by its abbreviation,
-- which is read back by the abbreviation table, so under Asia/Kolkata the
-- clock written into a read came back 3 h 30 min late (IST read as Israel's),
-- and the read took messages leased to other consumers and messages still
-- delayed (tests/engine/test_security.py).
CREATE OR REPLACE FUNCTION pgbroker._instant_literal(instant timestamptz)
RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT quote_nullable(to_json(instant) #>> '{}');
$$;

-- A queue's hot statement for op with its parameters bound to args (SQL
-- literals, one per parameter: quote_nullable, pgbroker._instant_literal for
-- a timestamp), as the text to run; the
-- dynamic path of reads, pops and acks (a queue the routes do not hold, a
-- conditional read, a limited queue).
--
-- A session prepared statement is used only when this call runs with the
-- session's own rights (current_user = session_user). Its name is known, so
-- any session can PREPARE a statement of its own under it first, and not even
-- the same text would do: its names resolved under the search_path of that
-- PREPARE. Run by a SECURITY DEFINER entry point (the roles, 88_roles.sql)
-- it would run as the owner; run with the session's rights it can do nothing
-- the session could not do itself. Even then it is used only if its text is
-- the engine's current one, or it is prepared again (an upgrade, or another
-- statement under that name).
-- Otherwise the query runs with the values written in as typed literals
-- (pgbroker._route_statement): planned on each call, and nothing of the
-- session is involved.
CREATE OR REPLACE FUNCTION pgbroker._statement_call(qtable text, op text, VARIADIC args text[])
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    statement_name constant text := pgbroker._statement_name(qtable, op);
    types constant text[] := pgbroker._statement_types(op);
    typed text[];
    statement text;
    found text;
BEGIN
    FOR i IN 1..cardinality(types) LOOP
        typed[i] := format('%s::%s', coalesce(args[i], 'NULL'), types[i]);
    END LOOP;
    IF current_user <> session_user THEN
        RETURN pgbroker._route_statement(pgbroker._statement_query(qtable, op), typed);
    END IF;
    statement := pgbroker._statement(qtable, op);
    SELECT s.statement INTO found FROM pg_prepared_statements s WHERE s.name = statement_name;
    IF found IS DISTINCT FROM statement THEN
        IF found IS NOT NULL THEN
            EXECUTE format('DEALLOCATE %I', statement_name);
        END IF;
        EXECUTE statement;
    END IF;
    RETURN format('EXECUTE %I(%s)', statement_name, array_to_string(typed, ', '));
END;
$$;

-- A queue's bounds: its newest row of pgbroker.queue_head (NULLs when it has
-- none yet), an index walk backwards that meets it first. (Not named
-- _queue_head: that is the table's array type, and a call of it on a varchar
-- would be taken for a cast.) The planner is held
-- to that walk: from statistics taken while the table held a row a queue it
-- would scan the table and sort, and keep that plan for the session while the
-- rows an advance replaced pile up under a held horizon.
CREATE OR REPLACE FUNCTION pgbroker._queue_bounds(stored_name text)
RETURNS pgbroker.queue_head LANGUAGE plpgsql STABLE
SET enable_seqscan = off SET enable_sort = off AS $$
DECLARE
    h pgbroker.queue_head;
BEGIN
    SELECT * INTO h FROM pgbroker.queue_head qh WHERE qh.queue_name = stored_name ORDER BY qh.seq DESC LIMIT 1;
    RETURN h;
END;
$$;

-- A queue's stored name and the policy settings the hot path needs, in one
-- probe; no row when the queue does not exist. read_mode: see
-- pgbroker._read_mode.
CREATE OR REPLACE FUNCTION pgbroker._queue(queue_name text,
    OUT stored_name text, OUT max_deliveries integer, OUT max_depth bigint, OUT ack_mode text,
    OUT ready_from bigint, OUT read_mode text)
RETURNS SETOF record LANGUAGE sql STABLE AS $$
    SELECT m.queue_name, p.max_deliveries, p.max_depth, p.ack_mode, coalesce(h.ready_from, 0),
           pgbroker._read_mode(p)
    FROM pgmq.meta m
    LEFT JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
    LEFT JOIN LATERAL pgbroker._queue_bounds(m.queue_name) h ON true
    WHERE lower(m.queue_name) = lower($1);
$$;

------------------------------------------------------------------------------
-- Where reads start
------------------------------------------------------------------------------

-- The transactions writing any of these tables now (their virtual
-- transaction ids): ROW EXCLUSIVE, which an INSERT, UPDATE or DELETE takes
-- before it writes and keeps until its transaction ends; this session's and
-- ignore_pids' excepted, prepared transactions included (no pid). A look at
-- pg_locks, which scans the lock table: for the rare step, not every call.
CREATE OR REPLACE FUNCTION pgbroker._writers(tables oid[], ignore_pids integer[] DEFAULT '{}')
RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(DISTINCT l.virtualtransaction), '{}')
    FROM pg_catalog.pg_locks l
    WHERE l.locktype = 'relation'
      -- Relation oids are per database: a lock in another database may carry the same one.
      AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = current_database())
      AND l.relation = ANY (tables)
      AND l.mode = 'RowExclusiveLock' AND l.granted
      AND l.pid IS DISTINCT FROM pg_backend_pid()
      AND (l.pid IS NULL OR l.pid <> ALL (coalesce(ignore_pids, '{}')));
$$;

-- Move a queue's bounds up (see the header), and sweep below timed_from when
-- a sweep is due; a no-op unless this transaction is the one advancing the
-- queue now. Each bound moves in two steps: a candidate, then,
-- once every transaction older than the candidate's id has ended, the bound.
CREATE OR REPLACE FUNCTION pgbroker._advance_head(stored_name text, qtable text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    margin constant interval := '1 second';
    sweep_every constant interval := '10 seconds';
    -- how long a candidate waits for the horizon before its writers decide
    patience constant interval := '1 second';
    -- First rows by ORDER BY ... LIMIT 1, never min(): with statistics taken
    -- while the queue was empty the planner may run min() as an aggregate
    -- over the whole range (every message of a burst: 30 ms at 100,000).
    due_sql constant text := format(
        'SELECT vt FROM pgmq.%I WHERE NOT (read_ct = 0 AND vt <= enqueued_at) AND vt >= $1 AND vt < $2'
        ' ORDER BY vt LIMIT 1', qtable);
    before pgbroker.queue_head;
    h pgbroker.queue_head;
    oldest xid8;
    first_ready bigint;
    first_due timestamptz;
    seq text;
    record_ready boolean;
    record_timed boolean;
    recording boolean;
    mine xid8;
    ready_held boolean;
    timed_held boolean;
    writers text[];  -- the queue's writers now, looked up only for a candidate held back
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN;
    END IF;
    before := pgbroker._queue_bounds(stored_name);
    IF before.seq IS NULL THEN
        -- The first row, made once: creators take turns on the queue's row of pgmq.meta.
        PERFORM FROM pgmq.meta m WHERE m.queue_name = stored_name FOR NO KEY UPDATE SKIP LOCKED;
        IF FOUND AND (pgbroker._queue_bounds(stored_name)).seq IS NULL THEN
            INSERT INTO pgbroker.queue_head (queue_name, ready_from) VALUES (stored_name, 0);
        END IF;
        RETURN;  -- the lock took an id: the next advance records the candidates
    END IF;
    h := before;
    SELECT pg_snapshot_xmin(pg_current_snapshot()) INTO oldest;

    -- A candidate held back by the horizon: its writers decide (see the header).
    ready_held := oldest < h.next_xmax AND h.next_at < clock_timestamp() - patience;
    timed_held := oldest < h.timed_next_xmax AND h.timed_next < clock_timestamp() - margin - patience;
    IF ready_held OR timed_held THEN
        writers := pgbroker._writers(ARRAY[format('pgmq.%I', qtable)::regclass::oid]);
        IF ready_held THEN
            h.next_writers := coalesce(h.next_writers, writers);
        END IF;
        IF timed_held THEN
            h.timed_next_writers := coalesce(h.timed_next_writers, writers);
        END IF;
    END IF;

    IF h.next_xmax IS NOT NULL AND (oldest >= h.next_xmax OR NOT (writers && h.next_writers)) THEN
        EXECUTE format('SELECT msg_id FROM pgmq.%I'
                       ' WHERE read_ct = 0 AND vt <= enqueued_at AND msg_id >= $1 AND msg_id <= $2'
                       ' ORDER BY msg_id LIMIT 1', qtable)
            INTO first_ready USING h.ready_from, h.next_from;
        h.ready_from := greatest(h.ready_from, coalesce(first_ready, h.next_from + 1));
        h.next_from := NULL;
        h.next_xmax := NULL;
        h.next_at := NULL;
        h.next_writers := NULL;
    END IF;
    IF h.timed_from IS NOT NULL AND (h.timed_swept_at IS NULL OR h.timed_swept_at < clock_timestamp() - sweep_every) THEN
        EXECUTE due_sql INTO first_due USING '-infinity'::timestamptz, h.timed_from;
        h.timed_from := least(h.timed_from, first_due);
        h.timed_swept_at := clock_timestamp();
    END IF;
    IF h.timed_next_xmax IS NOT NULL AND (oldest >= h.timed_next_xmax OR NOT (writers && h.timed_next_writers)) THEN
        EXECUTE due_sql INTO first_due USING coalesce(h.timed_from, '-infinity'), h.timed_next;
        h.timed_from := greatest(h.timed_from, coalesce(first_due, h.timed_next));
        h.timed_next := NULL;
        h.timed_next_xmax := NULL;
        h.timed_next_writers := NULL;
    END IF;

    record_ready := h.next_xmax IS NULL;
    record_timed := h.timed_next_xmax IS NULL;
    recording := (record_ready OR record_timed) AND pg_current_xact_id_if_assigned() IS NULL;
    IF recording THEN
        seq := pg_get_serial_sequence(format('pgmq.%I', qtable), 'msg_id');
        IF record_ready AND seq IS NOT NULL THEN
            EXECUTE format('SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM %s', seq)
                INTO h.next_from;
            h.next_at := clock_timestamp();
        END IF;
        IF record_timed THEN
            h.timed_next := clock_timestamp() - margin;
        END IF;
    END IF;

    IF h IS NOT DISTINCT FROM before THEN
        RETURN;
    END IF;
    -- One advancer at a time, on the queue's row of pgmq.meta (the others
    -- skip it, as they skip an advance while the queue changes; an advisory
    -- lock, which any session may take, let an outsider stop the advances for
    -- good), and only while the bounds are those read: a concurrent lowering
    -- (set_vt) wins. The row lock gives this transaction its id, after the
    -- sequence and the clock were read: see the header.
    PERFORM FROM pgmq.meta m WHERE m.queue_name = stored_name FOR NO KEY UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF recording THEN
        mine := pg_current_xact_id();
        IF record_ready AND seq IS NOT NULL THEN
            h.next_xmax := mine;
        END IF;
        IF record_timed THEN
            h.timed_next_xmax := mine;
        END IF;
    END IF;
    -- Appended, while the row read is still the bounds as read (a lowering
    -- changes them in place), and that row removed (see structure/50_reads.sql).
    INSERT INTO pgbroker.queue_head (queue_name, ready_from, next_from, next_xmax, timed_from, timed_next,
                                     timed_next_xmax, timed_swept_at, next_at, next_writers, timed_next_writers)
    SELECT stored_name, h.ready_from, h.next_from, h.next_xmax, h.timed_from, h.timed_next, h.timed_next_xmax,
           h.timed_swept_at, h.next_at, h.next_writers, h.timed_next_writers
    FROM pgbroker.queue_head qh
    WHERE qh.queue_name = stored_name AND qh.seq = before.seq AND qh.ready_from = before.ready_from
      AND qh.timed_from IS NOT DISTINCT FROM before.timed_from;
    IF FOUND THEN
        DELETE FROM pgbroker.queue_head qh WHERE qh.queue_name = stored_name AND qh.seq = before.seq;
    END IF;
END;
$$;

-- Lower a queue's bounds (NULL: that one stays): its newest row, in place,
-- after the advancers' turn (the queue's row of pgmq.meta, waited for), so
-- that an advance computed from the bounds before cannot write over it.
-- (Rare: set_vt, and reads given a vt in the past.)
CREATE OR REPLACE FUNCTION pgbroker._lower_head(stored_name text, ready_from bigint, timed_from timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM pgmq.meta m WHERE m.queue_name = stored_name FOR NO KEY UPDATE;
    UPDATE pgbroker.queue_head h
    SET ready_from = CASE WHEN h.ready_from > _lower_head.ready_from THEN _lower_head.ready_from
                          ELSE h.ready_from END,
        timed_from = CASE WHEN h.timed_from > _lower_head.timed_from THEN _lower_head.timed_from
                          ELSE h.timed_from END
    WHERE h.queue_name = stored_name AND h.seq = (pgbroker._queue_bounds(stored_name)).seq
      AND (h.ready_from > _lower_head.ready_from OR h.timed_from > _lower_head.timed_from);
END;
$$;

-- Lower a queue's timed_from to vt (a writer that may write a vt below it).
CREATE OR REPLACE FUNCTION pgbroker._lower_timed_from(stored_name text, vt timestamptz)
RETURNS void LANGUAGE sql AS $$
    SELECT pgbroker._lower_head(stored_name, NULL::bigint, vt);
$$;

------------------------------------------------------------------------------
-- Reads
------------------------------------------------------------------------------

-- The read statement of a queue, run: pgmq.read's rows (deliver: with
-- receipts). The caller has checked the queue and the arguments. mode is the
-- queue's read mode (pgbroker._read_mode): a paused queue gives nothing, a
-- limited one is read by pgbroker._read_limited (56_limits.sql), one with
-- priorities by the prioritized statements.
CREATE OR REPLACE FUNCTION pgbroker._run_read(stored_name text, ready_from bigint, vt integer, qty integer,
                                   conditional jsonb, deliver boolean, mode text DEFAULT 'plain')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    qtable text := lower('q_' || stored_name);
    variant text := CASE WHEN mode = 'priority' THEN 'p' ELSE '' END
                    || CASE WHEN conditional IS NULL OR conditional = '{}'::jsonb THEN '' ELSE 'c' END;
    op text := CASE WHEN deliver THEN 'deliver' ELSE 'read' END || CASE WHEN variant = '' THEN '' ELSE '_' || variant END;
BEGIN
    IF mode = 'paused' THEN
        RETURN CASE WHEN deliver THEN 'SELECT (NULL::pgbroker.delivery).* LIMIT 0'
                    ELSE 'SELECT (NULL::pgmq.message_record).* LIMIT 0' END;
    END IF;
    IF random() < 0.0625 THEN
        PERFORM pgbroker._advance_head(stored_name, qtable);
    END IF;
    IF mode = 'limited' THEN
        RETURN format('SELECT m.*%s FROM pgbroker._read_limited(%L, %s, %s, %s, %L, false) m',
                      CASE WHEN deliver THEN ', pgbroker.receipt(m.msg_id, m.read_ct, m.vt)' ELSE '' END,
                      stored_name, ready_from, vt, qty, conditional);
    END IF;
    RETURN pgbroker._statement_call(qtable, op, quote_nullable(qty), quote_nullable(conditional),
                                    pgbroker._instant_literal(clock_timestamp()), quote_nullable(vt),
                                    quote_nullable(ready_from),
                                    pgbroker._instant_literal((pgbroker._queue_bounds(stored_name)).timed_from));
END;
$$;

-- The pop statement of a queue, run (mode as for _run_read).
CREATE OR REPLACE FUNCTION pgbroker._run_pop(stored_name text, ready_from bigint, qty integer, mode text)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF mode = 'paused' THEN
        RETURN 'SELECT (NULL::pgmq.message_record).* LIMIT 0';
    ELSIF mode = 'limited' THEN
        RETURN format('SELECT * FROM pgbroker._read_limited(%L, %s, NULL, %s, NULL, true)',
                      stored_name, ready_from, qty);
    END IF;
    RETURN pgbroker._statement_call(lower('q_' || stored_name), CASE WHEN mode = 'priority' THEN 'pop_p' ELSE 'pop' END,
                                    quote_nullable(qty), NULL, pgbroker._instant_literal(clock_timestamp()), NULL,
                                    quote_nullable(ready_from),
                                    pgbroker._instant_literal((pgbroker._queue_bounds(stored_name)).timed_from));
END;
$$;

-- Read and deliver for a queue with max_deliveries (pgbroker.read's body once
-- the queue and arguments are checked; without max_deliveries the callers run
-- the read statement themselves): a message already delivered max_deliveries
-- times (each consumer died or let its lease run out) is dead-lettered
-- instead of delivered again, so a read may return fewer messages than qty
-- while more are waiting.
CREATE OR REPLACE FUNCTION pgbroker._deliver(stored_name text, ready_from bigint, max_deliveries integer, vt integer,
                                  qty integer, conditional jsonb, mode text DEFAULT 'plain')
RETURNS SETOF pgbroker.delivery LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    statement text := pgbroker._run_read(stored_name, ready_from, vt, qty, conditional, true, mode);
    d pgbroker.delivery;
    batch pgbroker.delivery[] := '{}';
    over bigint[];
BEGIN
    -- The statement returns its rows in their delivery order.
    FOR d IN EXECUTE statement LOOP
        batch := array_append(batch, d);
    END LOOP;
    over := ARRAY(SELECT b.msg_id FROM unnest(batch) b WHERE b.read_ct > max_deliveries);
    IF cardinality(over) > 0 THEN
        PERFORM pgbroker._dead_letter(stored_name, over,
            format('delivered %s times without an ack or a failure report '
                   '(its consumers died or let their leases run out)', max_deliveries),
            -1);
    END IF;
    RETURN QUERY SELECT * FROM unnest(batch) b WHERE b.read_ct <= max_deliveries;
END;
$$;

-- pgmq.read for the arguments pgmq accepts and pgbroker's reads refuse (0018):
-- a negative or NULL vt, a NULL qty. They run as pgmq runs them: every row
-- with vt <= now, oldest first, up to qty (NULL: no limit), leased until now
-- + vt, so a negative vt leaves them visible at once and a NULL one fails on
-- the first row touched with the NOT NULL violation of column vt (23502);
-- nothing visible, nothing fails. The scan ignores the queue's bounds (these
-- calls are rare), and a lease that ends in the past lowers timed_from first,
-- as set_vt does, so the next read finds those messages at once. Rows come
-- in msg_id order, as every read's do here.
CREATE OR REPLACE FUNCTION pgbroker._pgmq_read_as_given(queue_name text, vt integer, qty integer, conditional jsonb)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
    lease interval := make_interval(secs => vt);
BEGIN
    IF vt < 0 THEN
        PERFORM pgbroker._lower_timed_from(pgbroker._stored_name(queue_name), clock_timestamp() + lease);
    END IF;
    RETURN QUERY EXECUTE format(
        $Q$
        WITH picked AS (
            SELECT msg_id FROM pgmq.%1$I
            WHERE vt <= clock_timestamp() AND ($3 IS NULL OR $3 = '{}'::jsonb OR message @> $3)
            ORDER BY msg_id
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ), leased AS (
            UPDATE pgmq.%1$I m
            SET last_read_at = clock_timestamp(), vt = clock_timestamp() + $2, read_ct = m.read_ct + 1
            FROM picked WHERE m.msg_id = picked.msg_id
            RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers
        )
        SELECT * FROM leased ORDER BY msg_id
        $Q$, qtable)
    USING qty, lease, conditional;
END;
$$;

-- Lease up to qty visible messages for vt seconds, oldest first, through the
-- read route (90_routes.sql). A conditional read (message @> conditional)
-- takes the dynamic path; the arguments only pgmq accepts take
-- pgbroker._pgmq_read_as_given (a negative qty fails in the route, as
-- pgmq's LIMIT fails).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.read(queue_name TEXT, vt INTEGER, qty INTEGER, conditional JSONB DEFAULT '{}')
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    IF (vt IS NULL OR vt < 0 OR qty IS NULL) AND coalesce(qty >= 0, true) THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_read_as_given(queue_name, vt, qty, conditional);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_read(queue_name, vt, qty, conditional);
END;
$$;

-- Run a read statement until it returns rows or max_poll_seconds have
-- passed, sleeping poll_interval_ms between tries; shared by every
-- *_with_poll form. It always reads at least once.
CREATE OR REPLACE FUNCTION pgbroker._poll(read_statement text, max_poll_seconds integer, poll_interval_ms integer)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz;
    got bigint;
BEGIN
    PERFORM pgbroker._check_arg(max_poll_seconds IS NOT NULL AND max_poll_seconds >= 0,
        format('max_poll_seconds must be >= 0, got %s', coalesce(max_poll_seconds::text, 'NULL')));
    PERFORM pgbroker._check_arg(poll_interval_ms IS NOT NULL AND poll_interval_ms > 0,
        format('poll_interval_ms must be > 0, got %s', coalesce(poll_interval_ms::text, 'NULL')));
    deadline := clock_timestamp() + make_interval(secs => max_poll_seconds);
    LOOP
        RETURN QUERY EXECUTE read_statement;
        GET DIAGNOSTICS got = ROW_COUNT;
        EXIT WHEN got > 0 OR clock_timestamp() >= deadline;
        PERFORM pg_sleep(poll_interval_ms / 1000.0);
    END LOOP;
END;
$$;

-- pgbroker._poll with pgmq's terms for the arguments it refuses (0018): a
-- negative max_poll_seconds returns nothing without reading (pgmq's deadline
-- has passed before its first read), a NULL one polls until rows come, and a
-- poll_interval_ms <= 0 or NULL reads again without sleeping. (A
-- max_poll_seconds of 0 reads once: docs/compatibility.md, D13.)
CREATE OR REPLACE FUNCTION pgbroker._pgmq_poll(read_statement text, max_poll_seconds integer, poll_interval_ms integer)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + make_interval(secs => max_poll_seconds);
    got bigint;
BEGIN
    IF max_poll_seconds >= 0 AND poll_interval_ms > 0 THEN
        RETURN QUERY SELECT * FROM pgbroker._poll(read_statement, max_poll_seconds, poll_interval_ms);
        RETURN;
    END IF;
    IF max_poll_seconds < 0 THEN
        RETURN;
    END IF;
    LOOP
        RETURN QUERY EXECUTE read_statement;
        GET DIAGNOSTICS got = ROW_COUNT;
        EXIT WHEN got > 0 OR clock_timestamp() >= deadline;  -- no deadline: until rows come
        IF poll_interval_ms > 0 THEN
            PERFORM pg_sleep(poll_interval_ms / 1000.0);
        END IF;
    END LOOP;
END;
$$;

-- Read as pgmq.read does, waiting up to max_poll_seconds (checking every
-- poll_interval_ms) while nothing is ready.
-- Returns: up to qty messages, hidden for vt seconds.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.read_with_poll(
    queue_name TEXT,
    vt INTEGER,
    qty INTEGER,
    max_poll_seconds INTEGER DEFAULT 5,
    poll_interval_ms INTEGER DEFAULT 100,
    conditional JSONB DEFAULT '{}'
)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._pgmq_poll(
        format('SELECT * FROM pgmq.read(%L, %s, %s, %L)', queue_name, coalesce(vt::text, 'NULL'),
               coalesce(qty::text, 'NULL'), conditional),
        max_poll_seconds, poll_interval_ms);
$$;

-- pgmq.pop with a NULL qty, which pgmq takes as no limit (0018): every
-- visible message, deleted and returned in msg_id order.
CREATE OR REPLACE FUNCTION pgbroker._pgmq_pop_all(queue_name text)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY EXECUTE format(
        $Q$
        WITH picked AS (
            SELECT msg_id FROM pgmq.%1$I WHERE vt <= clock_timestamp() ORDER BY msg_id FOR UPDATE SKIP LOCKED
        ), popped AS (
            DELETE FROM pgmq.%1$I q USING picked WHERE q.msg_id = picked.msg_id
            RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message, q.headers
        )
        SELECT * FROM popped ORDER BY msg_id
        $Q$, pgbroker._pgmq_table(queue_name));
END;
$$;

-- Delete and return up to qty visible messages, through the pop route.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.pop(queue_name TEXT, qty INTEGER DEFAULT 1)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    IF qty IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_pop_all(queue_name);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_pop(queue_name, qty);
END;
$$;

-- Read like pgmq.read, with a receipt per message (40_receipts.sql), through
-- the deliver route; honours the queue's max_deliveries (see _deliver).
-- Arguments: vt: seconds the messages stay leased; qty: at most how many;
--   conditional: a JSON object the messages must contain.
-- Returns: a pgbroker.delivery per message: pgmq's record and its receipt,
--   for ack, nack, extend and fail.
-- Errors: PB002 when the queue does not exist; PB007 on a NULL or negative
--   vt or qty.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.read(queue_name text, vt integer, qty integer, conditional jsonb DEFAULT '{}')
RETURNS SETOF pgbroker.delivery LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_deliver(queue_name, vt, qty, conditional);
END;
$$;

-- pgbroker.read, polled as pgmq.read_with_poll polls, so that waiting reads
-- honour max_deliveries too. (pgbroker._poll returns message records: the
-- receipt is made again from msg_id, read_ct and vt, as pgbroker.read makes
-- it.)
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.read_with_poll(
    queue_name text, vt integer, qty integer,
    max_poll_seconds integer DEFAULT 5, poll_interval_ms integer DEFAULT 100,
    conditional jsonb DEFAULT '{}')
RETURNS SETOF pgbroker.delivery LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT m.*, pgbroker.receipt(m.msg_id, m.read_ct, m.vt)
    FROM pgbroker._poll(
        format('SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers'
               ' FROM pgbroker.read(%L, %s, %s, %L)',
               queue_name, coalesce(vt::text, 'NULL'), coalesce(qty::text, 'NULL'), conditional),
        max_poll_seconds, poll_interval_ms) m;
$$;
