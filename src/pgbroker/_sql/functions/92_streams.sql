-- Streams: append-only logs read by consumer groups (PgQ's lesson).
--
-- A queue leases, updates and deletes every message; a stream does none of
-- that. Producers only INSERT into the stream's log. A consumer group is a
-- cursor per partition (the id it has acknowledged up to); reading a batch
-- moves nothing but that cursor, in one tiny row. Old messages go by
-- TRUNCATE of whole child tables, never by DELETE. So the log has no row
-- lock, no per-message UPDATE or DELETE, and no dead tuple: its cost is that
-- of inserts and index-ordered reads. Any number of groups read the same
-- rows (fan-out without copies).
--
-- Layout of stream <s> (names lower-cased):
--   pgbroker.s_<s>            the log, PARTITION BY LIST (segment)
--   pgbroker.s_<s>_0 .. _K-1  its K child tables, used as a ring (below)
--   pgbroker.s_<s>_seq        the ids: one sequence for the whole stream
-- A row is (id, segment, partition, key, enqueued_at, headers, message), and
-- the only index is (partition, id): a consumer of partition p reads
-- "partition = p AND id > cursor AND id <= safe_id ORDER BY id LIMIT n", a
-- walk of n index entries, whatever the backlog.
--
-- Partitions. A message with a key goes to partition hash(key) mod N, so the
-- messages of a key are read in order by one consumer at a time; one without
-- a key goes to id mod N. N is fixed when the stream is made.
--
-- Segments, the ring. id / segment_rows is the message's segment number and
-- that number mod K its child table: the child tables take turns, like
-- PgQ's rotating event tables. Retention (pgbroker.maintain_stream) empties
-- a child table with TRUNCATE when every row in it may go: when every group
-- has acknowledged past its newest segment, or by time or size. Should
-- consumers lag a whole lap, a child holds two laps until both may go:
-- correctness never depends on rotation, only disk use does.
--
-- Commit-safe reads: the safe id. Ids are drawn from the sequence when a
-- send runs, not when it commits, so "id > cursor" alone would skip a
-- message whose transaction commits after a larger id was read (measured
-- for Spark's log mode: 934 of 20,000 lost with 8 producers). Every read is
-- bounded by the stream's safe_id, an id such that every id at or below it
-- is settled: its transaction has committed (the row is visible to any
-- later statement) or rolled back (the row will never exist). It advances in
-- two steps (pgbroker._stream_safe_id), in the manner of PgQ's ticks:
--   1. read L = the sequence's last value; then list the transactions that
--      hold ROW EXCLUSIVE on the log table (pg_locks): the candidate is
--      (L, those transactions).
--   2. once none of those transactions holds the lock any more (they have
--      ended), safe_id := L. With no writer in step 1, at once.
-- Why that is enough: an INSERT takes its table's ROW EXCLUSIVE lock when
-- the statement is parsed or its plan is checked, before any value of the
-- row (nextval included) is computed, and keeps it until its transaction
-- ends. A transaction that drew an id <= L drew it before L was read, so it
-- held the lock before L was read and either still holds it when pg_locks is
-- read after (it is in the list, and step 2 waits for it) or has already
-- ended (settled). A transaction that takes the lock after the list was made
-- draws its id after L was read: a larger id, beyond the candidate. Only
-- transactions that write this stream are waited for: a long transaction
-- elsewhere in the database does not hold the stream back (unlike a bound on
-- the snapshot's xmin), and a producer held open for minutes delays the
-- stream's readers by that long but makes them skip nothing.
-- Before pg_locks (a scan of the whole lock table, dearer with every lock of
-- the cluster), a probe: a SHARE lock on the log table tried without waiting
-- and given back at once (pgbroker._stream_unwritten). Had, it says that no
-- transaction holds ROW EXCLUSIVE on the log at that moment, after L was
-- read: every id <= L is settled, the candidate's with them, and L is safe at
-- once. Only when a writer is at work do the two steps above run.
-- A read in READ COMMITTED takes a new snapshot per statement, so the rows
-- at or below safe_id are all visible to the statement that reads them.
-- Reads in REPEATABLE READ or SERIALIZABLE are refused (their snapshot is
-- older than the safe id they would see).
--
-- Groups, consumers and leases. A group has a cursor row per partition
-- (owner and epoch) and a position per partition: acked_id (acknowledged up
-- to) and delivered_id (handed out up to: a consumer may read ahead of its
-- acks), appended, never updated (see "Positions"). A consumer names itself
-- (any unique text) and keeps a heartbeat row, renewed every half lease. The
-- live consumers of a group, ordered by name, share the partitions evenly
-- (the i-th gets floor(N/n), plus one for the first N mod n); on every read
-- a consumer gives up partitions beyond its share (only those with nothing
-- in flight) and takes free ones (unowned, or whose owner is not live) up to
-- it. A taken partition's epoch goes up and its delivered_id goes back to
-- acked_id: the batch a dead consumer held is delivered again, to the new
-- owner. An ack names the epoch it read under; an ack from a former owner
-- changes nothing.
--
-- Live: within its lease, and not known dead. Every session a consumer reads
-- on takes its liveness lock (an advisory lock keyed by stream, group and
-- consumer, shared, held by the session until it ends), and a read tries each
-- other consumer's lock exclusively, at once: it is had only when no session
-- of that consumer is left (the process was killed, or lost its
-- connections); that consumer's row is then deleted and its partitions are
-- free at that read, not at the end of its lease. A session that reads for
-- several consumers holds each lock, so a consumer looks alive while any of
-- its sessions does. A restart of the server ends every session, the live
-- consumers' too, and so does a failover (the promoted standby had none of
-- them): a consumer is judged by its lock only once it has renewed its
-- heartbeat since the server took writes (_stream_sessions_since), which each
-- does at its first read after it. A pooler that hands one server session to many clients,
-- or a pool that resets sessions (DISCARD ALL), makes the lock say less, and
-- the lease decides as before. A caller whose sessions are shared by many
-- consumers (the HTTP API's pool) reads with lease_only: it takes no lock,
-- and its consumer is live by its lease alone. Its sessions took a lock for
-- every consumer name they were ever given, and kept it: a key that may read
-- one stream filled the server's shared lock table (every lock of every
-- session of the cluster then failed) with reads under made-up names. Nothing rests on the lock for safety: a
-- consumer judged dead wrongly loses its partitions' epochs (its acks are
-- fenced off, its batch is delivered again) and takes its share back at its
-- next read.
--
-- Generations. A consumer that lost its connection during a read rewinds
-- (stream_rewind): the read may have committed without its answer arriving.
-- But a read may also commit after the rewind: a hung server, a stuck pooler
-- or a session stopped for a while runs the read it was sent once it goes on,
-- though its client has long given up (a cancel that comes while the session
-- waits for a command is ignored). That read moves the partitions past rows
-- no one handles, and the consumer, still owning them, never has them. So a
-- consumer may name its generation (any bigint, new at each rewind: pgbroker's
-- clients draw one at random): the rewind marks the consumer's cursor rows
-- with the new one, a read that takes a partition marks it with its own, and
-- a read whose generation differs from a partition it locked is refused
-- (PB022) and changes nothing. The check comes after the rows are locked, so
-- a read and a rewind are ordered: a read before the rewind is rewound by it,
-- a read after it is refused. A consumer that names no generation (NULL) is
-- never refused, and fenced by nothing.

-- Failures. An ack lists the messages of the batch that failed; each goes,
-- with its error and its place in the stream in header x-pgbroker-stream,
-- to the group's retry queue, an ordinary queue made with the group: the
-- queue's policy (20_policies.sql) then applies as to any message: back-off
-- (the first wait is retry_delay(policy, 1)), max_deliveries, and the
-- dead-letter queue (65_failures.sql). A retry queue whose max_deliveries is
-- 1 dead-letters a failed message at once.
--
-- While a transaction holds back the xmin horizon no row version an UPDATE
-- or DELETE leaves can be pruned or vacuumed. So what changes with every
-- batch is appended: a read appends a position for each partition it moves,
-- once, with the ack that came with it (stream_consume), and a watermark row
-- when it moves the safe id (about once a batch for consumers that keep up
-- with producers sending all the time); old rows go by TRUNCATE
-- ("Positions"). Still updated in place: the cursor row when a partition
-- changes hands and the consumer's heartbeat row every half lease (events
-- and time, not messages). Those tables stay small (rows per group and
-- partition, per live consumer), no indexed column changes and fillfactor
-- leaves room: the updates are HOT and the pages prune themselves once the
-- horizon moves on.

------------------------------------------------------------------------------
-- Tables
------------------------------------------------------------------------------

------------------------------------------------------------------------------
-- Names and lookups
------------------------------------------------------------------------------

-- A stream's row; PB020 naming the fix when there is none.
CREATE OR REPLACE FUNCTION pgbroker._stream_row(stream_name text)
RETURNS pgbroker.stream LANGUAGE plpgsql STABLE AS $$
DECLARE
    s pgbroker.stream;
BEGIN
    SELECT * INTO s FROM pgbroker.stream t WHERE t.stream_name = lower(_stream_row.stream_name);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'stream "%" does not exist', stream_name
            USING ERRCODE = 'PB020',
                  HINT = format('Create it first: SELECT pgbroker.create_stream(%L); or: pgbroker stream create %s',
                                stream_name, stream_name);
    END IF;
    RETURN s;
END;
$$;

-- A group's row; PB021 naming the fix when there is none.
CREATE OR REPLACE FUNCTION pgbroker._stream_group_row(stream_name text, group_name text)
RETURNS pgbroker.stream_group LANGUAGE plpgsql STABLE AS $$
DECLARE
    g pgbroker.stream_group;
BEGIN
    SELECT * INTO g FROM pgbroker.stream_group t
    WHERE t.stream_name = lower(_stream_group_row.stream_name) AND t.group_name = _stream_group_row.group_name;
    IF NOT FOUND THEN
        PERFORM pgbroker._stream_no_group(stream_name, group_name);
    END IF;
    RETURN g;
END;
$$;

-- Refuse a group as one the stream does not have: PB021 naming the fix, or
-- PB020 when there is no such stream either. Also what the HTTP API answers
-- for a group its key may not use, whether the group exists or not (the key
-- learns nothing of it).
CREATE OR REPLACE FUNCTION pgbroker._stream_no_group(stream_name text, group_name text)
RETURNS void LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM pgbroker._stream_row(stream_name);
    RAISE EXCEPTION 'stream "%" has no consumer group "%"', stream_name, group_name
        USING ERRCODE = 'PB021',
              HINT = format('Create it first: SELECT pgbroker.create_stream_group(%L, %L); '
                            'or: pgbroker stream create-group %s %s',
                            stream_name, group_name, stream_name, group_name);
END;
$$;

-- The channel a stream's sends are announced on (when the stream notifies).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.stream_notify_channel(stream_name text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT 'pgbroker.stream.' || (pgbroker._stream_row(stream_name)).stream_name;
$$;

------------------------------------------------------------------------------
-- Create and drop
------------------------------------------------------------------------------

-- The INSERT of a stream's sends (a statement of PL/pgSQL returning the ids,
-- over the variables messages, headers and keys), with the table, the
-- sequence and the stream's constants written in, for a plan cached per
-- session. The sequence is called in the FROM list, one row at a time in the
-- messages' order; the INSERT takes the log's lock before it runs (see the
-- safe id, above).
CREATE OR REPLACE FUNCTION pgbroker._stream_send_insert(s pgbroker.stream)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format(
        $F$
            RETURN QUERY
            INSERT INTO pgbroker.%1$I AS l (id, segment, partition, key, enqueued_at, headers, message)
            SELECT b.id, (b.id / %3$s) %% %4$s,
                   CASE WHEN b.k IS NULL THEN b.id %% %5$s
                        ELSE (hashtextextended(b.k, 0) & 9223372036854775807) %% %5$s END,
                   b.k, now(), b.h, b.m
            FROM (SELECT nextval('pgbroker.%2$I') AS id, u.m, u.h, u.k
                  FROM unnest(messages, headers, keys) WITH ORDINALITY AS u(m, h, k, n) ORDER BY u.n) AS b
            RETURNING l.id;$F$,
        's_' || s.stream_name, 's_' || s.stream_name || '_seq', s.segment_rows, s.segments, s.partitions);
$$;

-- The stream's own send function, s_<stream>_send: that INSERT.
CREATE OR REPLACE FUNCTION pgbroker._stream_send_function(s pgbroker.stream)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format(
        $F$
        CREATE OR REPLACE FUNCTION pgbroker.%1$I(messages jsonb[], headers jsonb[], keys text[])
        RETURNS SETOF bigint LANGUAGE plpgsql AS $B$
        BEGIN%2$s
        END;
        $B$
        $F$, 's_' || s.stream_name || '_send', pgbroker._stream_send_insert(s));
$$;

-- The send of any stream, by name (what stream_send_many calls): a branch per
-- stream holding the stream's INSERT, static SQL that PL/pgSQL plans once per
-- session. A dynamic EXECUTE of the stream's send function was parsed and
-- planned on every send: a send of 10 took 54-69 us of server time that way,
-- 45-46 us with a static call of the function, 35-37 us for the INSERT alone.
-- Written again by create_stream and drop_stream (see
-- _stream_send_router_refresh); a stream it does not name (none should be
-- missing) is sent to the dynamic way.
CREATE OR REPLACE FUNCTION pgbroker._stream_send_router_sql()
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT format(
        $F$
        CREATE OR REPLACE FUNCTION pgbroker._stream_send_to(stream_name text, messages jsonb[], headers jsonb[],
                                                            keys text[])
        RETURNS SETOF bigint LANGUAGE plpgsql AS $B$
        BEGIN
            IF stream_name IS NULL THEN
                RETURN;%1$s
            ELSE
                RETURN QUERY EXECUTE format('SELECT pgbroker.%%I($1, $2, $3)', 's_' || stream_name || '_send')
                    USING messages, headers, keys;
            END IF;
        END;
        $B$
        $F$,
        coalesce(string_agg(format(
            $R$
            ELSIF stream_name = %1$L THEN%2$s$R$,
            t.stream_name, pgbroker._stream_send_insert(t)), '' ORDER BY t.stream_name), ''))
    FROM pgbroker.stream t;
$$;

-- Write the send router again for the streams there are now. One writer at a
-- time (two concurrent CREATE OR REPLACE of one function fail): the lock
-- is taken before the streams are read, so the last writer sees them all.
-- It is a lock of pgbroker.stream only the owner may take (SHARE UPDATE
-- EXCLUSIVE: its readers and writers pass), not an advisory one, which an
-- outsider could hold to stop every create and drop of a stream.
CREATE OR REPLACE FUNCTION pgbroker._stream_send_router_refresh()
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE pgbroker.stream IN SHARE UPDATE EXCLUSIVE MODE;
    EXECUTE pgbroker._stream_send_router_sql();
END;
$$;

SELECT pgbroker._stream_send_router_refresh();

-- A stream's read of one segment, likewise its own function: a branch per
-- child table, each with its static statement (planned once per session),
-- which reads several partitions at once: for each, in the order given, an
-- index walk of (partition, id) from its after up to its wanted rows, and no
-- more than p_qty rows in all (a nested loop in the partitions' order: the
-- walks stop once p_qty are found). One statement for every partition of a
-- batch: a call a partition cost 35-40 us each, most of it the call itself.
-- It leaves in the transaction's setting pgbroker.stream_read_last, for each
-- partition it returned rows of, {its place in p_parts, the last id, how
-- many}, and writes nothing: the caller moves the cursors once for the read.
CREATE OR REPLACE FUNCTION pgbroker._stream_read_function(s pgbroker.stream)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format(
        $F$
        CREATE OR REPLACE FUNCTION pgbroker.%1$I(p_child integer, p_parts integer[], p_afters bigint[],
                                      p_upto bigint, p_wanted integer[], p_epochs bigint[], p_qty integer)
        RETURNS TABLE (partition integer, id bigint, epoch bigint, key text, enqueued_at timestamptz,
                       headers jsonb, message jsonb)
        LANGUAGE plpgsql AS $B$
        BEGIN
            %2$s
            END IF;
        END;
        $B$
        $F$, 's_' || s.stream_name || '_read',
        string_agg(format(
            $R$%1$s p_child = %2$s THEN
                RETURN QUERY
                WITH r AS (
                    SELECT u.n, l.partition, l.id, u.epoch, l.key, l.enqueued_at, l.headers, l.message
                    FROM unnest(p_parts, p_afters, p_wanted, p_epochs) WITH ORDINALITY
                         AS u(partition, after, wanted, epoch, n)
                    CROSS JOIN LATERAL (
                        SELECT * FROM pgbroker.%3$I x
                        WHERE x.partition = u.partition AND x.id > u.after AND x.id <= p_upto
                        ORDER BY x.id LIMIT u.wanted) l
                    LIMIT p_qty
                )
                -- (a one-time filter, run before the rows are returned, in order, from r)
                SELECT r.partition, r.id, r.epoch, r.key, r.enqueued_at, r.headers, r.message FROM r
                WHERE (SELECT set_config('pgbroker.stream_read_last',
                                         coalesce(array_agg(ARRAY[x.n, x.last_id, x.rows])::text, '{}'), true)
                       FROM (SELECT r.n, max(r.id) AS last_id, count(*) AS rows FROM r GROUP BY r.n) x)
                      IS NOT NULL;
            $R$, CASE WHEN c = 0 THEN 'IF' ELSE 'ELSIF' END, c, 's_' || s.stream_name || '_' || c),
            '' ORDER BY c))
    FROM generate_series(0, s.segments - 1) c;
$$;

-- Write every stream's own functions again from the templates above. The
-- function files run again whenever they change (install.py), and this call
-- with them, so a changed template reaches the streams that exist; a change
-- of a stream function's arguments or result columns needs its DROP in the
-- release's upgrade first, as for any function.
CREATE OR REPLACE FUNCTION pgbroker._stream_functions_refresh()
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    s pgbroker.stream;
BEGIN
    FOR s IN SELECT * FROM pgbroker.stream ORDER BY stream_name LOOP
        EXECUTE pgbroker._stream_send_function(s);
        EXECUTE pgbroker._stream_read_function(s);
    END LOOP;
END;
$$;

SELECT pgbroker._stream_functions_refresh();

-- Take a stream's turn among the operations that change it (create, drop,
-- groups), to the end of the transaction: its row, which only the schema's
-- owner may lock; a name with no stream yet takes an advisory lock, then the
-- row if a creator made it meanwhile (as pgbroker._queue_turn for queues: an
-- outsider holding that advisory lock can hold up only the creation of that
-- name). The safe id's advancers skip the row while it is held (they lock it
-- SKIP LOCKED) and use the newest committed watermark.
CREATE OR REPLACE FUNCTION pgbroker._stream_turn(stored_name text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM pgbroker.stream t WHERE t.stream_name = stored_name FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM pg_advisory_xact_lock(hashtext('pgbroker.stream:' || stored_name));
        PERFORM FROM pgbroker.stream t WHERE t.stream_name = stored_name FOR NO KEY UPDATE;
    END IF;
END;
$$;

-- Make a stream. segment_rows ids per segment, segments child tables in the
-- ring: retention frees a child at a time, so the log keeps at least one
-- segment and at most about segments x segment_rows rows while every group
-- keeps up. Idempotent for the same settings.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.create_stream(
    stream_name text,
    partitions integer DEFAULT 4,
    retention_seconds bigint DEFAULT NULL,
    retention_bytes bigint DEFAULT NULL,
    truncate_consumed boolean DEFAULT true,
    segment_rows bigint DEFAULT 1000000,
    segments integer DEFAULT 4,
    notify boolean DEFAULT false
)
RETURNS pgbroker.stream LANGUAGE plpgsql AS $$
DECLARE
    s pgbroker.stream;
    stored text := lower(create_stream.stream_name);
    log text;
BEGIN
    PERFORM pgbroker._check_name_characters(stream_name, 'stream');
    PERFORM pgbroker._check_arg(stored ~ '^[a-z0-9_][a-z0-9_-]{0,39}$',
        format('stream name must be 1 to 40 letters, digits, _ or - (not starting with -), got %L', stream_name),
        'For example ''clicks'' or ''orders-v2''; names are lower-cased.');
    PERFORM pgbroker._check_arg(partitions BETWEEN 1 AND 256,
        format('partitions must be between 1 and 256, got %s', coalesce(partitions::text, 'NULL')),
        'A partition is read by one consumer of a group at a time: make as many as consumers you will run.');
    PERFORM pgbroker._check_arg(segments BETWEEN 3 AND 64,
        format('segments must be between 3 and 64, got %s', coalesce(segments::text, 'NULL')));
    PERFORM pgbroker._check_arg(segment_rows >= 100,
        format('segment_rows must be >= 100, got %s', coalesce(segment_rows::text, 'NULL')));
    PERFORM pgbroker._check_arg(retention_seconds IS NULL OR retention_seconds BETWEEN 1 AND 3153600000,
        format('retention_seconds must be from 1 to 3153600000 (100 years; NULL: no time limit), got %s',
               retention_seconds));
    PERFORM pgbroker._check_arg(retention_bytes IS NULL OR retention_bytes >= 1,
        format('retention_bytes must be >= 1 (NULL: no size limit), got %s', retention_bytes));
    PERFORM pgbroker._check_arg(truncate_consumed IS NOT NULL AND notify IS NOT NULL,
        'truncate_consumed and notify must not be NULL');

    PERFORM pgbroker._stream_turn(stored);
    SELECT * INTO s FROM pgbroker.stream t WHERE t.stream_name = stored;
    IF FOUND THEN
        PERFORM pgbroker._check_arg(
            (s.partitions, s.segments, s.segment_rows) = (create_stream.partitions, create_stream.segments,
                                                         create_stream.segment_rows),
            format('stream "%s" exists with partitions %s, segments %s, segment_rows %s',
                   stored, s.partitions, s.segments, s.segment_rows),
            'Partitions and segments are fixed when a stream is made: drop it and make it again, or use another name.');
        RETURN s;
    END IF;

    log := 's_' || stored;
    EXECUTE format('CREATE SEQUENCE pgbroker.%I AS bigint', log || '_seq');
    EXECUTE format(
        $Q$
        CREATE TABLE pgbroker.%I (
            id bigint NOT NULL,
            segment integer NOT NULL,
            partition integer NOT NULL,
            key text,
            enqueued_at timestamptz NOT NULL,
            headers jsonb,
            message jsonb
        ) PARTITION BY LIST (segment)
        $Q$, log);
    FOR i IN 0 .. segments - 1 LOOP
        EXECUTE format('CREATE TABLE pgbroker.%I PARTITION OF pgbroker.%I FOR VALUES IN (%s)',
                       log || '_' || i, log, i);
    END LOOP;
    EXECUTE format('CREATE INDEX %I ON pgbroker.%I (partition, id)', log || '_partition_id', log);

    INSERT INTO pgbroker.stream (stream_name, partitions, segments, segment_rows, retention_seconds,
                                 retention_bytes, truncate_consumed, notify)
    VALUES (stored, partitions, segments, segment_rows, retention_seconds, retention_bytes,
            truncate_consumed, notify)
    RETURNING * INTO s;
    PERFORM pgbroker._stream_watermark_append(stored, 0, NULL, NULL);
    EXECUTE pgbroker._stream_send_function(s);
    EXECUTE pgbroker._stream_read_function(s);
    PERFORM pgbroker._stream_send_router_refresh();
    RETURN s;
END;
$$;

-- Drop a stream: its log, its groups and their cursors, and each group's
-- retry queue that the group made (as drop_stream_group). Returns false when
-- there was no such stream.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.drop_stream(stream_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    stored text := lower(drop_stream.stream_name);
    g pgbroker.stream_group;
BEGIN
    PERFORM pgbroker._stream_turn(stored);
    FOR g IN DELETE FROM pgbroker.stream_group t WHERE t.stream_name = stored RETURNING * LOOP
        PERFORM pgbroker._stream_group_retry_queue_drop(g);
    END LOOP;
    DELETE FROM pgbroker.stream t WHERE t.stream_name = stored;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP FUNCTION pgbroker.%I', 's_' || stored || '_send');
    EXECUTE format('DROP FUNCTION pgbroker.%I', 's_' || stored || '_read');
    EXECUTE format('DROP TABLE pgbroker.%I', 's_' || stored);
    EXECUTE format('DROP SEQUENCE pgbroker.%I', 's_' || stored || '_seq');
    PERFORM pgbroker._stream_send_router_refresh();
    RETURN true;
END;
$$;

-- Every stream with its settings.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.streams()
RETURNS SETOF pgbroker.stream LANGUAGE sql STABLE AS $$
    SELECT * FROM pgbroker.stream ORDER BY stream_name;
$$;

------------------------------------------------------------------------------
-- Sends: one INSERT, nothing else (plus a NOTIFY when the stream has it on).
------------------------------------------------------------------------------

-- Send a batch; returns the ids in the order of the messages. headers and
-- keys, when given, pair with messages by position; each message's headers
-- are a JSON object or NULL.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.stream_send_many(stream_name text, messages jsonb[], headers jsonb[] DEFAULT NULL,
                                          keys text[] DEFAULT NULL)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    s pgbroker.stream := pgbroker._stream_row(stream_name);
BEGIN
    IF cardinality(headers) <> cardinality(messages) OR cardinality(keys) <> cardinality(messages) THEN
        PERFORM pgbroker._check_arg(false,
            format('headers (%s) and keys (%s), when given, must have one entry per message (%s)',
                   coalesce(cardinality(headers)::text, 'none'), coalesce(cardinality(keys)::text, 'none'),
                   cardinality(messages)),
            'Pass NULL for a message without headers or key.');
    END IF;
    IF headers IS NOT NULL THEN
        -- A failed message's headers go to the retry queue with x-pgbroker-stream added
        -- (stream_ack): to an array or a scalar that made an array, which no handler reads.
        IF EXISTS (SELECT FROM unnest(headers) h WHERE jsonb_typeof(h) <> 'object') THEN
            PERFORM pgbroker._check_arg(false, 'headers must be a JSON object (or NULL) for each message',
                'Pass headers as {"name": value, ...}.');
        END IF;
        PERFORM pgbroker._check_reserved_headers(headers);
        -- Job headers mean nothing to a stream, but a failed message takes its headers to
        -- the group's retry queue, whose send checks them: one it refuses made every ack
        -- of the message's batch fail, and the group never got past it.
        IF pgbroker._has_job_headers(headers) THEN
            PERFORM pgbroker._check_job_headers(headers);
        END IF;
    END IF;
    -- The size limit of queue sends (30_sends.sql), for a message with its headers and
    -- key (all in its row): a batch within the default in the caller's own rights bounds
    -- each of its messages, with no call for the limit.
    IF pgbroker._within_default_size(pg_column_size(messages) + coalesce(pg_column_size(headers), 0)
                                     + coalesce(pg_column_size(keys), 0)) IS NOT TRUE THEN
        PERFORM pgbroker._check_message_size(
            (SELECT max(pg_column_size(u.m) + coalesce(pg_column_size(u.h), 0) + coalesce(pg_column_size(u.k), 0))
             FROM unnest(messages, headers, keys) AS u(m, h, k)));
    END IF;
    -- The stream's own send function (made with the stream): its INSERT names
    -- the table, so PL/pgSQL plans it once per session; a dynamic INSERT into a
    -- partitioned table was planned on every call, twice the cost of the send.
    -- The router (above) holds that INSERT for every stream, static too.
    RETURN QUERY SELECT pgbroker._stream_send_to(s.stream_name, coalesce(messages, '{}'),
                                                 coalesce(headers, '{}'), coalesce(keys, '{}'));
    IF s.notify THEN
        PERFORM pg_notify('pgbroker.stream.' || s.stream_name, '');
    END IF;
END;
$$;

-- Send a batch once for idempotency_key (the queues' send_idempotent,
-- 34_dedup.sql): the same call again within window_seconds returns the same
-- ids and appends nothing.
-- Arguments: scope: whose key it is, as for send_idempotent.
-- Returns: the ids, in the order of the messages: the first call's, each time.
-- Errors: PB009 when the key was used for another request within its window;
--   PB007 for an empty key, one over 255 characters, a scope over 255, or a
--   window out of range.
-- Since: 0.2.0
CREATE OR REPLACE FUNCTION pgbroker.stream_send_idempotent(
    stream_name text, idempotency_key text, messages jsonb[], headers jsonb[] DEFAULT NULL,
    keys text[] DEFAULT NULL, window_seconds integer DEFAULT 86400, scope text DEFAULT NULL)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    s pgbroker.stream := pgbroker._stream_row(stream_name);
    held bigint[];
BEGIN
    held := pgbroker._idempotency_claim('stream_idempotency_keys', 'stream_name', s.stream_name,
        pgbroker._idempotency_scope(scope), idempotency_key, pgbroker._idempotency_digest(
            to_jsonb(messages), pgbroker._idempotency_headers(headers), to_jsonb(keys)),
        window_seconds);
    IF held IS NULL THEN
        held := pgbroker._idempotency_record('stream_idempotency_keys', 'stream_name', s.stream_name,
            pgbroker._idempotency_scope(scope), idempotency_key, ARRAY(SELECT pgbroker.stream_send_many(s.stream_name, messages, headers, keys)));
    END IF;
    RETURN QUERY SELECT unnest(held);
END;
$$;

-- Send one message; returns its id.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.stream_send(stream_name text, message jsonb, headers jsonb DEFAULT NULL,
                                     key text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    sent bigint;
BEGIN
    SELECT i INTO sent FROM pgbroker.stream_send_many(stream_name, ARRAY[message], ARRAY[headers], ARRAY[key]) i;
    RETURN sent;
END;
$$;

------------------------------------------------------------------------------
-- The safe id
------------------------------------------------------------------------------

-- The transactions writing a stream's log now (their virtual transaction
-- ids): ROW EXCLUSIVE on the log table, which every INSERT into it holds
-- until its transaction ends.
CREATE OR REPLACE FUNCTION pgbroker._stream_writers(stream_name text)
RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT pgbroker._writers(ARRAY[format('pgbroker.%I', 's_' || stream_name)::regclass::oid]);
$$;

-- Whether no transaction but this one writes the stream's log now: a SHARE
-- lock on the log table (ONLY: the partitioned parent, which every INSERT
-- into the log holds ROW EXCLUSIVE on), tried without waiting and given back
-- at once (the subtransaction is rolled back). Writers arriving meanwhile wait
-- for microseconds. Cheaper than pg_locks, which scans the whole lock table:
-- 90 idle sessions holding 30 locks each doubled a consumer's read (1.0 -> 2.1
-- ms). False when it cannot tell (a writer, a lock queued, no right to lock).
CREATE OR REPLACE FUNCTION pgbroker._stream_unwritten(stream_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('LOCK TABLE ONLY pgbroker.%I IN SHARE MODE NOWAIT', 's_' || stream_name);
    RAISE SQLSTATE 'PBPRB';  -- (caught below: the lock goes with the subtransaction)
EXCEPTION
    WHEN SQLSTATE 'PBPRB' THEN
        RETURN true;
    WHEN lock_not_available OR insufficient_privilege THEN
        RETURN false;
END;
$$;

-- The child table of the ring (positions and watermarks, see "Positions") a
-- row with this seq goes to. (A SQL function, inlined where it is called.)
CREATE OR REPLACE FUNCTION pgbroker._stream_ring_slot(seq bigint)
RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT ((seq >> 32) % 2)::integer
$$;

-- The watermark: the safe id and its candidate, insert-only in the ring of
-- the positions (see "Positions" below: the same sequence, slots and
-- rotation). An advance appends a row; a stream's watermark is its newest
-- row, found by an index walk backwards in each child (the planner held to
-- it, as for the positions). Whoever reads it holds the ring first: ACCESS
-- SHARE on stream_position, then on stream_watermark.
CREATE OR REPLACE FUNCTION pgbroker._stream_watermark(stream_name text)
RETURNS SETOF pgbroker.stream_watermark LANGUAGE plpgsql STABLE
SET enable_seqscan = off SET enable_sort = off SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    SELECT * FROM pgbroker.stream_watermark w WHERE w.stream_name = _stream_watermark.stream_name
    ORDER BY w.seq DESC LIMIT 1;
END;
$$;

-- Append a stream's watermark, in the current slot.
CREATE OR REPLACE FUNCTION pgbroker._stream_watermark_append(stream_name text, safe_id bigint, candidate_id bigint,
                                                  candidate_writers text[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pgbroker.stream_watermark (stream_name, seq, slot, safe_id, candidate_id, candidate_writers)
    SELECT _stream_watermark_append.stream_name, x.seq, pgbroker._stream_ring_slot(x.seq),
           _stream_watermark_append.safe_id, _stream_watermark_append.candidate_id,
           _stream_watermark_append.candidate_writers
    FROM (SELECT nextval('pgbroker.stream_position_seq') AS seq) x;
END;
$$;

-- The safe id a read goes up to: the stream's, advanced by this call when
-- it holds the stream's row (_stream_safe_id_advanced). Else another reader
-- holds the row, to the end of its transaction: one left idle in transaction
-- held it for as long, and every group of the stream read nothing newer than
-- the watermark before it (tests/engine/test_stream_idle_reader.py). Then the
-- newest committed watermark; or, when ids were drawn beyond it and no
-- transaction writes the log at this instant, the last id drawn, as the
-- advancer's first step would find it (L first, then the writers), for this
-- read only (only the row's holder appends). Such a read may move a group's
-- positions past the newest watermark: the reads after it find nothing there
-- until the watermark passes them. Not for Spark's bounds, which must not go
-- back (spark_stream_bound).
CREATE OR REPLACE FUNCTION pgbroker._stream_read_safe_id(stream_name text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    safe_id bigint := pgbroker._stream_safe_id_advanced(stream_name);
    last_id bigint;
BEGIN
    IF safe_id IS NOT NULL THEN
        RETURN safe_id;
    END IF;
    safe_id := (SELECT t.safe_id FROM pgbroker._stream_watermark(stream_name) t);
    IF safe_id IS NULL OR current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN safe_id;
    END IF;
    last_id := pg_sequence_last_value(format('pgbroker.%I', 's_' || stream_name || '_seq')::regclass);
    IF last_id > safe_id AND pgbroker._stream_unwritten(stream_name) THEN
        RETURN last_id;
    END IF;
    RETURN safe_id;
END;
$$;

-- The stream's safe id: advanced by this call if it can, else the newest
-- committed watermark (at most one call behind).
CREATE OR REPLACE FUNCTION pgbroker._stream_safe_id(stream_name text)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN coalesce(pgbroker._stream_safe_id_advanced(stream_name),
                    (SELECT t.safe_id FROM pgbroker._stream_watermark(stream_name) t));
END;
$$;

-- Advance the stream's safe id if it can, and return it (see the header);
-- NULL when another caller advances (or not READ COMMITTED, or no such
-- stream). One caller at a time advances: the stream's row locked (SKIP
-- LOCKED), held to the end of its transaction, orders the appends, so the
-- newest row is the last advance; the others use the newest committed row,
-- at most one call behind. A row lock, not an advisory one: any session of the database
-- may take an advisory lock, and one that held this one would stop every
-- read of the stream for good; locking the row needs the owner's rights.
-- (No UPDATE touches the row; FOREIGN KEY checks' KEY SHARE does not
-- conflict.) Only in READ COMMITTED, whose every statement sees the last
-- advance committed: an older snapshot could append on top of a state
-- already replaced.
CREATE OR REPLACE FUNCTION pgbroker._stream_safe_id_advanced(stream_name text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    w pgbroker.stream_watermark;
    last_id bigint;
    writers text[];
    changed boolean := false;
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM FROM pgbroker.stream t WHERE t.stream_name = _stream_safe_id_advanced.stream_name
        FOR NO KEY UPDATE SKIP LOCKED;
    END IF;
    IF NOT FOUND THEN  -- another caller advances, or not READ COMMITTED (FOUND starts false)
        RETURN NULL;
    END IF;
    SELECT * INTO w FROM pgbroker._stream_watermark(stream_name);
    IF NOT FOUND THEN
        RETURN NULL;  -- no such stream
    END IF;
    -- L first, then the writers: the order the argument needs. One look at the
    -- writers serves both steps (pg_locks costs a scan of the lock table), and
    -- none when no transaction writes the log now: then every id up to L is
    -- settled, the candidate's too (it is at most L), and L is safe at once.
    last_id := pg_sequence_last_value(format('pgbroker.%I', 's_' || stream_name || '_seq')::regclass);
    IF w.candidate_id IS NULL AND (last_id IS NULL OR last_id <= w.safe_id) THEN
        RETURN w.safe_id;  -- nothing drawn beyond it (NULL: nothing drawn at all)
    END IF;
    IF pgbroker._stream_unwritten(stream_name) THEN
        PERFORM pgbroker._stream_watermark_append(w.stream_name, last_id, NULL, NULL);
        RETURN last_id;
    END IF;
    writers := pgbroker._stream_writers(stream_name);
    -- Step 2 of the previous candidate: have its writers all ended?
    IF w.candidate_id IS NOT NULL AND NOT (writers && w.candidate_writers) THEN
        w.safe_id := greatest(w.safe_id, w.candidate_id);
        w.candidate_id := NULL;
        w.candidate_writers := NULL;
        changed := true;
    END IF;
    -- Step 1 of a new candidate, when ids were drawn beyond the safe id.
    IF w.candidate_id IS NULL AND last_id > w.safe_id THEN
        IF cardinality(writers) = 0 THEN
            w.safe_id := last_id;
        ELSE
            w.candidate_id := last_id;
            w.candidate_writers := writers;
        END IF;
        changed := true;
    END IF;
    IF changed THEN
        PERFORM pgbroker._stream_watermark_append(w.stream_name, w.safe_id, w.candidate_id, w.candidate_writers);
    END IF;
    RETURN w.safe_id;
END;
$$;

------------------------------------------------------------------------------
-- Positions: insert-only, in a ring of two child tables
------------------------------------------------------------------------------

-- A partition's position (acked_id, delivered_id, acked_at) is never
-- updated: a move appends a row to pgbroker.stream_position, and the
-- position is the partition's row with the highest seq (an index walk of one
-- entry in each child table). While a transaction holds back the xmin
-- horizon an UPDATE leaves a dead version behind at every move (a row a
-- partition a batch); an INSERT leaves none, and old rows go by TRUNCATE,
-- which leaves none either. The cursor row (owner, epoch) is written only
-- when the partition changes hands.
--
-- Order. Every writer of a partition's position holds its cursor row's lock
-- (FOR UPDATE, or the UPDATE that hands it over) from before it draws its seq
-- until it commits, and reads the position after taking the lock (a later
-- statement, a newer snapshot): the writers of a partition take turns, and
-- their seqs rise in the order they commit.
--
-- The ring. slot = (seq >> 32) % 2 names the child table a row goes to; the
-- current slot is that of the sequence's last value. Rotation
-- (_stream_positions_rotate, run by maintain_stream) empties the other child:
-- it locks it (ACCESS EXCLUSIVE), copies into the current child each
-- partition's newest row that lies in it (seq kept: a row appended meanwhile
-- has a higher one), and TRUNCATEs it; the watermarks ("The safe id") share
-- the sequence and the slots, and their other child goes the same way in
-- the same rotation. Once the current child has grown past
-- min_bytes it moves the sequence to the next 2^32 (setval), which makes the
-- emptied child the current one; a writer that drew its seq before lands in
-- the former one, which the next rotation empties. Every transaction that
-- writes positions first takes ACCESS SHARE on the whole ring (before any
-- cursor row lock): the rotation so waits for the writers at work, and the
-- writers that come after wait for the rotation, before their first
-- statement that reads positions, whose snapshot then sees what it wrote
-- (TRUNCATE is not MVCC-safe: an older snapshot would see the child empty
-- and the copies not yet there). One lock order, ring then rows, and no
-- deadlock. The rotation's wait is bounded by a lock_timeout of 100 ms (the
-- writers queued behind it wait no longer): a rotation that cannot have the
-- lock gives up until the next maintenance, and the ring only grows
-- meanwhile. Monitoring reads (stream_lag) take no lock first: one that
-- meets a rotation may miss a partition's row for that read. A reader that
-- finds no position for a partition (none should) leaves it alone: it reads
-- nothing from it and acks nothing on it.

-- The positions of a group's partitions: each one's newest row (no row: see
-- above), read by an index walk backwards in each child, merged, one entry.
-- The planner is told so (no seq scan, no sort): from statistics taken when
-- the ring held a row a partition it would pick a scan of the child and a sort
-- of all the partition's rows, and keep that plan (cached for the session) as
-- the child grows to thousands of rows. And its plan is the generic one: the
-- shape is fixed by those settings whatever the arguments, and a custom plan
-- was made again at every call (111 -> 26 us a call, track_functions).
CREATE OR REPLACE FUNCTION pgbroker._stream_positions(stream_name text, group_name text, partitions integer[])
RETURNS SETOF pgbroker.stream_position LANGUAGE plpgsql STABLE
SET enable_seqscan = off SET enable_sort = off SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
    SELECT p.* FROM unnest(partitions) AS u(partition)
    CROSS JOIN LATERAL (
        SELECT * FROM pgbroker.stream_position q
        WHERE q.stream_name = _stream_positions.stream_name AND q.group_name = _stream_positions.group_name
          AND q.partition = u.partition
        ORDER BY q.seq DESC LIMIT 1) p;
END;
$$;

-- Append positions of a group's partitions, one row each, in the current slot.
-- The caller holds the partitions' cursor rows locked (see above).
CREATE OR REPLACE FUNCTION pgbroker._stream_positions_append(stream_name text, group_name text, partitions integer[],
                                                  acked_ids bigint[], delivered_ids bigint[],
                                                  acked_ats timestamptz[])
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pgbroker.stream_position (stream_name, group_name, partition, seq, slot, acked_id, delivered_id,
                                          acked_at)
    SELECT _stream_positions_append.stream_name, _stream_positions_append.group_name, x.partition, x.seq,
           pgbroker._stream_ring_slot(x.seq), x.acked_id, x.delivered_id, x.acked_at
    FROM (SELECT nextval('pgbroker.stream_position_seq') AS seq, u.partition, u.acked_id, u.delivered_id, u.acked_at
          FROM unnest(partitions, acked_ids, delivered_ids, acked_ats) WITH ORDINALITY
               AS u(partition, acked_id, delivered_id, acked_at, n)
          ORDER BY u.n) x;
END;
$$;

-- Empty the ring's other child table, carrying the positions it holds into
-- the current one, and move the sequence on once the current one has grown
-- past min_bytes (see above). Returns false when it could not have its
-- locks (another rotation, or a transaction holding the ring past the lock_timeout).
CREATE OR REPLACE FUNCTION pgbroker._stream_positions_rotate(min_bytes bigint DEFAULT 1048576)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    last_seq bigint;
    current_slot integer;
    other text;
    other_watermark text;
    has_rows boolean;
BEGIN
    -- One rotation at a time, on a lock of the ring's parent alone that only
    -- the schema's owner may take (any session may take an advisory lock: an
    -- outsider holding the one used here stopped every rotation, and the ring
    -- grew by a row a partition a read for good). SHARE UPDATE EXCLUSIVE lets
    -- the readers' ACCESS SHARE and the writers' ROW EXCLUSIVE through.
    IF NOT pgbroker._lock_within('LOCK TABLE ONLY pgbroker.stream_position IN SHARE UPDATE EXCLUSIVE MODE NOWAIT',
                                 NULL) THEN
        RETURN false;
    END IF;
    last_seq := coalesce(pg_sequence_last_value('pgbroker.stream_position_seq'::regclass), 0);
    current_slot := pgbroker._stream_ring_slot(last_seq);
    other := 'stream_position_' || (1 - current_slot);
    other_watermark := 'stream_watermark_' || (1 - current_slot);
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM pgbroker.%I) OR EXISTS (SELECT 1 FROM pgbroker.%I)',
                   other, other_watermark) INTO has_rows;
    IF has_rows THEN
        -- The readers' order: positions, then watermarks.
        IF NOT pgbroker._lock_within(
                format('LOCK TABLE pgbroker.%I, pgbroker.%I IN ACCESS EXCLUSIVE MODE', other, other_watermark),
                '100ms') THEN
            RETURN false;
        END IF;
        INSERT INTO pgbroker.stream_position (stream_name, group_name, partition, seq, slot, acked_id,
                                              delivered_id, acked_at)
        SELECT p.stream_name, p.group_name, p.partition, p.seq, current_slot, p.acked_id, p.delivered_id,
               p.acked_at
        FROM (SELECT t.stream_name, t.group_name, array_agg(t.partition) AS partitions
              FROM pgbroker.stream_cursor t GROUP BY t.stream_name, t.group_name) c
        CROSS JOIN LATERAL pgbroker._stream_positions(c.stream_name, c.group_name, c.partitions) p
        WHERE p.slot <> current_slot;
        INSERT INTO pgbroker.stream_watermark (stream_name, seq, slot, safe_id, candidate_id, candidate_writers)
        SELECT w.stream_name, w.seq, current_slot, w.safe_id, w.candidate_id, w.candidate_writers
        FROM pgbroker.stream s CROSS JOIN LATERAL pgbroker._stream_watermark(s.stream_name) w
        WHERE w.slot <> current_slot;
        EXECUTE format('TRUNCATE pgbroker.%I, pgbroker.%I', other, other_watermark);
    END IF;
    IF pg_relation_size(format('pgbroker.%I', 'stream_position_' || current_slot)::regclass) >= min_bytes THEN
        PERFORM setval('pgbroker.stream_position_seq', ((last_seq >> 32) + 1) << 32);
    END IF;
    RETURN true;
END;
$$;

------------------------------------------------------------------------------
-- Consumer groups
------------------------------------------------------------------------------

-- Make a consumer group: its cursors start at the start of the stream (every
-- message still kept), at its end (messages sent from now on), or at a time
-- (messages enqueued at or after it), and its retry queue (by default
-- <stream>_<group>_retry) is made if it does not exist: a queue the group made
-- is dropped with it (drop_stream_group), one that was there is taken over and
-- stays. Idempotent: an existing group is returned as it is.
-- A retry queue is one group's: a group's workers hand whatever they read
-- there to that group's handler, so a queue two groups shared delivered each
-- group's failures to the other. Queue names fold to lower case and group
-- names do not, so the defaults of groups billing and Billing of a stream
-- are one queue, as are those of group c of stream a_b and group b_c of a.
-- Errors: PB004 when the retry queue, named or by default, is already
--   another group's (its name is the only one the error gives): name another.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.create_stream_group(stream_name text, group_name text, start_from text DEFAULT 'end',
                                             start_time timestamptz DEFAULT NULL, retry_queue text DEFAULT NULL)
RETURNS pgbroker.stream_group LANGUAGE plpgsql AS $$
DECLARE
    s pgbroker.stream := pgbroker._stream_row(stream_name);
    g pgbroker.stream_group;
    start_id bigint;
    made boolean;
BEGIN
    PERFORM pgbroker._check_arg(group_name ~ '^[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}$',
        format('group name must be 1 to 63 letters, digits, _, . or -, got %L', group_name));
    PERFORM pgbroker._check_arg(start_from IN ('start', 'end', 'time'),
        format('start_from must be ''start'', ''end'' or ''time'', got %L', start_from),
        'start: every message the stream still keeps; end: messages sent from now on; time: from start_time.');
    PERFORM pgbroker._check_arg((start_from = 'time') = (start_time IS NOT NULL),
        'start_time goes with start_from => ''time'', and only with it');
    retry_queue := coalesce(retry_queue, pgbroker._stream_default_retry_queue(s.stream_name, group_name));
    PERFORM pgbroker._check_arg(length(retry_queue) <= 47,
        format('the retry queue''s name %L is longer than a queue name may be (47)', retry_queue),
        'Name it yourself: create_stream_group(..., retry_queue => ''short_name'').');

    PERFORM pgbroker._stream_turn(s.stream_name);
    SELECT * INTO g FROM pgbroker.stream_group t
    WHERE t.stream_name = s.stream_name AND t.group_name = create_stream_group.group_name;
    IF FOUND THEN
        RETURN g;
    END IF;
    -- The queue's turn: groups of other streams that would take it wait here, then see this one.
    PERFORM pgbroker._queue_turn(retry_queue);
    IF EXISTS (SELECT FROM pgbroker.stream_group t WHERE lower(t.retry_queue) = lower(create_stream_group.retry_queue))
    THEN
        -- Neither the other group nor its stream is named: an API key may not be allowed to see them.
        RAISE EXCEPTION 'queue "%" is already the retry queue of another consumer group', retry_queue
            USING ERRCODE = 'PB004',
                  HINT = 'A retry queue takes the failures of one group. Name this group''s own: '
                         'create_stream_group(..., retry_queue => ''name''), or --retry-queue, or '
                         '"retry_queue" in the HTTP request.';
    END IF;
    made := pgbroker._stored_name(retry_queue) IS NULL;
    IF made THEN
        PERFORM pgmq.create(retry_queue);
    END IF;

    IF start_from = 'start' THEN
        start_id := 0;
    ELSIF start_from = 'end' THEN
        start_id := coalesce(pg_sequence_last_value(format('pgbroker.%I', 's_' || s.stream_name || '_seq')::regclass), 0);
    ELSE
        -- A scan, once: the log has no index on time.
        EXECUTE format('SELECT min(id) - 1 FROM pgbroker.%I WHERE enqueued_at >= $1', 's_' || s.stream_name)
            INTO start_id USING start_time;
        start_id := coalesce(start_id, pg_sequence_last_value(
            format('pgbroker.%I', 's_' || s.stream_name || '_seq')::regclass), 0);
    END IF;

    INSERT INTO pgbroker.stream_group (stream_name, group_name, retry_queue, retry_queue_made)
    VALUES (s.stream_name, group_name, pgbroker._stored_name(retry_queue), made)
    RETURNING * INTO g;
    INSERT INTO pgbroker.stream_cursor (stream_name, group_name, partition)
    SELECT s.stream_name, group_name, p FROM generate_series(0, s.partitions - 1) p;
    -- The cursor rows are new, not yet seen by any other transaction: no lock to take.
    PERFORM pgbroker._stream_positions_append(s.stream_name, group_name,
        ARRAY(SELECT generate_series(0, s.partitions - 1)), array_fill(start_id, ARRAY[s.partitions]),
        array_fill(start_id, ARRAY[s.partitions]), array_fill(NULL::timestamptz, ARRAY[s.partitions]));
    RETURN g;
END;
$$;

-- The retry queue of a group that names none.
CREATE OR REPLACE FUNCTION pgbroker._stream_default_retry_queue(stream_name text, group_name text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT lower(stream_name) || '_' || group_name || '_retry';
$$;

-- Drop a group: its cursors, its consumers, and its retry queue when the
-- group made it (create_stream_group), failures and all. A queue that was
-- there before the group stays. Returns false when there was no such group.
-- The retry queue stayed until 0.2.0, and a group made again under the name
-- took it over, handing the old group's failures to the new group's handler.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.drop_stream_group(stream_name text, group_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    g pgbroker.stream_group;
BEGIN
    PERFORM pgbroker._stream_turn(lower(stream_name));
    DELETE FROM pgbroker.stream_group t
    WHERE t.stream_name = lower(drop_stream_group.stream_name) AND t.group_name = drop_stream_group.group_name
    RETURNING * INTO g;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pgbroker._stream_group_retry_queue_drop(g);
    RETURN true;
END;
$$;

-- Drop a dropped group's retry queue if the group made it and it is still
-- there (one dropped by hand meanwhile is no error).
CREATE OR REPLACE FUNCTION pgbroker._stream_group_retry_queue_drop(g pgbroker.stream_group)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF g.retry_queue_made AND pgbroker._stored_name(g.retry_queue) IS NOT NULL THEN
        PERFORM pgmq.drop_queue(g.retry_queue);
    END IF;
END;
$$;

------------------------------------------------------------------------------
-- Leases: which consumer reads which partition
------------------------------------------------------------------------------

-- The advisory lock key that says a consumer is alive (see the header).
CREATE OR REPLACE FUNCTION pgbroker._stream_consumer_key(stream_name text, group_name text, consumer text)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT hashtextextended('pgbroker.stream_consumer/' || stream_name || '/' || group_name || '/' || consumer, 0);
$$;

-- Since when this server holds the sessions that write to it: since it started, since its
-- recovery ended (a standby promoted), or since it recovered from a crash of one of its
-- processes (the OOM killer, a SIGKILL: every session ends, the start time stays). A consumer's
-- lock says something only once it renewed after that: a promoted standby, or a server back from
-- a crash, has none of the sessions the consumers held, and judged every consumer but the first
-- to read again dead, taking the partitions (and the batches in hand) of consumers alive and
-- reconnecting. Every renewal replayed from the old primary began before the last transaction
-- replayed committed; one made here, after. A crash's recovery discards the cumulative
-- statistics, and so stamps their reset time (a clean start keeps it); a reset by hand
-- (pg_stat_reset_shared) only makes the lease decide until each consumer's next read.
CREATE OR REPLACE FUNCTION pgbroker._stream_sessions_since()
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT greatest(pg_postmaster_start_time(), pg_last_xact_replay_timestamp(),
                    pg_stat_get_bgwriter_stat_reset_time());
$$;

-- Whether this session holds a consumer's liveness lock (then a try of it here succeeds
-- whether or not the consumer's own sessions are there: a session never conflicts with itself).
CREATE OR REPLACE FUNCTION pgbroker._stream_consumer_held_here(key bigint)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks l
        WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.mode = 'ShareLock'
          AND l.objsubid = 1 AND l.classid = ((key >> 32) & 4294967295)::oid
          AND l.objid = (key & 4294967295)::oid);
$$;

-- Refuse a consumer's name or lease that cannot be (PB007).
CREATE OR REPLACE FUNCTION pgbroker._stream_check_consumer(consumer text, lease_seconds integer)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgbroker._check_arg(lease_seconds BETWEEN 1 AND 86400,
        format('lease_seconds must be between 1 and 86400, got %s', coalesce(lease_seconds::text, 'NULL')),
        'A consumer that does not read again within its lease loses its partitions to the others.');
    PERFORM pgbroker._check_arg(consumer IS NOT NULL AND consumer <> '', 'consumer must name the consumer',
        'Any text unique among the group''s consumers, e.g. host:pid:random.');
END;
$$;

-- How many live consumers a group has at once, at most: far more than its partitions (at most
-- 256), and every read of the group looks at them all. Nothing bounded them: an HTTP key that
-- may read a stream registered members by the million under made-up names.
CREATE OR REPLACE FUNCTION pgbroker._stream_consumers_per_group()
RETURNS integer LANGUAGE sql IMMUTABLE AS $$ SELECT 1000 $$;

-- Register a consumer, or renew its lease: lease_seconds from now. One that
-- was not live (new, or its lease over) joining a group that has as many live
-- consumers as it may is refused (PB007). (Checked for new names only, a
-- lapsed member's row, kept a lease and a minute, made it live again
-- unchecked: members lapsed by the thousand and renewed passed any limit.)
CREATE OR REPLACE FUNCTION pgbroker._stream_renew(stream_name text, group_name text, consumer text,
                                       lease_seconds integer, lease_only boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    was_live boolean;
BEGIN
    SELECT c.expires_at > now() INTO was_live FROM pgbroker.stream_consumer c
    WHERE c.stream_name = _stream_renew.stream_name AND c.group_name = _stream_renew.group_name
      AND c.consumer = _stream_renew.consumer;
    INSERT INTO pgbroker.stream_consumer AS c (stream_name, group_name, consumer, expires_at, renewed_at,
                                               lease_only)
    VALUES (stream_name, group_name, consumer, now() + make_interval(secs => lease_seconds), now(), lease_only)
    ON CONFLICT ON CONSTRAINT stream_consumer_pkey DO UPDATE
        SET expires_at = EXCLUDED.expires_at, renewed_at = EXCLUDED.renewed_at, lease_only = EXCLUDED.lease_only;
    IF was_live IS NOT TRUE THEN
        PERFORM pgbroker._check_arg(
            (SELECT count(*) FROM pgbroker.stream_consumer k
             WHERE k.stream_name = _stream_renew.stream_name AND k.group_name = _stream_renew.group_name
               AND k.expires_at > now()) <= pgbroker._stream_consumers_per_group(),
            format('group "%s" of stream "%s" has %s live consumers already', group_name, stream_name,
                   pgbroker._stream_consumers_per_group()),
            'A group shares at most 256 partitions: give each process one consumer name, and reuse it.');
    END IF;
END;
$$;

-- A consumer's share of a group's partitions: the live consumers, ordered by
-- name, get floor(N/n) each, plus one for the first N mod n of them.
CREATE OR REPLACE FUNCTION pgbroker._stream_share(partitions integer, live text[], consumer text)
RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT partitions / cardinality(live)
           + CASE WHEN array_position(live, consumer) - 1 < partitions % cardinality(live) THEN 1 ELSE 0 END;
$$;

-- Mark this session as one of the consumer's (its liveness lock, shared; none for a lease_only
-- consumer), forget the group's consumers whose sessions are all gone, renew the consumer's heartbeat (at most every half
-- lease), then give up partitions beyond its share and take free ones up to it. Returns how
-- many partitions beyond its share it still owns: those with something in flight, which
-- cannot change hands yet (0 mostly). The caller reads what it owns, but for that many of the
-- highest: a consumer reading ahead of its acks so lets them drain, and gives them up once
-- acked.
CREATE OR REPLACE FUNCTION pgbroker._stream_balance(s pgbroker.stream, group_name text, consumer text, lease_seconds integer,
                                         generation bigint, lease_only boolean)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    fresh boolean;
    live text[];
    share integer;
    owned integer;
    given integer;
    taken integer[];
    since timestamptz;
BEGIN
    -- Taken again on every read: a session's locks stack, and cost no shared memory more.
    IF NOT lease_only THEN
        PERFORM pg_try_advisory_lock_shared(pgbroker._stream_consumer_key(s.stream_name, group_name, consumer));
    END IF;
    -- A consumer none of whose sessions holds its lock (the exclusive try succeeds) is dead:
    -- its process ended or lost its connections. Only those within their lease are tried (the
    -- others are not live anyway), and only those that renewed since the server took writes (a
    -- restart or a failover ends every session, the live consumers' too; each renews at its
    -- first read after it). The lock taken is held to the end of this transaction.
    since := pgbroker._stream_sessions_since();
    DELETE FROM pgbroker.stream_consumer c
    WHERE c.stream_name = s.stream_name AND c.group_name = _stream_balance.group_name
      AND c.expires_at > now() AND c.renewed_at > since
      -- (In the CASE, which keeps its order: a lease_only consumer's lock is never tried, and
      -- costs no entry of the lock table.)
      AND CASE WHEN c.consumer = _stream_balance.consumer OR c.lease_only THEN false
               WHEN pg_try_advisory_xact_lock(pgbroker._stream_consumer_key(s.stream_name, c.group_name, c.consumer))
               THEN NOT pgbroker._stream_consumer_held_here(
                   pgbroker._stream_consumer_key(s.stream_name, c.group_name, c.consumer))
               ELSE false END;

    SELECT array_agg(c.consumer ORDER BY c.consumer) FILTER (WHERE c.expires_at > now() OR c.consumer = _stream_balance.consumer),
           bool_or(c.consumer = _stream_balance.consumer AND c.lease_only = _stream_balance.lease_only
                   AND c.renewed_at > since
                   AND c.renewed_at >= now() - make_interval(secs => lease_seconds / 2.0)
                   AND c.expires_at >= now() + make_interval(secs => lease_seconds / 2.0))
    INTO live, fresh
    FROM pgbroker.stream_consumer c
    WHERE c.stream_name = s.stream_name AND c.group_name = _stream_balance.group_name;
    IF fresh IS NOT TRUE THEN
        -- A plain read first (above), because the upsert locks the consumer's row (a WAL
        -- record and a dirtied page) even when its WHERE leaves the row as it is.
        PERFORM pgbroker._stream_renew(s.stream_name, group_name, consumer, lease_seconds, lease_only);
        IF NOT consumer = ANY (coalesce(live, '{}')) THEN
            live := ARRAY(SELECT x FROM unnest(live || consumer) x ORDER BY x);
        END IF;
        -- Forget consumers long gone (a lease and a minute past expiry), but
        -- one whose last read is still in an open transaction: its row stays
        -- to a later read, which never waits for it.
        DELETE FROM pgbroker.stream_consumer c
        WHERE (c.stream_name, c.group_name, c.consumer) IN (
            SELECT x.stream_name, x.group_name, x.consumer FROM pgbroker.stream_consumer x
            WHERE x.stream_name = s.stream_name AND x.group_name = _stream_balance.group_name
              AND x.expires_at < now() - make_interval(secs => lease_seconds + 60)
            FOR UPDATE SKIP LOCKED);
    END IF;

    SELECT count(*) INTO owned FROM pgbroker.stream_cursor t
    WHERE t.stream_name = s.stream_name AND t.group_name = _stream_balance.group_name
      AND t.owner = _stream_balance.consumer;
    share := pgbroker._stream_share(s.partitions, live, consumer);

    IF owned > share THEN
        -- Give back the highest partitions that have nothing in flight.
        UPDATE pgbroker.stream_cursor t SET owner = NULL
        WHERE (t.stream_name, t.group_name, t.partition) IN (
            SELECT x.stream_name, x.group_name, x.partition FROM pgbroker.stream_cursor x
            CROSS JOIN LATERAL pgbroker._stream_positions(x.stream_name, x.group_name, ARRAY[x.partition]) p
            WHERE x.stream_name = s.stream_name AND x.group_name = _stream_balance.group_name
              AND x.owner = _stream_balance.consumer AND p.delivered_id = p.acked_id
            ORDER BY x.partition DESC LIMIT owned - share);
        GET DIAGNOSTICS given = ROW_COUNT;
        RETURN owned - share - given;
    ELSIF owned < share THEN
        -- Takers of a group take turns, and each looks again at who is live
        -- once it has its turn. A consumer registers and takes its share in
        -- its read's transaction: 'live' above may predate another consumer's
        -- commit, whose partitions would then look owned by a stranger and be
        -- taken from it while it handles what it read (duplicates without a
        -- death). After the lock, a new statement sees every taker before us.
        -- The group's row, not an advisory lock, which any session could hold
        -- to keep every newcomer waiting (see _stream_safe_id). Waited for
        -- briefly: a taker's transaction is one read, unless its client left
        -- it open (idle in transaction), and then every reader of the group
        -- waited behind it for as long; not had, this read takes nothing and
        -- a later one tries again (tests/engine/test_stream_idle_reader.py).
        IF NOT pgbroker._lock_within(format(
                'SELECT FROM pgbroker.stream_group t WHERE t.stream_name = %L AND t.group_name = %L '
                'FOR NO KEY UPDATE', s.stream_name, group_name), '100ms') THEN
            RETURN 0;
        END IF;
        -- (This consumer's row is there: registered above, in this transaction.)
        SELECT array_agg(c.consumer ORDER BY c.consumer) INTO live
        FROM pgbroker.stream_consumer c
        WHERE c.stream_name = s.stream_name AND c.group_name = _stream_balance.group_name
          AND (c.expires_at > now() OR c.consumer = _stream_balance.consumer);
        share := pgbroker._stream_share(s.partitions, live, consumer);
        -- Take free partitions: unowned, or their owner is not live.
        -- The new epoch fences the former owner's acks; delivered_id goes back
        -- to acked_id, so what it held unacknowledged is delivered again. The
        -- taker's generation is the partition's (see "Generations").
        WITH t AS (
            UPDATE pgbroker.stream_cursor t
            SET owner = _stream_balance.consumer, epoch = t.epoch + 1, generation = _stream_balance.generation
            WHERE (t.stream_name, t.group_name, t.partition) IN (
                SELECT x.stream_name, x.group_name, x.partition FROM pgbroker.stream_cursor x
                WHERE x.stream_name = s.stream_name AND x.group_name = _stream_balance.group_name
                  AND (x.owner IS NULL OR NOT x.owner = ANY (live))
                ORDER BY x.partition LIMIT greatest(share - owned, 0)  -- (share may have fallen)
                FOR UPDATE SKIP LOCKED)
            RETURNING t.partition)
        SELECT array_agg(t.partition ORDER BY t.partition) INTO taken FROM t;
        IF taken IS NOT NULL THEN  -- (their rows locked by the UPDATE, read after it)
            PERFORM pgbroker._stream_positions_rewound(s.stream_name, _stream_balance.group_name, taken);
        END IF;
    END IF;
    RETURN 0;
END;
$$;

-- A consumer leaving: its partitions are free at once (what it read and did
-- not acknowledge is delivered again to their next owner).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.stream_release(stream_name text, group_name text, consumer text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    g pgbroker.stream_group := pgbroker._stream_group_row(stream_name, group_name);
    released integer;
BEGIN
    UPDATE pgbroker.stream_cursor t SET owner = NULL
    WHERE t.stream_name = g.stream_name AND t.group_name = g.group_name AND t.owner = stream_release.consumer;
    GET DIAGNOSTICS released = ROW_COUNT;
    DELETE FROM pgbroker.stream_consumer c
    WHERE c.stream_name = g.stream_name AND c.group_name = g.group_name AND c.consumer = stream_release.consumer;
    RETURN released;
END;
$$;

-- Keep a consumer live without reading: its lease renewed to lease_seconds
-- from now, and this session marked as one of its (the liveness lock). A read
-- renews the lease; a consumer whose batch takes longer to handle than its
-- lease calls this meanwhile, or the others find its lease over, take its
-- partitions and have the batch again while it is still being handled.
-- Returns the partitions the consumer owns, with their epochs: those another
-- consumer took while its lease was over stay taken. A batch read under an
-- epoch the answer does not name (a beat sent after the read) can never be
-- acknowledged: its partition's acks are fenced off, its messages delivered
-- again to the new owner, and what is left of it is best dropped.
-- Arguments: lease_only, as for stream_read.
-- Since: 0.2.0
CREATE OR REPLACE FUNCTION pgbroker.stream_heartbeat(stream_name text, group_name text, consumer text,
                                          lease_seconds integer DEFAULT 30, lease_only boolean DEFAULT false)
RETURNS TABLE (partition integer, epoch bigint) LANGUAGE plpgsql AS $$
DECLARE
    g pgbroker.stream_group := pgbroker._stream_group_row(stream_name, group_name);
BEGIN
    PERFORM pgbroker._stream_check_consumer(consumer, lease_seconds);
    IF NOT lease_only THEN
        PERFORM pg_try_advisory_lock_shared(pgbroker._stream_consumer_key(g.stream_name, g.group_name, consumer));
    END IF;
    PERFORM pgbroker._stream_renew(g.stream_name, g.group_name, consumer, lease_seconds, lease_only);
    RETURN QUERY SELECT t.partition, t.epoch FROM pgbroker.stream_cursor t
                 WHERE t.stream_name = g.stream_name AND t.group_name = g.group_name
                   AND t.owner = stream_heartbeat.consumer
                 ORDER BY t.partition;
END;
$$;

-- Hand out again what the consumer was handed and has not acknowledged: its
-- partitions' delivered_id goes back to acked_id. For a consumer that lost
-- its connection during a read: the read may have committed without the
-- consumer getting its rows, and the next read would start after them.
-- Arguments: generation, the consumer's new one (see "Generations"; 0.2.0):
--   its reads under another are refused from now on, so a read sent before
--   and run after this rewind moves nothing.
-- Returns: how many partitions moved back.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.stream_rewind(stream_name text, group_name text, consumer text,
                                       generation bigint DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    g pgbroker.stream_group := pgbroker._stream_group_row(stream_name, group_name);
    owned integer[];
BEGIN
    LOCK TABLE pgbroker.stream_position IN ACCESS SHARE MODE;  -- the ring, then rows (see "Positions")
    IF stream_rewind.generation IS NULL THEN
        SELECT array_agg(x.partition) INTO owned
        FROM (SELECT t.partition FROM pgbroker.stream_cursor t
              WHERE t.stream_name = g.stream_name AND t.group_name = g.group_name AND t.owner = stream_rewind.consumer
              ORDER BY t.partition FOR UPDATE) x;
    ELSE
        -- (In partition order, as every locker of cursor rows.)
        WITH t AS (
            UPDATE pgbroker.stream_cursor t SET generation = stream_rewind.generation
            WHERE (t.stream_name, t.group_name, t.partition) IN (
                SELECT x.stream_name, x.group_name, x.partition FROM pgbroker.stream_cursor x
                WHERE x.stream_name = g.stream_name AND x.group_name = g.group_name
                  AND x.owner = stream_rewind.consumer
                ORDER BY x.partition FOR UPDATE)
            RETURNING t.partition)
        SELECT array_agg(t.partition) INTO owned FROM t;
    END IF;
    RETURN pgbroker._stream_positions_rewound(g.stream_name, g.group_name, owned);
END;
$$;

-- Move the positions of partitions whose cursor rows the caller holds locked
-- back to what was acknowledged (delivered_id := acked_id), those that were
-- not there; returns how many moved.
CREATE OR REPLACE FUNCTION pgbroker._stream_positions_rewound(stream_name text, group_name text, partitions integer[])
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    moved integer[];
    acked bigint[];
    acked_ats timestamptz[];
BEGIN
    SELECT array_agg(p.partition ORDER BY p.partition), array_agg(p.acked_id ORDER BY p.partition),
           array_agg(p.acked_at ORDER BY p.partition)
    INTO moved, acked, acked_ats
    FROM pgbroker._stream_positions(stream_name, group_name, partitions) p
    WHERE p.delivered_id <> p.acked_id;
    IF moved IS NULL THEN  -- (partitions NULL too: none owned)
        RETURN 0;
    END IF;
    PERFORM pgbroker._stream_positions_append(stream_name, group_name, moved, acked, acked, acked_ats);
    RETURN cardinality(moved);
END;
$$;

------------------------------------------------------------------------------
-- Reads and acks
------------------------------------------------------------------------------

-- stream_read, and with it the acks (partition, epoch, last id) of stream_ack
-- but without its failures: each cursor row the read moves or an ack names
-- is written once, at the end, with both. Every write of a row leaves a
-- version that a transaction holding back the xmin horizon keeps; an ack and
-- a read in two writes left two a partition a batch.
CREATE OR REPLACE FUNCTION pgbroker._stream_read(stream_name text, group_name text, consumer text, qty integer,
                                      lease_seconds integer, ack_partitions integer[], ack_epochs bigint[],
                                      ack_last_ids bigint[], generation bigint, lease_only boolean)
RETURNS TABLE (partition integer, id bigint, epoch bigint, key text, enqueued_at timestamptz,
               headers jsonb, message jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    g pgbroker.stream_group := pgbroker._stream_group_row(stream_name, group_name);
    s pgbroker.stream := pgbroker._stream_row(g.stream_name);
    safe bigint;
    -- The partitions this call locked, by position: partition, epoch, the position
    -- found (acked_id, delivered_id, acked_at), and where the read has reached.
    parts integer[] := '{}';
    epochs bigint[] := '{}';
    acked bigint[] := '{}';
    delivered bigint[] := '{}';
    acked_ats timestamptz[] := '{}';
    positions bigint[] := '{}';
    afters bigint[] := '{}';  -- past where each partition has nothing (a read goes on from there)
    todo integer[];
    remaining integer := qty;
    upto bigint;
    segment bigint;
    share integer;
    wanted integer[];  -- (by position, as parts) what each partition may still give this turn
    -- The partitions one call of the read function reads, as parts' positions, and theirs.
    sel integer[];
    sel_parts integer[];
    sel_afters bigint[];
    sel_wanted integer[];
    sel_epochs bigint[];
    got bigint[];
    filled boolean;  -- a partition gave all it was asked for: it may have more
    i integer;
    leaving integer[] := '{}';  -- beyond the consumer's share, in flight: not read (see _stream_balance)
    excess integer;
    superseded boolean;  -- a partition locked is marked with another generation ("Generations")
BEGIN
    PERFORM pgbroker._check_arg(qty BETWEEN 1 AND 100000,
        format('qty must be between 1 and 100000, got %s', coalesce(qty::text, 'NULL')));
    PERFORM pgbroker._stream_check_consumer(consumer, lease_seconds);
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pgbroker._check_arg(false,
            format('stream reads need READ COMMITTED, not %s', current_setting('transaction_isolation')),
            'A REPEATABLE READ snapshot may be older than the safe id: read in a READ COMMITTED transaction.');
    END IF;
    -- The ring, then rows (see "Positions").
    LOCK TABLE pgbroker.stream_position, pgbroker.stream_watermark IN ACCESS SHARE MODE;
    excess := pgbroker._stream_balance(s, g.group_name, consumer, lease_seconds, generation,
                                       coalesce(lease_only, false));
    IF excess > 0 THEN
        leaving := ARRAY(SELECT c.partition FROM pgbroker.stream_cursor c
                         WHERE c.stream_name = s.stream_name AND c.group_name = g.group_name AND c.owner = consumer
                         ORDER BY c.partition DESC LIMIT excess);
    END IF;
    -- The safe id advanced first, then one read up to it. (Reads went first up to
    -- the safe id as it stood, and advanced it only when that did not fill the
    -- batch: then a consumer keeping up, the usual case, walked every partition
    -- twice a call, once for nothing. The advance is a probe of the log's lock
    -- unless a producer is at work: a consumer catching up pays it once a batch.)
    safe := pgbroker._stream_read_safe_id(s.stream_name);
    -- Lock the consumer's cursor rows with messages to read, or acked by this call
    -- (not the log's): a partition cannot change hands between this read and the
    -- write of its position. Then their positions, read after the lock (see
    -- "Positions": the last writer's is seen). A call that acks is a consumer at
    -- work: all its rows, without looking at the positions first (one lookup
    -- fewer); a read alone, only those behind the safe id (an idle poll locks
    -- nothing).
    IF cardinality(ack_partitions) > 0 THEN
        SELECT coalesce(array_agg(t.partition), '{}') INTO parts
        FROM (SELECT c.partition FROM pgbroker.stream_cursor c
              WHERE c.stream_name = s.stream_name AND c.group_name = g.group_name AND c.owner = consumer
              ORDER BY c.partition
              FOR UPDATE) t;
    ELSE
        SELECT coalesce(array_agg(t.partition), '{}') INTO parts
        FROM (SELECT c.partition FROM pgbroker.stream_cursor c
              JOIN pgbroker._stream_positions(s.stream_name, g.group_name, ARRAY(
                  SELECT o.partition FROM pgbroker.stream_cursor o
                  WHERE o.stream_name = s.stream_name AND o.group_name = g.group_name AND o.owner = consumer)) p
                ON p.partition = c.partition
              WHERE c.stream_name = s.stream_name AND c.group_name = g.group_name AND c.owner = consumer
                AND p.delivered_id < safe
              ORDER BY c.partition
              FOR UPDATE OF c) t;
    END IF;
    IF cardinality(parts) > 0 THEN  -- (a partition with no position, none should, is left alone)
        SELECT coalesce(array_agg(c.partition ORDER BY c.partition), '{}'),
               array_agg(c.epoch ORDER BY c.partition), array_agg(p.acked_id ORDER BY c.partition),
               array_agg(p.delivered_id ORDER BY c.partition), array_agg(p.acked_at ORDER BY c.partition),
               bool_or(c.generation <> _stream_read.generation)
        INTO parts, epochs, acked, delivered, acked_ats, superseded
        FROM pgbroker.stream_cursor c
        JOIN pgbroker._stream_positions(s.stream_name, g.group_name, parts) p ON p.partition = c.partition
        WHERE c.stream_name = s.stream_name AND c.group_name = g.group_name AND c.owner = consumer
          AND c.partition = ANY (parts);
        -- After the lock (a new statement): a rewind that ran first is seen.
        IF superseded THEN
            RAISE EXCEPTION USING ERRCODE = 'PB022',
                MESSAGE = format('consumer %L of group %L of stream %L has rewound since this read''s generation %s',
                                 consumer, g.group_name, s.stream_name, _stream_read.generation),
                HINT = 'A read sent before the consumer''s last rewind and run after it (a hung session going on), '
                       'or another process reading under the same consumer name: rewind with a new generation '
                       'and read again, and give each consumer of a group its own name.';
        END IF;
    END IF;
    positions := delivered;
    afters := delivered;
    -- The partition furthest behind (lowest position) first, so that none starves.
    todo := ARRAY(SELECT x FROM generate_subscripts(parts, 1) x
                  WHERE afters[x] < safe AND NOT parts[x] = ANY (leaving)
                  ORDER BY positions[x], parts[x]);

    -- Across the partitions: first an even share of what is left for each, then what
    -- some could not give, from the others in turn. (Each partition read is its cursor
    -- row written, once with its ack: the same partitions batch after batch, a write
    -- each. A floor on the share, fewer partitions a batch, did not write fewer: the
    -- partitions read then take turns, and a batch writes those it acks and those it
    -- reads.) Each call of the stream's read function reads every partition still
    -- wanting rows in one segment (one child table), the lowest segment first.
    share := ceil(remaining::numeric / greatest(cardinality(todo), 1));
    filled := false;
    FOR turn IN 1 .. 2 LOOP
        EXIT WHEN turn = 2 AND NOT filled;  -- every partition gave less than its share: none has more
        wanted := array_fill(CASE WHEN turn = 1 THEN share ELSE remaining END, ARRAY[cardinality(parts)]);
        LOOP
            SELECT min(t.segment), array_agg(t.x ORDER BY t.o), array_agg(parts[t.x] ORDER BY t.o),
                   array_agg(afters[t.x] ORDER BY t.o), array_agg(wanted[t.x] ORDER BY t.o),
                   array_agg(epochs[t.x] ORDER BY t.o)
            INTO segment, sel, sel_parts, sel_afters, sel_wanted, sel_epochs
            FROM (SELECT u.x, u.o, (afters[u.x] + 1) / s.segment_rows AS segment,
                         min((afters[u.x] + 1) / s.segment_rows) OVER () AS first
                  FROM unnest(todo) WITH ORDINALITY AS u(x, o)
                  WHERE wanted[u.x] > 0 AND afters[u.x] < safe) t
            WHERE t.segment = t.first;
            EXIT WHEN segment IS NULL;
            upto := least(safe, (segment + 1) * s.segment_rows - 1);
            RETURN QUERY EXECUTE format('SELECT * FROM pgbroker.%I($1, $2, $3, $4, $5, $6, $7)',
                                        's_' || s.stream_name || '_read')
                USING (segment % s.segments)::integer, sel_parts, sel_afters, upto, sel_wanted, sel_epochs,
                      remaining;
            got := current_setting('pgbroker.stream_read_last')::bigint[];
            FOR j IN 1 .. coalesce(array_length(got, 1), 0) LOOP
                i := sel[got[j][1]];
                positions[i] := got[j][2];
                afters[i] := got[j][2];
                wanted[i] := wanted[i] - got[j][3];
                remaining := remaining - got[j][3];
            END LOOP;
            EXIT WHEN remaining <= 0;  -- (the rows of the partitions after were not looked at)
            -- Those that gave less than they were asked have nothing more up to upto:
            -- the next segment, or none left up to the safe id.
            FOREACH i IN ARRAY sel LOOP
                IF wanted[i] > 0 THEN
                    afters[i] := upto;
                ELSE
                    filled := true;
                END IF;
            END LOOP;
            -- The safe id's segment, the last: every partition wanting rows was in it.
            EXIT WHEN upto >= safe;
        END LOOP;
        EXIT WHEN remaining <= 0;
    END LOOP;

    -- One position a partition that moved: the read's new position and the ack (as
    -- stream_ack's: not past what was delivered before this read, and only under
    -- the epoch it names).
    -- (_stream_positions_append's INSERT, written here: one statement, not two.)
    INSERT INTO pgbroker.stream_position (stream_name, group_name, partition, seq, slot, acked_id, delivered_id,
                                          acked_at)
    SELECT s.stream_name, g.group_name, x.partition, x.seq, pgbroker._stream_ring_slot(x.seq), x.acked_id,
           x.delivered_id, x.acked_at
    FROM (SELECT nextval('pgbroker.stream_position_seq') AS seq, w.partition, w.acked_id, w.delivered_id,
                 w.acked_at
          FROM (SELECT u.partition, u.acked AS was_acked, u.delivered AS was_delivered,
                       u.position AS delivered_id,
                       CASE WHEN a.epoch = u.epoch THEN greatest(u.acked, least(a.last_id, u.delivered))
                            ELSE u.acked END AS acked_id,
                       CASE WHEN a.epoch = u.epoch THEN now() ELSE u.acked_at END AS acked_at
                FROM unnest(parts, epochs, acked, delivered, acked_ats, positions)
                     AS u(partition, epoch, acked, delivered, acked_at, position)
                LEFT JOIN unnest(ack_partitions, ack_epochs, ack_last_ids) AS a(partition, epoch, last_id)
                  ON a.partition = u.partition) w
          WHERE w.acked_id <> w.was_acked OR w.delivered_id <> w.was_delivered) x;
END;
$$;

-- Read up to qty messages for a consumer of a group, from the partitions it
-- owns (taking its share first, see _stream_balance): per partition in id
-- order, after what it was last handed, up to the safe id; a batch is filled
-- across the partitions with messages, an even share each first. Each row carries
-- its partition and the epoch to ack it under. A consumer may read again
-- before acking (the next messages come); an ack settles everything up to
-- the id it names.
-- Arguments: generation, the consumer's, as its last rewind named it (see
--   "Generations"; 0.2.0); NULL names none. lease_only (0.2.0): the consumer
--   is live by its lease alone, and this session takes no liveness lock for
--   it (see "Live"): for a caller whose sessions serve many consumers.
-- Errors: PB022 when a partition it would move is marked with another
--   generation; the read changes nothing.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.stream_read(stream_name text, group_name text, consumer text, qty integer DEFAULT 100,
                                     lease_seconds integer DEFAULT 30, generation bigint DEFAULT NULL,
                                     lease_only boolean DEFAULT false)
RETURNS TABLE (partition integer, id bigint, epoch bigint, key text, enqueued_at timestamptz,
               headers jsonb, message jsonb)
LANGUAGE sql AS $$
    SELECT * FROM pgbroker._stream_read(stream_name, group_name, consumer, qty, lease_seconds, NULL, NULL, NULL,
                                        generation, lease_only);
$$;

-- Acknowledge batches: for each (partition, epoch, last id) the consumer
-- was handed, the group's cursor moves up to last id, unless the partition
-- changed hands since (epoch): then nothing changes and that partition's row
-- says acked = false. failed_ids (with errors by position, or one error for
-- all) are messages of the acknowledged ranges that failed: they go to the
-- group's retry queue (see the header).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.stream_ack(stream_name text, group_name text, consumer text, partitions integer[],
                                    epochs bigint[], last_ids bigint[], failed_ids bigint[] DEFAULT NULL,
                                    errors text[] DEFAULT NULL)
RETURNS TABLE (partition integer, acked boolean) LANGUAGE plpgsql AS $$
DECLARE
    g pgbroker.stream_group := pgbroker._stream_group_row(stream_name, group_name);
    held integer[];
    moved integer[];
    new_acked bigint[];
    delivered bigint[];
BEGIN
    PERFORM pgbroker._check_arg(
        cardinality(partitions) = cardinality(epochs) AND cardinality(partitions) = cardinality(last_ids),
        'partitions, epochs and last_ids must have one entry per acknowledged partition');
    PERFORM pgbroker._check_arg(errors IS NULL OR cardinality(errors) IN (1, cardinality(failed_ids)),
        'errors must have one entry per failed id, or a single one for all');

    -- The partitions still the consumer's under the epochs named, locked (the ring
    -- first); then their positions, read after the lock (see "Positions"), and
    -- those the ack moves appended.
    LOCK TABLE pgbroker.stream_position IN ACCESS SHARE MODE;
    SELECT array_agg(x.partition) INTO held
    FROM (SELECT t.partition FROM pgbroker.stream_cursor t
          JOIN unnest(partitions, epochs) AS w(partition, epoch) ON w.partition = t.partition AND w.epoch = t.epoch
          WHERE t.stream_name = g.stream_name AND t.group_name = g.group_name AND t.owner = stream_ack.consumer
          ORDER BY t.partition FOR UPDATE OF t) x;
    -- The failures first: the ranges they may be in start at the positions before this ack.
    PERFORM pgbroker._stream_retry_failed(g, consumer, partitions, epochs, last_ids, failed_ids, errors);
    SELECT array_agg(m.partition ORDER BY m.partition), array_agg(m.acked_id ORDER BY m.partition),
           array_agg(m.delivered_id ORDER BY m.partition)
    INTO moved, new_acked, delivered
    FROM (SELECT w.partition, q.delivered_id, greatest(q.acked_id, least(w.last_id, q.delivered_id)) AS acked_id,
                 q.acked_id AS was_acked
          FROM unnest(partitions, last_ids) AS w(partition, last_id)
          JOIN pgbroker._stream_positions(g.stream_name, g.group_name, held) q ON q.partition = w.partition) m
    WHERE m.acked_id <> m.was_acked;
    IF moved IS NOT NULL THEN
        PERFORM pgbroker._stream_positions_append(g.stream_name, g.group_name, moved, new_acked, delivered,
                                                  array_fill(now(), ARRAY[cardinality(moved)]));
    END IF;

    RETURN QUERY
    SELECT w.partition, coalesce(w.partition = ANY (held), false)
    FROM unnest(partitions) AS w(partition) ORDER BY w.partition;
END;
$$;

-- The failed messages of acknowledged ranges, copied to the group's retry
-- queue with their place in the stream and the error (see the header), each
-- once: only those the ack settles, in a partition the consumer owns under
-- the epoch it names, after its position's acked_id (read before the ack
-- moves it) and up to the ack's last id and what was delivered. (Any id at or
-- below the last id was copied, as often as it was named: a consumer repeating
-- an ack wrote any message the stream ever had into the retry queue again and
-- again.)
CREATE OR REPLACE FUNCTION pgbroker._stream_retry_failed(g pgbroker.stream_group, consumer text, partitions integer[],
                                              epochs bigint[], last_ids bigint[], failed_ids bigint[],
                                              errors text[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    acked_ranges record;
    p pgbroker.queue_policy;
    retried bigint[];
BEGIN
    IF coalesce(cardinality(failed_ids), 0) = 0 THEN
        RETURN;
    END IF;
    p := pgbroker.policy(g.retry_queue);
    LOCK TABLE pgbroker.stream_position IN ACCESS SHARE MODE;  -- the ring (see "Positions")
    EXECUTE format(
        $Q$
        SELECT array_agg(l.message ORDER BY l.id) AS msgs,
               array_agg(coalesce(l.headers, '{}'::jsonb) || jsonb_build_object('x-pgbroker-stream',
                   jsonb_build_object('stream', $5::text, 'group', $6::text, 'partition', l.partition,
                                      'id', l.id, 'key', l.key, 'enqueued_at', l.enqueued_at,
                                      'error', left(coalesce(f.error, 'failed (no error given)'), 2000)))
                         ORDER BY l.id) AS hdrs
        FROM (SELECT DISTINCT ON (u.id) u.id, u.error
              FROM unnest($1::bigint[], CASE WHEN cardinality($2::text[]) = 1
                                             THEN array_fill(($2::text[])[1], ARRAY[cardinality($1::bigint[])])
                                             ELSE $2::text[] END) WITH ORDINALITY AS u(id, error, n)
              ORDER BY u.id, u.n) f
        JOIN pgbroker.%I l ON l.id = f.id
        JOIN (SELECT DISTINCT ON (a.partition) a.partition, q.acked_id AS after_id,
                     least(a.last_id, q.delivered_id) AS last_id
              FROM unnest($3::integer[], $8::bigint[], $4::bigint[]) AS a(partition, epoch, last_id)
              JOIN pgbroker.stream_cursor t
                ON t.stream_name = $5 AND t.group_name = $6 AND t.partition = a.partition AND t.owner = $7
               AND t.epoch = a.epoch
              JOIN pgbroker._stream_positions($5, $6, ARRAY[a.partition]) q ON true
              ORDER BY a.partition, a.last_id DESC) r
          ON r.partition = l.partition AND l.id > r.after_id AND l.id <= r.last_id
        $Q$, 's_' || g.stream_name)
        INTO acked_ranges
        USING failed_ids, errors, partitions, last_ids, g.stream_name, g.group_name, consumer, epochs;
    IF acked_ranges.msgs IS NULL THEN
        RETURN;
    END IF;
    retried := ARRAY(SELECT pgbroker._send_many(g.retry_queue, acked_ranges.msgs, acked_ranges.hdrs,
                                                 now() + make_interval(secs => pgbroker.retry_delay(p, 1)), true));
    IF p.max_deliveries IS NOT NULL AND p.max_deliveries <= 1 THEN
        PERFORM pgbroker._dead_letter(g.retry_queue, retried,
                                      coalesce(errors[1], 'failed (no error given)'), 1);
    END IF;
END;
$$;

-- Acknowledge the last batch and read the next in one call (one transaction,
-- one commit, one round trip a batch): what a worker loop calls. Each cursor
-- row is written once, with the ack and the read together (_stream_read),
-- unless the consumer may own more than its share: it gives partitions back
-- only when they have nothing in flight, so then the ack goes first.
-- Arguments: generation and lease_only, as for stream_read (0.2.0).
-- Errors: PB022 as for stream_read; the call acks nothing then either.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.stream_consume(stream_name text, group_name text, consumer text, qty integer DEFAULT 100,
                                        lease_seconds integer DEFAULT 30, partitions integer[] DEFAULT NULL,
                                        epochs bigint[] DEFAULT NULL, last_ids bigint[] DEFAULT NULL,
                                        failed_ids bigint[] DEFAULT NULL, errors text[] DEFAULT NULL,
                                        generation bigint DEFAULT NULL, lease_only boolean DEFAULT false)
RETURNS TABLE (partition integer, id bigint, epoch bigint, key text, enqueued_at timestamptz,
               headers jsonb, message jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    g pgbroker.stream_group;
    owned integer;
    live integer;
BEGIN
    IF coalesce(cardinality(partitions), 0) = 0 THEN
        RETURN QUERY SELECT * FROM pgbroker._stream_read(stream_name, group_name, consumer, qty, lease_seconds,
                                                        NULL, NULL, NULL, generation, lease_only);
        RETURN;
    END IF;
    g := pgbroker._stream_group_row(stream_name, group_name);
    PERFORM pgbroker._check_arg(
        cardinality(partitions) = cardinality(epochs) AND cardinality(partitions) = cardinality(last_ids),
        'partitions, epochs and last_ids must have one entry per acknowledged partition');
    PERFORM pgbroker._check_arg(errors IS NULL OR cardinality(errors) IN (1, cardinality(failed_ids)),
        'errors must have one entry per failed id, or a single one for all');
    SELECT count(*) INTO owned FROM pgbroker.stream_cursor t
    WHERE t.stream_name = g.stream_name AND t.group_name = g.group_name AND t.owner = consumer;
    SELECT count(*) INTO live FROM pgbroker.stream_consumer c
    WHERE c.stream_name = g.stream_name AND c.group_name = g.group_name
      AND (c.expires_at > now() OR c.consumer = stream_consume.consumer);
    IF owned > (pgbroker._stream_row(g.stream_name)).partitions / greatest(live, 1) THEN
        PERFORM pgbroker.stream_ack(stream_name, group_name, consumer, partitions, epochs, last_ids,
                                    failed_ids, errors);
        RETURN QUERY SELECT * FROM pgbroker._stream_read(stream_name, group_name, consumer, qty, lease_seconds,
                                                        NULL, NULL, NULL, generation, lease_only);
        RETURN;
    END IF;
    PERFORM pgbroker._stream_retry_failed(g, consumer, partitions, epochs, last_ids, failed_ids, errors);
    RETURN QUERY SELECT * FROM pgbroker._stream_read(stream_name, group_name, consumer, qty, lease_seconds,
                                                    partitions, epochs, last_ids, generation, lease_only);
END;
$$;

------------------------------------------------------------------------------
-- Lag
------------------------------------------------------------------------------

-- Per group and partition: where the cursor is, how many messages are kept
-- beyond it (counted on the index, up to the newest id drawn), the age of
-- the oldest of them, and the owner.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.stream_lag(stream_name text)
RETURNS TABLE (group_name text, partition integer, acked_id bigint, delivered_id bigint, lag bigint,
               oldest_unacked_at timestamptz, owner text, owner_alive boolean)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    s pgbroker.stream := pgbroker._stream_row(stream_name);
BEGIN
    RETURN QUERY EXECUTE format(
        $Q$
        SELECT c.group_name, c.partition, p.acked_id, p.delivered_id,
               (SELECT count(*) FROM pgbroker.%1$I l WHERE l.partition = c.partition AND l.id > p.acked_id),
               (SELECT l.enqueued_at FROM pgbroker.%1$I l WHERE l.partition = c.partition AND l.id > p.acked_id
                ORDER BY l.id LIMIT 1),
               c.owner,
               EXISTS (SELECT 1 FROM pgbroker.stream_consumer k
                       WHERE k.stream_name = c.stream_name AND k.group_name = c.group_name
                         AND k.consumer = c.owner AND k.expires_at > now())
        FROM pgbroker.stream_cursor c
        CROSS JOIN LATERAL pgbroker._stream_positions(c.stream_name, c.group_name, ARRAY[c.partition]) p
        WHERE c.stream_name = $1
        ORDER BY c.group_name, c.partition
        $Q$, 's_' || s.stream_name) USING s.stream_name;
END;
$$;

-- Per group: the lag summed over partitions, the age of its oldest
-- unacknowledged message, its live consumers and its retry queue.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.stream_groups(stream_name text)
RETURNS TABLE (group_name text, lag bigint, oldest_unacked_at timestamptz, consumers bigint, retry_queue text,
               created_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT g.group_name, coalesce(sum(l.lag), 0)::bigint, min(l.oldest_unacked_at),
           (SELECT count(*) FROM pgbroker.stream_consumer k
            WHERE k.stream_name = g.stream_name AND k.group_name = g.group_name AND k.expires_at > now()),
           g.retry_queue, g.created_at
    FROM pgbroker.stream_group g
    LEFT JOIN pgbroker.stream_lag($1) l ON l.group_name = g.group_name
    WHERE g.stream_name = (pgbroker._stream_row($1)).stream_name
    GROUP BY g.stream_name, g.group_name, g.retry_queue, g.created_at
    ORDER BY g.group_name;
$$;

------------------------------------------------------------------------------
-- Retention: TRUNCATE of whole child tables
------------------------------------------------------------------------------

-- Empty the child tables whose rows may all go, and return how many were
-- emptied. A child's rows are in segments <= its newest segment (the
-- newest segment number that maps to it and has ids drawn); it may go when:
--   * truncate_consumed, the stream has groups, and every cursor of every
--     group is past that segment's last id (the ids there are all settled:
--     the cursors never pass the safe id), or
--   * retention_seconds, and its newest message is older than that, or
--   * retention_bytes, the log is larger, and it holds the oldest segment.
-- The child is locked (ACCESS EXCLUSIVE, without waiting: a reader or
-- writer holding it means "next time") and the rules checked again under
-- the lock, because a producer may have moved into it in the meantime.
-- A producer that drew an id of the child's next lap and waits for the lock
-- inserts after the TRUNCATE: its row is kept. It rotates the groups' positions
-- first (_stream_positions_rotate: every stream's, when it can have the locks).
-- pgbroker maintain calls this.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.maintain_stream(stream_name text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    s pgbroker.stream := pgbroker._stream_row(stream_name);
    emptied integer := 0;
    child integer;
    order_by_age integer[];
BEGIN
    PERFORM pgbroker._stream_positions_rotate();
    -- Oldest first, so that the size rule frees the oldest segment first.
    order_by_age := ARRAY(SELECT c FROM generate_series(0, s.segments - 1) c
                          ORDER BY pgbroker._stream_child_segment(s, c));
    FOREACH child IN ARRAY order_by_age LOOP
        CONTINUE WHEN pgbroker._stream_child_segment(s, child) IS NULL
                   OR NOT pgbroker._stream_child_expired(s, child, false);
        BEGIN
            EXECUTE format('LOCK TABLE pgbroker.%I IN ACCESS EXCLUSIVE MODE NOWAIT',
                           's_' || s.stream_name || '_' || child);
        EXCEPTION WHEN lock_not_available THEN
            CONTINUE;
        END;
        IF pgbroker._stream_child_expired(s, child, true) THEN
            EXECUTE format('TRUNCATE pgbroker.%I', 's_' || s.stream_name || '_' || child);
            emptied := emptied + 1;
        END IF;
    END LOOP;
    DELETE FROM pgbroker.stream_idempotency_keys k  -- keys whose time is over
    WHERE k.stream_name = s.stream_name AND k.expires_at < clock_timestamp();
    RETURN emptied;
END;
$$;

-- The newest segment number with ids drawn that maps to child table c, or
-- NULL when none does yet.
CREATE OR REPLACE FUNCTION pgbroker._stream_child_segment(s pgbroker.stream, c integer)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    current_segment bigint := coalesce(pg_sequence_last_value(
        format('pgbroker.%I', 's_' || s.stream_name || '_seq')::regclass), 0) / s.segment_rows;
    newest bigint := current_segment - ((current_segment - c) % s.segments + s.segments) % s.segments;
BEGIN
    RETURN CASE WHEN newest < 0 THEN NULL ELSE newest END;
END;
$$;

-- Whether every row of child table c may go by the stream's rules (see
-- maintain_stream). locked: the caller holds the child's lock, so the size
-- may count it as empty after.
CREATE OR REPLACE FUNCTION pgbroker._stream_child_expired(s pgbroker.stream, c integer, locked boolean)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    child text := 's_' || s.stream_name || '_' || c;
    newest_segment bigint := pgbroker._stream_child_segment(s, c);
    current_segment bigint := coalesce(pg_sequence_last_value(
        format('pgbroker.%I', 's_' || s.stream_name || '_seq')::regclass), 0) / s.segment_rows;
    min_acked bigint;
    newest_at timestamptz;
    total_bytes bigint;
    oldest_child integer;
BEGIN
    IF newest_segment IS NULL THEN
        RETURN false;
    END IF;
    IF s.truncate_consumed AND newest_segment < current_segment THEN
        -- (A partition whose position is not found counts as at 0: nothing goes.)
        SELECT min(coalesce(p.acked_id, 0)) INTO min_acked FROM pgbroker.stream_cursor t
        LEFT JOIN LATERAL pgbroker._stream_positions(t.stream_name, t.group_name, ARRAY[t.partition]) p ON true
        WHERE t.stream_name = s.stream_name;
        IF min_acked >= (newest_segment + 1) * s.segment_rows - 1 THEN
            RETURN true;
        END IF;
    END IF;
    IF s.retention_seconds IS NOT NULL THEN
        -- The newest row of the child: the last id of each partition.
        EXECUTE format(
            $Q$
            SELECT max(r.enqueued_at) FROM generate_series(0, $1 - 1) p
            CROSS JOIN LATERAL (SELECT l.enqueued_at FROM pgbroker.%I l WHERE l.partition = p
                                ORDER BY l.id DESC LIMIT 1) r
            $Q$, child) INTO newest_at USING s.partitions;
        IF newest_at < now() - make_interval(secs => s.retention_seconds) THEN
            RETURN true;
        END IF;
    END IF;
    IF s.retention_bytes IS NOT NULL AND newest_segment < current_segment THEN
        SELECT sum(pg_total_relation_size(i.inhrelid)) INTO total_bytes
        FROM pg_catalog.pg_inherits i WHERE i.inhparent = format('pgbroker.%I', 's_' || s.stream_name)::regclass;
        SELECT x INTO oldest_child FROM generate_series(0, s.segments - 1) x
        WHERE pgbroker._stream_child_segment(s, x) IS NOT NULL
          AND EXISTS (SELECT 1 FROM pg_catalog.pg_class k
                      WHERE k.oid = format('pgbroker.%I', 's_' || s.stream_name || '_' || x)::regclass
                        AND pg_relation_size(k.oid) > 0)
        ORDER BY pgbroker._stream_child_segment(s, x) LIMIT 1;
        IF total_bytes > s.retention_bytes AND oldest_child = c THEN
            RETURN true;
        END IF;
    END IF;
    RETURN false;
END;
$$;
