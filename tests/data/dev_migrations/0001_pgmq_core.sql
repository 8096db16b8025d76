-- pgbroker migration 0001: the core of the pgmq 1.13 SQL contract.
--
-- Everything here is plain SQL and PL/pgSQL so that it installs on any
-- Postgres >= 14, managed services included. Names, argument names, defaults
-- and result types follow ../shared/spec/pgmq-api.md exactly; internals are
-- our own and live in schema pgbroker.
--
-- How a queue table is indexed (the reason reads do not slow down with the
-- backlog): a message is either *ready* (never delivered and visible from the
-- moment it was sent: read_ct = 0 AND vt <= enqueued_at) or *timed* (in flight,
-- delayed, or nacked: everything else). Ready messages sit in a partial index
-- on msg_id, so a read walks only deliverable rows in FIFO order; timed
-- messages sit in a partial index on vt, so due redeliveries are found from the
-- oldest due time and in-flight rows are never scanned. pgmq instead walks
-- msg_id order over every row and filters on vt, which touches every in-flight
-- message at the head of the queue on every read.

CREATE SCHEMA IF NOT EXISTS pgmq;
CREATE SCHEMA IF NOT EXISTS pgbroker;

CREATE TABLE pgmq.meta (
    queue_name VARCHAR UNIQUE NOT NULL,
    is_partitioned BOOLEAN NOT NULL,
    is_unlogged BOOLEAN NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL
);
-- pgmq maps 'Orders' and 'orders' to the same tables; pgbroker refuses the
-- second name instead (and finds the queue whatever case a caller uses).
CREATE UNIQUE INDEX meta_queue_name_lower_key ON pgmq.meta (lower(queue_name));

GRANT USAGE ON SCHEMA pgmq TO pg_monitor;
GRANT SELECT ON ALL TABLES IN SCHEMA pgmq TO pg_monitor;
GRANT SELECT ON ALL SEQUENCES IN SCHEMA pgmq TO pg_monitor;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgmq GRANT SELECT ON TABLES TO pg_monitor;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgmq GRANT SELECT ON SEQUENCES TO pg_monitor;

-- The field order of these types is part of the contract.
CREATE TYPE pgmq.message_record AS (
    msg_id BIGINT,
    read_ct INTEGER,
    enqueued_at TIMESTAMP WITH TIME ZONE,
    last_read_at TIMESTAMP WITH TIME ZONE,
    vt TIMESTAMP WITH TIME ZONE,
    message JSONB,
    headers JSONB
);

CREATE TYPE pgmq.queue_record AS (
    queue_name VARCHAR,
    is_partitioned BOOLEAN,
    is_unlogged BOOLEAN,
    created_at TIMESTAMP WITH TIME ZONE
);

CREATE TYPE pgmq.metrics_result AS (
    queue_name text,
    queue_length bigint,
    newest_msg_age_sec int,
    oldest_msg_age_sec int,
    total_messages bigint,
    scrape_time timestamp with time zone,
    queue_visible_length bigint,
    default_partition_length bigint
);

------------------------------------------------------------------------------
-- Internal helpers (schema pgbroker). Errors carry SQLSTATEs of class PB so
-- that every client, in any language, can tell them apart:
--   PB001 invalid queue name      PB002 queue not found
--   PB003 stale receipt           PB004 queue name conflict (case)
--   PB005 message too large       PB006 queue full (0008)
--   PB007 invalid argument        PB008 missing extension (0006)
------------------------------------------------------------------------------

CREATE FUNCTION pgbroker._check_name(queue_name text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF queue_name IS NULL OR queue_name = '' THEN
        RAISE EXCEPTION 'queue name must not be empty'
            USING ERRCODE = 'PB001',
                  HINT = 'Use a name of 1 to 47 characters, for example ''orders''.';
    END IF;
    IF length(queue_name) > 47 THEN
        -- The first sentence is pgmq's own message, kept for its clients.
        RAISE EXCEPTION 'queue name is too long, maximum length is 47 characters (got % characters)',
            length(queue_name)
            USING ERRCODE = 'PB001',
                  HINT = 'Table names are q_<name> and a_<name>, and identifiers stop at 63 bytes.';
    END IF;
    IF octet_length(queue_name) > 47 THEN
        -- Identifiers stop at 63 bytes: a longer multibyte name would be cut,
        -- and q_<name>_ready_idx and q_<name>_vt_idx would collide.
        RAISE EXCEPTION 'queue name is too long: % bytes in UTF-8, the maximum is 47 bytes',
            octet_length(queue_name)
            USING ERRCODE = 'PB001',
                  HINT = 'Use a shorter name; letters outside ASCII take two to four bytes each.';
    END IF;
    IF queue_name ~ '\$|;|--|''' THEN
        RAISE EXCEPTION 'queue name contains invalid characters: $, ;, --, or '' (got %)',
            quote_literal(queue_name)
            USING ERRCODE = 'PB001',
                  HINT = 'Use letters, digits, _ and - only.';
    END IF;
    IF queue_name ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'queue name contains a control character (got %)', quote_literal(queue_name)
            USING ERRCODE = 'PB001',
                  HINT = 'Use letters, digits, _ and - only.';
    END IF;
END;
$$;

-- The queue's table name for prefix 'q' or 'a'; fails with PB002 when the
-- queue was never created, naming the fix. Every operation calls this, so the
-- usual case is one index probe on the small meta table: only a name that is
-- not there is checked further, to say whether it is invalid or just missing
-- (a name in meta passed _check_name when its queue was created).
CREATE FUNCTION pgbroker._table(queue_name text, prefix text DEFAULT 'q')
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgmq.meta m WHERE lower(m.queue_name) = lower(_table.queue_name)) THEN
        PERFORM pgbroker._check_name(queue_name);
        RAISE EXCEPTION 'queue "%" does not exist', queue_name
            USING ERRCODE = 'PB002',
                  HINT = format('Create it first: SELECT pgmq.create(%L); or: pgbroker create %s',
                                queue_name, queue_name);
    END IF;
    RETURN lower(prefix || '_' || queue_name);
END;
$$;

CREATE FUNCTION pgbroker._check_arg(ok boolean, message text, hint text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION '%', message USING ERRCODE = 'PB007', HINT = coalesce(hint, '');
    END IF;
END;
$$;

-- Largest accepted message (jsonb datum size, bytes). Set with
-- ALTER DATABASE ... SET pgbroker.max_message_bytes = '...'; 0 disables it.
CREATE FUNCTION pgbroker._check_message_size(size bigint)
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    setting text := coalesce(nullif(current_setting('pgbroker.max_message_bytes', true), ''), '1048576');
    max_bytes bigint;
BEGIN
    IF setting !~ '^[0-9]{1,18}$' THEN
        RAISE EXCEPTION 'pgbroker.max_message_bytes must be a whole number of bytes, got %',
            quote_literal(setting)
            USING ERRCODE = 'PB007', HINT = 'Set it to 0 to disable the limit.';
    END IF;
    max_bytes := setting::bigint;
    IF max_bytes > 0 AND size > max_bytes THEN
        RAISE EXCEPTION 'message is too large: % bytes, the limit is % bytes', size, max_bytes
            USING ERRCODE = 'PB005',
                  HINT = 'Store large payloads elsewhere and send a reference, '
                         'or raise pgbroker.max_message_bytes.';
    END IF;
END;
$$;

-- The rows a read may take, oldest msg_id first, locked with SKIP LOCKED.
-- $1 = qty, $2 = conditional, $3 = the reader's clock. Used by read and pop
-- (and by the grouped reads to come) so that visibility is defined once.
--
-- Timed messages (redeliveries, delayed sends) are searched from the oldest
-- due time, up to a window of 1000 due rows, then ordered by msg_id with the
-- ready ones. Within that window the order is exactly pgmq's; only when more
-- than 1000 timed messages are due at once do the earliest-due go first.
CREATE FUNCTION pgbroker._visible_sql(qtable text, conditional jsonb)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format(
        $Q$
        ready AS (
            SELECT msg_id FROM pgmq.%1$I
            WHERE read_ct = 0 AND vt <= enqueued_at %2$s
            ORDER BY msg_id
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ),
        timed AS (
            -- ARRAY(...) makes the due rows an InitPlan probed by primary key;
            -- as a join the planner may walk the whole primary key instead.
            SELECT q.msg_id FROM pgmq.%1$I q
            WHERE q.msg_id = ANY (ARRAY(
                    SELECT msg_id FROM pgmq.%1$I
                    WHERE NOT (read_ct = 0 AND vt <= enqueued_at) AND vt <= $3 %2$s
                    ORDER BY vt
                    LIMIT 1000))
              AND NOT (q.read_ct = 0 AND q.vt <= q.enqueued_at) AND q.vt <= $3
            ORDER BY q.msg_id
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ),
        picked AS (
            SELECT msg_id FROM (SELECT msg_id FROM ready UNION ALL SELECT msg_id FROM timed) c
            ORDER BY msg_id
            LIMIT $1
        )
        $Q$,
        qtable,
        CASE WHEN conditional IS NULL OR conditional = '{}'::jsonb THEN ''
             ELSE 'AND message @> $2' END)
$$;

CREATE FUNCTION pgbroker._check_read_args(vt integer, qty integer)
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

------------------------------------------------------------------------------
-- Names
------------------------------------------------------------------------------

CREATE FUNCTION pgmq.validate_queue_name(queue_name TEXT)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._check_name(queue_name);
END;
$$;

CREATE FUNCTION pgmq.format_table_name(queue_name text, prefix text)
RETURNS TEXT LANGUAGE plpgsql AS $$
BEGIN
    IF queue_name ~ '\$|;|--|''' THEN
        RAISE EXCEPTION 'queue name contains invalid characters: $, ;, --, or '''
            USING ERRCODE = 'PB001';
    END IF;
    RETURN lower(prefix || '_' || queue_name);
END;
$$;

------------------------------------------------------------------------------
-- Queue management
------------------------------------------------------------------------------

CREATE FUNCTION pgbroker._create_queue(queue_name text, unlogged boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    qtable text := lower('q_' || queue_name);
    atable text := lower('a_' || queue_name);
    existing pgmq.meta;
BEGIN
    PERFORM pgbroker._check_name(queue_name);
    -- Serialise creators of the same name (any case) without blocking others.
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.queue:' || lower(queue_name)));

    SELECT * INTO existing FROM pgmq.meta m WHERE lower(m.queue_name) = lower(_create_queue.queue_name);
    IF FOUND THEN
        IF existing.queue_name <> queue_name THEN
            RAISE EXCEPTION 'queue "%" conflicts with existing queue "%": names differing only in case share tables',
                queue_name, existing.queue_name
                USING ERRCODE = 'PB004',
                      HINT = format('Use the existing name %L.', existing.queue_name);
        END IF;
        RETURN;  -- create is idempotent
    END IF;

    EXECUTE format(
        $Q$
        CREATE %s TABLE pgmq.%I (
            msg_id BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
            read_ct INT DEFAULT 0 NOT NULL,
            enqueued_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
            last_read_at TIMESTAMP WITH TIME ZONE,
            vt TIMESTAMP WITH TIME ZONE NOT NULL,
            message JSONB,
            headers JSONB
        )
        $Q$, CASE WHEN unlogged THEN 'UNLOGGED' ELSE '' END, qtable);
    EXECUTE format(
        'CREATE INDEX %I ON pgmq.%I (msg_id) WHERE read_ct = 0 AND vt <= enqueued_at',
        qtable || '_ready_idx', qtable);
    EXECUTE format(
        'CREATE INDEX %I ON pgmq.%I (vt) WHERE NOT (read_ct = 0 AND vt <= enqueued_at)',
        qtable || '_vt_idx', qtable);

    EXECUTE format(
        $Q$
        CREATE TABLE pgmq.%I (
            msg_id BIGINT PRIMARY KEY,
            read_ct INT DEFAULT 0 NOT NULL,
            enqueued_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
            last_read_at TIMESTAMP WITH TIME ZONE,
            archived_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
            vt TIMESTAMP WITH TIME ZONE NOT NULL,
            message JSONB,
            headers JSONB
        )
        $Q$, atable);
    EXECUTE format('CREATE INDEX %I ON pgmq.%I (archived_at)', 'archived_at_idx_' || lower(queue_name), atable);

    INSERT INTO pgmq.meta (queue_name, is_partitioned, is_unlogged)
    VALUES (queue_name, false, unlogged);
END;
$$;

CREATE FUNCTION pgmq.create_non_partitioned(queue_name TEXT)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._create_queue(queue_name, false);
END;
$$;

CREATE FUNCTION pgmq.create_unlogged(queue_name TEXT)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._create_queue(queue_name, true);
END;
$$;

CREATE FUNCTION pgmq."create"(queue_name TEXT)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._create_queue(queue_name, false);
END;
$$;

CREATE FUNCTION pgmq.drop_queue(queue_name TEXT)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
DECLARE
    stored_name text;
BEGIN
    PERFORM pgbroker._check_name(queue_name);
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.queue:' || lower(queue_name)));
    SELECT m.queue_name INTO stored_name FROM pgmq.meta m
    WHERE lower(m.queue_name) = lower(drop_queue.queue_name);
    IF NOT FOUND THEN
        RAISE NOTICE 'pgmq queue `%` does not exist', queue_name;
        RETURN false;
    END IF;
    EXECUTE format('DROP TABLE IF EXISTS pgmq.%I', lower('q_' || queue_name));
    EXECUTE format('DROP TABLE IF EXISTS pgmq.%I', lower('a_' || queue_name));
    DELETE FROM pgmq.meta m WHERE m.queue_name = stored_name;
    RETURN true;
END;
$$;

CREATE FUNCTION pgmq.drop_queue(queue_name TEXT, partitioned BOOLEAN)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING 'drop_queue(queue_name, partitioned) is deprecated; use drop_queue(queue_name)';
    PERFORM pgmq.drop_queue(queue_name);
    RETURN true;
END;
$$;

CREATE FUNCTION pgmq.purge_queue(queue_name TEXT)
RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
    purged bigint;
BEGIN
    -- Lock first so that the count is exactly what TRUNCATE removes.
    EXECUTE format('LOCK TABLE pgmq.%I IN ACCESS EXCLUSIVE MODE', qtable);
    EXECUTE format('SELECT count(*) FROM pgmq.%I', qtable) INTO purged;
    EXECUTE format('TRUNCATE TABLE pgmq.%I', qtable);
    RETURN purged;
END;
$$;

CREATE FUNCTION pgmq.list_queues()
RETURNS SETOF pgmq.queue_record LANGUAGE sql STABLE AS $$
    SELECT queue_name, is_partitioned, is_unlogged, created_at FROM pgmq.meta ORDER BY queue_name;
$$;

-- Rows in the default partitions of a queue and its archive, or NULL for a
-- queue without any (every plain queue), as pgmq reports. Rows there have no
-- partition of their own: partition maintenance is falling behind (0006).
-- Exact while a default partition is small (8 MB), estimated from the
-- planner's statistics beyond that, so a scrape never scans a large spill.
CREATE FUNCTION pgbroker._default_partition_length(queue_name text)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    d record;
    n bigint;
    total bigint;  -- NULL for a queue without default partitions, as in pgmq
BEGIN
    FOR d IN
        SELECT c.oid, c.relpages, c.reltuples, pg_relation_size(c.oid) AS bytes
        FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partdefid
        WHERE p.partrelid IN (to_regclass(format('pgmq.%I', lower('q_' || queue_name))),
                              to_regclass(format('pgmq.%I', lower('a_' || queue_name))))
    LOOP
        IF d.bytes = 0 THEN
            n := 0;
        ELSIF d.bytes <= 8388608 OR d.relpages <= 0 OR d.reltuples < 0 THEN
            EXECUTE format('SELECT count(*) FROM %s', d.oid::regclass) INTO n;
        ELSE
            n := (d.reltuples / d.relpages * (d.bytes / current_setting('block_size')::bigint))::bigint;
        END IF;
        total := coalesce(total, 0) + n;
    END LOOP;
    RETURN total;
END;
$$;

CREATE FUNCTION pgmq.metrics(queue_name TEXT)
RETURNS pgmq.metrics_result LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
    result pgmq.metrics_result;
BEGIN
    EXECUTE format(
        $Q$
        SELECT %1$L::text,
               count(*),
               extract(epoch FROM (now() - max(enqueued_at)))::int,
               extract(epoch FROM (now() - min(enqueued_at)))::int,
               (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pgmq.%3$I),
               now(),
               count(*) FILTER (WHERE vt <= now()),
               pgbroker._default_partition_length(%1$L)
        FROM pgmq.%2$I
        $Q$, queue_name, qtable, qtable || '_msg_id_seq')
    INTO result;
    RETURN result;
END;
$$;

CREATE FUNCTION pgmq.metrics_all()
RETURNS SETOF pgmq.metrics_result LANGUAGE plpgsql AS $$
DECLARE
    name text;
BEGIN
    FOR name IN SELECT m.queue_name FROM pgmq.meta m ORDER BY m.queue_name LOOP
        RETURN NEXT pgmq.metrics(name);
    END LOOP;
END;
$$;

------------------------------------------------------------------------------
-- Sending. Every form lands in pgbroker._send_many, so validation and the
-- insert are written once. A message without delay gets vt = enqueued_at,
-- which is what puts it in the ready index.
------------------------------------------------------------------------------

-- The shape of a batch, checked before anything is sent (send_batch_topic
-- checks it once even when no queue matches).
CREATE FUNCTION pgbroker._check_batch(msgs jsonb[], headers jsonb[])
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgbroker._check_arg(msgs IS NOT NULL AND cardinality(msgs) > 0,
        'msgs cannot be NULL or empty', 'Pass at least one message.');
    PERFORM pgbroker._check_arg(headers IS NULL OR cardinality(headers) = cardinality(msgs),
        format('headers array length (%s) must match msgs array length (%s)',
               cardinality(headers), cardinality(msgs)),
        'Give one headers object per message, or none at all.');
END;
$$;

CREATE FUNCTION pgbroker._send_many(queue_name text, msgs jsonb[], headers jsonb[], delay timestamptz)
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

CREATE FUNCTION pgbroker._delay_to_time(delay integer)
RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pgbroker._check_arg(delay IS NOT NULL AND delay >= 0,
        format('delay must be a number of seconds >= 0, got %s', coalesce(delay::text, 'NULL')),
        'delay is how long a sent message stays invisible.');
    IF delay = 0 THEN
        RETURN NULL;  -- no delay: ready at once
    END IF;
    RETURN clock_timestamp() + make_interval(secs => delay);
END;
$$;

CREATE FUNCTION pgbroker._check_delay_time(delay timestamptz)
RETURNS timestamptz LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgbroker._check_arg(delay IS NOT NULL,
        'delay must be a timestamp, got NULL', 'Omit delay to send without one.');
    RETURN delay;
END;
$$;

CREATE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB, delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE sql AS $$
    SELECT pgbroker._send_many(queue_name, ARRAY[msg], ARRAY[headers], pgbroker._check_delay_time(delay));
$$;

CREATE FUNCTION pgmq.send(queue_name TEXT, msg JSONB)
RETURNS SETOF BIGINT LANGUAGE sql AS $$
    SELECT pgbroker._send_many(queue_name, ARRAY[msg], NULL, NULL);
$$;

CREATE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB)
RETURNS SETOF BIGINT LANGUAGE sql AS $$
    SELECT pgbroker._send_many(queue_name, ARRAY[msg], ARRAY[headers], NULL);
$$;

CREATE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE sql AS $$
    SELECT pgbroker._send_many(queue_name, ARRAY[msg], NULL, pgbroker._delay_to_time(delay));
$$;

CREATE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE sql AS $$
    SELECT pgbroker._send_many(queue_name, ARRAY[msg], NULL, pgbroker._check_delay_time(delay));
$$;

CREATE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB, delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE sql AS $$
    SELECT pgbroker._send_many(queue_name, ARRAY[msg], ARRAY[headers], pgbroker._delay_to_time(delay));
$$;

CREATE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[], delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE sql AS $$
    SELECT pgbroker._send_many(queue_name, msgs, headers, pgbroker._check_delay_time(delay));
$$;

CREATE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[])
RETURNS SETOF BIGINT LANGUAGE sql AS $$
    SELECT pgbroker._send_many(queue_name, msgs, NULL, NULL);
$$;

CREATE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[])
RETURNS SETOF BIGINT LANGUAGE sql AS $$
    SELECT pgbroker._send_many(queue_name, msgs, headers, NULL);
$$;

CREATE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE sql AS $$
    SELECT pgbroker._send_many(queue_name, msgs, NULL, pgbroker._delay_to_time(delay));
$$;

CREATE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE sql AS $$
    SELECT pgbroker._send_many(queue_name, msgs, NULL, pgbroker._check_delay_time(delay));
$$;

CREATE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[], delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE sql AS $$
    SELECT pgbroker._send_many(queue_name, msgs, headers, pgbroker._delay_to_time(delay));
$$;

------------------------------------------------------------------------------
-- Reading
------------------------------------------------------------------------------

CREATE FUNCTION pgmq.read(queue_name TEXT, vt INTEGER, qty INTEGER, conditional JSONB DEFAULT '{}')
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
BEGIN
    PERFORM pgbroker._check_read_args(vt, qty);
    RETURN QUERY EXECUTE format(
        $Q$
        WITH %2$s,
        leased AS (
            UPDATE pgmq.%1$I q
            SET vt = clock_timestamp() + make_interval(secs => $4),
                read_ct = q.read_ct + 1,
                last_read_at = clock_timestamp()
            FROM picked WHERE q.msg_id = picked.msg_id
            RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message, q.headers
        )
        SELECT * FROM leased ORDER BY msg_id
        $Q$, qtable, pgbroker._visible_sql(qtable, conditional))
    USING qty, conditional, clock_timestamp(), vt;
END;
$$;

-- Run a read statement until it returns rows or max_poll_seconds have
-- passed, sleeping poll_interval_ms between tries; shared by every
-- *_with_poll form. It always reads at least once.
CREATE FUNCTION pgbroker._poll(read_statement text, max_poll_seconds integer, poll_interval_ms integer)
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

CREATE FUNCTION pgmq.read_with_poll(
    queue_name TEXT,
    vt INTEGER,
    qty INTEGER,
    max_poll_seconds INTEGER DEFAULT 5,
    poll_interval_ms INTEGER DEFAULT 100,
    conditional JSONB DEFAULT '{}'
)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT * FROM pgbroker._poll(
        format('SELECT * FROM pgmq.read(%L, %s, %s, %L)', queue_name, coalesce(vt::text, 'NULL'),
               coalesce(qty::text, 'NULL'), conditional),
        max_poll_seconds, poll_interval_ms);
$$;

CREATE FUNCTION pgmq.pop(queue_name TEXT, qty INTEGER DEFAULT 1)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
BEGIN
    PERFORM pgbroker._check_read_args(0, qty);
    RETURN QUERY EXECUTE format(
        $Q$
        WITH %2$s,
        popped AS (
            DELETE FROM pgmq.%1$I q USING picked WHERE q.msg_id = picked.msg_id
            RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message, q.headers
        )
        SELECT * FROM popped ORDER BY msg_id
        $Q$, qtable, pgbroker._visible_sql(qtable, NULL))
    USING qty, NULL::jsonb, clock_timestamp();
END;
$$;

------------------------------------------------------------------------------
-- Acknowledging (unfenced, as in pgmq; pgbroker.ack is the fenced form)
------------------------------------------------------------------------------

CREATE FUNCTION pgmq.delete(queue_name TEXT, msg_ids BIGINT[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
BEGIN
    RETURN QUERY EXECUTE format(
        'DELETE FROM pgmq.%I WHERE msg_id = ANY($1) RETURNING msg_id', qtable)
    USING msg_ids;
END;
$$;

CREATE FUNCTION pgmq.delete(queue_name TEXT, msg_id BIGINT)
RETURNS BOOLEAN LANGUAGE sql AS $$
    SELECT EXISTS (SELECT 1 FROM pgmq.delete(queue_name, ARRAY[msg_id]));
$$;

CREATE FUNCTION pgmq.archive(queue_name TEXT, msg_ids BIGINT[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
BEGIN
    RETURN QUERY EXECUTE format(
        $Q$
        WITH moved AS (
            DELETE FROM pgmq.%1$I WHERE msg_id = ANY($1)
            RETURNING msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers
        )
        INSERT INTO pgmq.%2$I (msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers)
        SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers FROM moved
        RETURNING msg_id
        $Q$, qtable, 'a' || substr(qtable, 2))
    USING msg_ids;
END;
$$;

CREATE FUNCTION pgmq.archive(queue_name TEXT, msg_id BIGINT)
RETURNS BOOLEAN LANGUAGE sql AS $$
    SELECT EXISTS (SELECT 1 FROM pgmq.archive(queue_name, ARRAY[msg_id]));
$$;

------------------------------------------------------------------------------
-- Visibility
------------------------------------------------------------------------------

CREATE FUNCTION pgmq.set_vt(queue_name TEXT, msg_ids BIGINT[], vt TIMESTAMP WITH TIME ZONE)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._table(queue_name);
BEGIN
    PERFORM pgbroker._check_arg(vt IS NOT NULL, 'vt must be a timestamp, got NULL');
    RETURN QUERY EXECUTE format(
        $Q$
        WITH changed AS (
            UPDATE pgmq.%I SET vt = $2 WHERE msg_id = ANY($1)
            RETURNING msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers
        )
        SELECT * FROM changed ORDER BY msg_id
        $Q$, qtable)
    USING msg_ids, vt;
END;
$$;

CREATE FUNCTION pgmq.set_vt(queue_name TEXT, msg_ids BIGINT[], vt INTEGER)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._check_arg(vt IS NOT NULL AND vt >= 0,
        format('vt must be a number of seconds >= 0, got %s', coalesce(vt::text, 'NULL')));
    RETURN QUERY SELECT * FROM pgmq.set_vt(queue_name, msg_ids, clock_timestamp() + make_interval(secs => vt));
END;
$$;

CREATE FUNCTION pgmq.set_vt(queue_name TEXT, msg_id BIGINT, vt TIMESTAMP WITH TIME ZONE)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT * FROM pgmq.set_vt(queue_name, ARRAY[msg_id], vt);
$$;

CREATE FUNCTION pgmq.set_vt(queue_name TEXT, msg_id BIGINT, vt INTEGER)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT * FROM pgmq.set_vt(queue_name, ARRAY[msg_id], vt);
$$;
