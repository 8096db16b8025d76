-- Queues: pgmq's SQL contract (1.13) and the tables behind it.
--
-- Everything is plain SQL and PL/pgSQL so that it installs on any Postgres
-- >= 14, managed services included. Names, argument names, defaults and
-- result types in schema pgmq follow pgmq's API exactly; internals are our
-- own and live in schema pgbroker.
--
-- A queue is two tables: pgmq.q_<name> holds its messages, pgmq.a_<name> its
-- archive. How a queue table is indexed (the reason reads do not slow down
-- with the backlog): a message is either *ready* (never delivered and visible
-- from the moment it was sent: read_ct = 0 AND vt <= enqueued_at) or *timed*
-- (in flight, delayed, or nacked: everything else). Ready messages sit in a
-- partial index on msg_id, so a read walks only deliverable rows in FIFO
-- order; timed messages sit in a partial index on vt, so due redeliveries are
-- found from the oldest due time and in-flight rows are never scanned. pgmq
-- instead walks msg_id order over every row and filters on vt, which touches
-- every in-flight message at the head of the queue on every read.

-- Let pg_monitor read every queue and archive table, payloads included, as
-- pgmq does (allowed), or take that back (not allowed: the default). Covers
-- the tables there are and, by default privileges, those that the role
-- calling this creates later (run it as the role that creates queues).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.grant_pg_monitor_payloads(allowed boolean)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._check_arg(allowed IS NOT NULL, 'allowed must be true or false, got NULL');
    IF allowed THEN
        GRANT SELECT ON ALL TABLES IN SCHEMA pgmq TO pg_monitor;
        ALTER DEFAULT PRIVILEGES IN SCHEMA pgmq GRANT SELECT ON TABLES TO pg_monitor;
    ELSE
        REVOKE SELECT ON ALL TABLES IN SCHEMA pgmq FROM pg_monitor;
        ALTER DEFAULT PRIVILEGES IN SCHEMA pgmq REVOKE SELECT ON TABLES FROM pg_monitor;
        GRANT SELECT ON pgmq.meta TO pg_monitor;
    END IF;
END;
$$;

------------------------------------------------------------------------------
-- Internal helpers (schema pgbroker). pgbroker's errors have codes of class
-- PB so that every client, in any language, can tell them apart:
--   PB001 invalid queue name      PB002 queue not found
--   PB003 stale receipt           PB004 queue name conflict (case, or
--                                       another group's retry queue)
--   PB005 message too large       PB006 queue full (max_depth)
--   PB007 invalid argument        PB008 missing extension (pg_partman)
-- The functions of schema pgbroker raise them as SQLSTATEs; those of schema
-- pgmq raise pgmq's errors and carry the code in DETAIL (see "pgmq's
-- failures" below, and docs/compatibility.md).
------------------------------------------------------------------------------

-- Refuse a name that cannot be a queue's (PB001), saying why: its tables are
-- q_<name> and a_<name>, lower-cased, within Postgres' identifier length.
CREATE OR REPLACE FUNCTION pgbroker._check_name(queue_name text)
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
    PERFORM pgbroker._check_name_characters(queue_name, 'queue');
END;
$$;

-- Refuse a queue or stream name (kind) with whitespace (Unicode's too: no-break
-- and zero-width spaces) or a control character (PB001): such a name cannot be
-- told apart from another when printed, and nothing is easier to get wrong in
-- a shell, a URL or a log.
CREATE OR REPLACE FUNCTION pgbroker._check_name_characters(name text, kind text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    -- The class is written out rather than [:space:][:cntrl:], whose meaning
    -- beyond ASCII depends on the database's locale; pgbroker._db.names.UNPRINTABLE
    -- is the same text.
    IF name ~ '[\x00-\x20\x7f-\xa0\u1680\u2000-\u200b\u2028\u2029\u202f\u205f\u3000\ufeff]' THEN
        RAISE EXCEPTION '% name contains whitespace or a control character (got %)', kind, quote_literal(name)
            USING ERRCODE = 'PB001',
                  HINT = 'Use letters, digits, _ and - only.';
    END IF;
END;
$$;

-- What to do about a queue that does not exist, in SQL and on the command line.
CREATE OR REPLACE FUNCTION pgbroker._no_queue_hint(queue_name text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT format('Create it first: SELECT pgmq.create(%L); or: pgbroker create %s', queue_name, queue_name);
$$;

-- The queue's table name for prefix 'q' or 'a'; fails with PB002 when the
-- queue was never created, naming the fix. Every operation calls this, so the
-- usual case is one index probe on the small meta table: only a name that is
-- not there is checked further, to say whether it is invalid or just missing
-- (a name in meta passed _check_name when its queue was created).
CREATE OR REPLACE FUNCTION pgbroker._table(queue_name text, prefix text DEFAULT 'q')
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgmq.meta m WHERE lower(m.queue_name) = lower(_table.queue_name)) THEN
        PERFORM pgbroker._check_name(queue_name);
        RAISE EXCEPTION 'queue "%" does not exist', queue_name
            USING ERRCODE = 'PB002',
                  HINT = pgbroker._no_queue_hint(queue_name);
    END IF;
    RETURN lower(prefix || '_' || queue_name);
END;
$$;

------------------------------------------------------------------------------
-- pgmq's failures. A function of schema pgmq fails as pgmq 1.13 fails: the
-- same SQLSTATE (P0001 for pgmq's RAISEs, 42P01 where pgmq trips over a
-- missing table, 22004 where it formats a NULL name), the same message, in
-- the same order of checks. pgbroker's own code rides in DETAIL, as
-- 'pgbroker PB00n: <what pgbroker would say>', with pgbroker's hint: pgmq
-- clients look at the SQLSTATE and the message, pgbroker's client reads the
-- code back from DETAIL (errors.py). Only errors pgmq does not have (a name
-- it accepts, a queue full, a message too large, ...) keep a class PB code.
-- These run only on the way to an error: the hot paths test inline.
------------------------------------------------------------------------------

-- Raise pgmq's error: message with pgmq's SQLSTATE (P0001 by default) and
-- pgbroker's code and hint in DETAIL and HINT.
CREATE OR REPLACE FUNCTION pgbroker._pgmq_raise(message text, pb_code text, hint text DEFAULT NULL,
                                     explanation text DEFAULT NULL, sqlstate text DEFAULT 'P0001')
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION '%', message
        USING ERRCODE = sqlstate,
              DETAIL = 'pgbroker ' || pb_code || coalesce(': ' || explanation, ''),
              HINT = coalesce(hint, '');
END;
$$;

-- pgmq's check of a name's characters (pgmq.format_table_name's).
CREATE OR REPLACE FUNCTION pgbroker._pgmq_check_characters(queue_name text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF queue_name ~ '\$|;|--|''' THEN
        PERFORM pgbroker._pgmq_raise('queue name contains invalid characters: $, ;, --, or \''',
            'PB001', 'Use letters, digits, _ and - only.', 'invalid queue name ' || quote_literal(queue_name));
    END IF;
END;
$$;

-- pgmq's check of a name's length (pgmq.validate_queue_name's).
CREATE OR REPLACE FUNCTION pgbroker._pgmq_check_length(queue_name text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF length(queue_name) > 47 THEN
        PERFORM pgbroker._pgmq_raise('queue name is too long, maximum length is 47 characters', 'PB001',
            'Table names are q_<name> and a_<name>, and identifiers stop at 63 bytes.',
            format('queue name of %s characters', length(queue_name)));
    END IF;
END;
$$;

-- How pgmq fails on a queue that does not exist: its characters are checked,
-- a NULL name cannot be formatted (22004), any other name is a table that is
-- not there (42P01). DETAIL says which of PB001 (a name pgbroker could never
-- create) and PB002 (a queue not created yet) pgbroker sees.
CREATE OR REPLACE FUNCTION pgbroker._pgmq_no_queue(queue_name text, prefix text DEFAULT 'q')
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    code text := 'PB002';
    explanation text := format('queue "%s" does not exist', queue_name);
    hint text := pgbroker._no_queue_hint(queue_name);
BEGIN
    PERFORM pgbroker._pgmq_check_characters(queue_name);
    BEGIN
        PERFORM pgbroker._check_name(queue_name);
    EXCEPTION WHEN SQLSTATE 'PB001' THEN
        code := 'PB001';
        GET STACKED DIAGNOSTICS explanation = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT;
    END;
    IF queue_name IS NULL THEN
        PERFORM pgbroker._pgmq_raise('null values cannot be formatted as an SQL identifier', code, hint,
            explanation, '22004');
    END IF;
    PERFORM pgbroker._pgmq_raise(format('relation "pgmq.%s" does not exist', lower(prefix || '_' || queue_name)),
        code, hint, explanation, '42P01');
END;
$$;

-- pgbroker._table for the functions of schema pgmq: pgmq's failures.
CREATE OR REPLACE FUNCTION pgbroker._pgmq_table(queue_name text, prefix text DEFAULT 'q')
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgmq.meta m WHERE lower(m.queue_name) = lower(_pgmq_table.queue_name)) THEN
        PERFORM pgbroker._pgmq_no_queue(queue_name, prefix);
    END IF;
    RETURN lower(prefix || '_' || queue_name);
END;
$$;

-- pgbroker._check_arg for the functions of schema pgmq: pgmq's message under
-- P0001, pgbroker's code in DETAIL.
CREATE OR REPLACE FUNCTION pgbroker._pgmq_check(ok boolean, message text, hint text DEFAULT NULL, pb_code text DEFAULT 'PB007')
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        PERFORM pgbroker._pgmq_raise(message, pb_code, hint);
    END IF;
END;
$$;

-- Refuse an invalid argument with PB007 and a hint; ok NULL counts as false.
CREATE OR REPLACE FUNCTION pgbroker._check_arg(ok boolean, message text, hint text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        RAISE EXCEPTION '%', message USING ERRCODE = 'PB007', HINT = coalesce(hint, '');
    END IF;
END;
$$;

-- The queue's name as stored in pgmq.meta (the key of the tables that refer
-- to a queue) for any spelling; NULL when there is no such queue, so callers
-- check with _table first.
CREATE OR REPLACE FUNCTION pgbroker._stored_name(queue_name text)
RETURNS varchar LANGUAGE sql STABLE AS $$
    SELECT m.queue_name FROM pgmq.meta m WHERE lower(m.queue_name) = lower($1);
$$;

------------------------------------------------------------------------------
-- Names
------------------------------------------------------------------------------

-- Check a queue name as pgmq does: its length only (pgmq leaves the
-- characters to format_table_name). pgbroker._check_name checks fully when a
-- queue is made.
-- Errors: pgmq's when the name is too long (pgbroker code PB001).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.validate_queue_name(queue_name TEXT)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._pgmq_check_length(queue_name);
END;
$$;

-- The table name of a queue for a prefix ('q' for messages, 'a' for the
-- archive), as pgmq's helper, with pgmq's check and message: it refuses only
-- the characters that could end a literal or a statement.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.format_table_name(queue_name text, prefix text)
RETURNS TEXT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._pgmq_check_characters(queue_name);
    RETURN lower(prefix || '_' || queue_name);
END;
$$;

------------------------------------------------------------------------------
-- Queue management
------------------------------------------------------------------------------

-- The checks of a new queue's name: pgmq's first, in pgmq's order and with
-- its errors (characters, length, then a NULL name cannot be formatted), then
-- pgbroker's own (PB001: names pgmq accepts but pgbroker refuses, see
-- _check_name).
CREATE OR REPLACE FUNCTION pgbroker._check_new_name(queue_name text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgbroker._pgmq_check_characters(queue_name);
    PERFORM pgbroker._pgmq_check_length(queue_name);
    IF queue_name IS NULL THEN
        PERFORM pgbroker._pgmq_raise('null values cannot be formatted as an SQL identifier', 'PB001',
            'Use a name of 1 to 47 characters, for example ''orders''.', 'queue name must not be NULL', '22004');
    END IF;
    PERFORM pgbroker._check_name(queue_name);
END;
$$;

-- Run a LOCK statement, waiting at most wait for it (NULL: as the statement
-- says, e.g. NOWAIT); true once it holds, false when it could not be had in
-- time (or would deadlock), with nothing left behind: the attempt runs in a
-- subtransaction that takes back its lock request and its lock_timeout. For
-- upkeep that may skip a round rather than wait, or hold up those queued
-- behind it.
CREATE OR REPLACE FUNCTION pgbroker._lock_within(lock_statement text, wait text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    was_timeout constant text := current_setting('lock_timeout');
BEGIN
    IF wait IS NOT NULL THEN
        PERFORM set_config('lock_timeout', wait, true);
    END IF;
    EXECUTE lock_statement;
    PERFORM set_config('lock_timeout', was_timeout, true);
    RETURN true;
EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
    RETURN false;
END;
$$;

-- Take a queue's turn among the operations that change it (create, drop,
-- policies, notifications, indexes, partitions), to the end of the
-- transaction: its row of pgmq.meta, which only the schema's owner may lock.
-- A name with no queue yet takes an advisory lock, then the row if a creator
-- made it meanwhile: creators of one name must take turns before the row
-- exists. Any session may take an advisory lock, so an outsider holding that
-- one can hold up the creation of that name, and nothing else (it once held
-- up every change of the queue and the upkeep of its partitions).
CREATE OR REPLACE FUNCTION pgbroker._queue_turn(queue_name text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM pgmq.meta m WHERE lower(m.queue_name) = lower(_queue_turn.queue_name) FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        PERFORM pg_advisory_xact_lock(hashtext('pgbroker.queue:' || lower(queue_name)));
        PERFORM FROM pgmq.meta m WHERE lower(m.queue_name) = lower(_queue_turn.queue_name) FOR NO KEY UPDATE;
    END IF;
END;
$$;

-- Create a plain queue: the queue table with its ready and timed indexes, the
-- archive, and the meta row (whose insert rewrites the routes, 90_routes.sql).
-- Idempotent for the same name, with the notices pgmq's CREATE ... IF NOT
-- EXISTS statements give; PB004 for a name that differs only in case.
-- Partitioned queues are made by pgmq.create_partitioned (76_partitions.sql).
CREATE OR REPLACE FUNCTION pgbroker._create_queue(queue_name text, unlogged boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    qtable text := lower('q_' || queue_name);
    atable text := lower('a_' || queue_name);
    existing pgmq.meta;
    relation text;
BEGIN
    PERFORM pgbroker._check_new_name(queue_name);
    -- Serialise creators of the same name (any case) without blocking others.
    PERFORM pgbroker._queue_turn(queue_name);

    SELECT * INTO existing FROM pgmq.meta m WHERE lower(m.queue_name) = lower(_create_queue.queue_name);
    IF FOUND THEN
        IF existing.queue_name <> queue_name THEN
            RAISE EXCEPTION 'queue "%" conflicts with existing queue "%": names differing only in case share tables',
                queue_name, existing.queue_name
                USING ERRCODE = 'PB004',
                      HINT = format('Use the existing name %L.', existing.queue_name);
        END IF;
        -- create is idempotent; pgmq's names, in pgmq's order (its index on
        -- the archive is named with the name as given, not lower-cased).
        FOREACH relation IN ARRAY ARRAY[qtable, atable, qtable || '_vt_idx', 'archived_at_idx_' || queue_name] LOOP
            RAISE NOTICE 'relation "%" already exists, skipping', relation USING ERRCODE = 'duplicate_table';
        END LOOP;
        RETURN;
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

-- Create a plain queue, as pgmq.create does (pgmq's explicit name for it).
-- Errors: pgmq's on a bad name (pgbroker code PB001); PB004 for a name that
--   differs from an existing one only in case.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.create_non_partitioned(queue_name TEXT)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._create_queue(queue_name, false);
END;
$$;

-- Create a plain queue whose tables are UNLOGGED: faster sends, lost on a crash.
-- Errors: pgmq's on a bad name (pgbroker code PB001); PB004 for a name that
--   differs from an existing one only in case.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.create_unlogged(queue_name TEXT)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._create_queue(queue_name, true);
END;
$$;

-- Create a plain queue: its message and archive tables and its meta row; a
-- repeat for an existing queue does nothing.
-- Errors: pgmq's on a bad name (pgbroker code PB001); PB004 for a name that
--   differs from an existing one only in case.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq."create"(queue_name TEXT)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._create_queue(queue_name, false);
END;
$$;

-- Drop a queue's tables and its meta row; false (with a NOTICE, as pgmq) when
-- there is no such queue. Deleting the meta row cascades to every table that
-- refers to the queue, removes its pg_partman configuration (76_partitions.sql)
-- and rewrites the routes (90_routes.sql).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.drop_queue(queue_name TEXT)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
DECLARE
    stored_name text;
BEGIN
    -- pgmq checks only the characters: any other name it cannot find is a
    -- NOTICE and false.
    PERFORM pgbroker._pgmq_check_characters(queue_name);
    PERFORM pgbroker._queue_turn(queue_name);
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

CREATE OR REPLACE FUNCTION pgmq.drop_queue(queue_name TEXT, partitioned BOOLEAN)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._pgmq_check_characters(queue_name);  -- before the warning, as in pgmq
    RAISE WARNING 'drop_queue(queue_name, partitioned) is deprecated and will be removed in PGMQ v2.0. '
                  'Use drop_queue(queue_name) instead';
    PERFORM pgmq.drop_queue(queue_name);
    RETURN true;
END;
$$;

-- Delete every message of a queue (not its archive); returns how many.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.purge_queue(queue_name TEXT)
RETURNS BIGINT LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
    purged bigint;
BEGIN
    -- Lock first so that the count is exactly what TRUNCATE removes.
    EXECUTE format('LOCK TABLE pgmq.%I IN ACCESS EXCLUSIVE MODE', qtable);
    EXECUTE format('SELECT count(*) FROM pgmq.%I', qtable) INTO purged;
    EXECUTE format('TRUNCATE TABLE pgmq.%I', qtable);
    RETURN purged;
END;
$$;

-- Every queue, by name.
-- Returns: one pgmq.queue_record per queue (name, partitioned, unlogged, created_at).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.list_queues()
RETURNS SETOF pgmq.queue_record LANGUAGE sql STABLE AS $$
    SELECT queue_name, is_partitioned, is_unlogged, created_at FROM pgmq.meta ORDER BY queue_name;
$$;
