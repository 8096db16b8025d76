-- pgbroker migration 0015: pgmq's failures, and pgmq's '#' in topic patterns.
--
-- pgmq's contract includes its failures: pgmq clients and tests catch
-- SQLSTATEs and match message texts. Until now the functions of schema pgmq
-- raised pgbroker's own codes (class PB) and texts; from here they raise
-- what pgmq 1.13 raises, in pgmq's order of checks: P0001 with pgmq's
-- message for its RAISEs, 42P01 'relation "pgmq.q_<name>" does not exist'
-- for a missing queue, 22004 for a NULL name where pgmq formats it, 2201W
-- for a negative qty, and pgmq's notices and warnings (the 'already exists,
-- skipping' notices of a repeated create, the deprecation warnings of
-- drop_queue(q, b) and detach_archive, the notices of
-- convert_archive_partitioned and notify, ...). pgbroker's code and hint
-- ride in DETAIL ('pgbroker PB002: queue "x" does not exist') and HINT;
-- pgbroker's client maps them back to its typed errors (errors.py). The
-- functions of schema pgbroker keep their class PB codes, and so do errors
-- pgmq does not have (see docs/compatibility.md).
--
-- Topics: a pattern's '#' now matches as pgmq's does ('orders.#' is
-- '^orders\..*$': at least one more word; '#.audit' misses 'audit'), and
-- compiled_regex is pgmq's. AMQP's "zero or more words" is an opt-in per
-- binding, pgbroker.bind_topic_amqp(pattern, queue_name), recorded in
-- pgbroker.topic_amqp_bindings. Bindings made before this migration were
-- made with AMQP's meaning, the only one pgbroker had: every one of them
-- whose pattern has a '#' word keeps it (it is recorded as an AMQP binding
-- here), so that an upgrade never changes where a message goes. To give one
-- pgmq's meaning: pgmq.unbind_topic, then pgmq.bind_topic.


CREATE FUNCTION pgbroker._pgmq_raise(message text, pb_code text, hint text DEFAULT NULL,
                                     explanation text DEFAULT NULL, sqlstate text DEFAULT 'P0001')
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION '%', message
        USING ERRCODE = sqlstate,
              DETAIL = 'pgbroker ' || pb_code || coalesce(': ' || explanation, ''),
              HINT = coalesce(hint, '');
END;
$$;

CREATE FUNCTION pgbroker._pgmq_check_characters(queue_name text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF queue_name ~ '\$|;|--|''' THEN
        PERFORM pgbroker._pgmq_raise('queue name contains invalid characters: $, ;, --, or \''',
            'PB001', 'Use letters, digits, _ and - only.', 'invalid queue name ' || quote_literal(queue_name));
    END IF;
END;
$$;

CREATE FUNCTION pgbroker._pgmq_check_length(queue_name text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF length(queue_name) > 47 THEN
        PERFORM pgbroker._pgmq_raise('queue name is too long, maximum length is 47 characters', 'PB001',
            'Table names are q_<name> and a_<name>, and identifiers stop at 63 bytes.',
            format('queue name of %s characters', length(queue_name)));
    END IF;
END;
$$;

CREATE FUNCTION pgbroker._pgmq_no_queue(queue_name text, prefix text DEFAULT 'q')
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    code text := 'PB002';
    explanation text := format('queue "%s" does not exist', queue_name);
    hint text := format('Create it first: SELECT pgmq.create(%L); or: pgbroker create %s', queue_name, queue_name);
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

CREATE FUNCTION pgbroker._pgmq_table(queue_name text, prefix text DEFAULT 'q')
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgmq.meta m WHERE lower(m.queue_name) = lower(_pgmq_table.queue_name)) THEN
        PERFORM pgbroker._pgmq_no_queue(queue_name, prefix);
    END IF;
    RETURN lower(prefix || '_' || queue_name);
END;
$$;

CREATE FUNCTION pgbroker._pgmq_check(ok boolean, message text, hint text DEFAULT NULL, pb_code text DEFAULT 'PB007')
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF ok IS NOT TRUE THEN
        PERFORM pgbroker._pgmq_raise(message, pb_code, hint);
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.validate_queue_name(queue_name TEXT)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._pgmq_check_length(queue_name);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.format_table_name(queue_name text, prefix text)
RETURNS TEXT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._pgmq_check_characters(queue_name);
    RETURN lower(prefix || '_' || queue_name);
END;
$$;

CREATE FUNCTION pgbroker._check_new_name(queue_name text)
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
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.queue:' || lower(queue_name)));

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

CREATE OR REPLACE FUNCTION pgmq.drop_queue(queue_name TEXT)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
DECLARE
    stored_name text;
BEGIN
    -- pgmq checks only the characters: any other name it cannot find is a
    -- NOTICE and false.
    PERFORM pgbroker._pgmq_check_characters(queue_name);
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

CREATE OR REPLACE FUNCTION pgbroker._check_batch(msgs jsonb[], headers jsonb[])
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgbroker._pgmq_check(msgs IS NOT NULL AND cardinality(msgs) > 0,
        'msgs cannot be NULL or empty', 'Pass at least one message.');
    PERFORM pgbroker._pgmq_check(headers IS NULL OR cardinality(headers) = cardinality(msgs),
        format('headers array length (%s) must match msgs array length (%s)',
               cardinality(headers), cardinality(msgs)),
        'Give one headers object per message, or none at all.');
END;
$$;

CREATE FUNCTION pgbroker._pgmq_check_read_args(vt integer, qty integer)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF qty < 0 THEN
        PERFORM pgbroker._pgmq_raise('LIMIT must not be negative', 'PB007',
            'qty is the largest number of messages to return.', format('qty must be >= 0, got %s', qty), '2201W');
    END IF;
    PERFORM pgbroker._check_read_args(vt, qty);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.delete(queue_name TEXT, msg_ids BIGINT[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
BEGIN
    RETURN QUERY EXECUTE format(
        'DELETE FROM pgmq.%I WHERE msg_id = ANY($1) RETURNING msg_id', qtable)
    USING msg_ids;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.archive(queue_name TEXT, msg_ids BIGINT[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
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

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name TEXT, msg_ids BIGINT[], vt TIMESTAMP WITH TIME ZONE)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
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

CREATE OR REPLACE FUNCTION pgbroker._read_grouped(queue_name text, vt integer, qty integer, mode text)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
    candidates bigint[];
    owned bigint[];
    remaining integer := qty;
    got bigint;
BEGIN
    IF mode = 'rr' AND qty < 0 THEN
        -- pgmq's round robin compares a row number with qty: nothing to read.
        PERFORM pgbroker._check_read_args(vt, 0);
        RETURN;
    END IF;
    PERFORM pgbroker._pgmq_check_read_args(vt, qty);
    IF qty = 0 THEN
        RETURN;
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
        END IF;
    ELSE
        RAISE EXCEPTION 'unknown grouped read mode %', quote_literal(mode) USING ERRCODE = 'PB007';
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.create_fifo_index(queue_name TEXT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
BEGIN
    -- The lock create/drop take for this name: two concurrent calls would
    -- otherwise race on IF NOT EXISTS and one would fail on the catalog.
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.queue:' || lower(queue_name)));
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

CREATE OR REPLACE FUNCTION pgbroker._check_topic_text(what text, value text, charset text, allowed text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    hint text := CASE what
        WHEN 'routing_key' THEN 'A routing key is words joined by dots, for example ''orders.eu.created''.'
        ELSE 'A pattern is words joined by dots; a word may be * (one word) or # (zero or more words), '
             'for example ''orders.*.created'' or ''orders.#''.'
    END;
BEGIN
    PERFORM pgbroker._pgmq_check(value IS NOT NULL AND value <> '',
        format('%s cannot be NULL or empty', what), hint);
    PERFORM pgbroker._pgmq_check(length(value) <= 255,
        format('%s length cannot exceed 255 characters, got %s characters', what, length(value)), hint);
    PERFORM pgbroker._pgmq_check(value ~ ('^[' || charset || ']+$'),
        format('%s contains invalid characters. Only %s are allowed. Got: %s', what, allowed, value), hint);
    PERFORM pgbroker._pgmq_check(value !~ '^\.',
        format('%s cannot start with a dot. Got: %s', what, value), hint);
    PERFORM pgbroker._pgmq_check(value !~ '\.$',
        format('%s cannot end with a dot. Got: %s', what, value), hint);
    PERFORM pgbroker._pgmq_check(value !~ '\.\.',
        format('%s cannot contain consecutive dots. Got: %s', what, value), hint);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.validate_topic_pattern(pattern text)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    hint text := 'Separate wildcards with dots: ''*.*'' is two words, ''#'' alone already matches any number.';
BEGIN
    PERFORM pgbroker._check_topic_text('pattern', pattern, 'a-zA-Z0-9._*#-',
        'alphanumeric, dots, hyphens, underscores, *, and #');
    PERFORM pgbroker._pgmq_check(pattern !~ '\*\*',
        format('pattern cannot contain consecutive stars (**). Use # for multi-segment matching. Got: %s', pattern),
        hint);
    PERFORM pgbroker._pgmq_check(pattern !~ '##',
        format('pattern cannot contain consecutive hashes (##). A single # already matches zero or more segments. Got: %s',
               pattern),
        hint);
    PERFORM pgbroker._pgmq_check(pattern !~ '\*#|#\*',
        format('pattern cannot contain adjacent wildcards (*# or #*). Separate wildcards with dots. Got: %s', pattern),
        hint);
    RETURN true;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker._topic_regex(pattern text)
RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT '^' || replace(replace(replace(pattern, '.', '\.'), '*', '[^.]+'), '#', '.*') || '$';
$$;

CREATE FUNCTION pgbroker._topic_regex_amqp(pattern text)
RETURNS text LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    words text[] := string_to_array(pattern, '.');
    lead integer := 0;
    re text;
    i integer;
BEGIN
    WHILE lead < cardinality(words) AND words[lead + 1] = '#' LOOP
        lead := lead + 1;
    END LOOP;
    IF lead = cardinality(words) THEN
        RETURN '^.*$';  -- only '#' words: every key
    END IF;
    re := repeat('(?:[^.]+\.)*', lead) || replace(replace(words[lead + 1], '*', '[^.]+'), '#', '.*');
    FOR i IN lead + 2 .. cardinality(words) LOOP
        re := re || CASE WHEN words[i] = '#' THEN '(?:\.[^.]+)*'
                         ELSE '\.' || replace(replace(words[i], '*', '[^.]+'), '#', '.*') END;
    END LOOP;
    RETURN '^' || re || '$';
END;
$$;

-- The bindings whose '#' is AMQP's (zero or more words), with the regex they
-- match by instead of pgmq's. Unbinding or dropping the queue removes the row.
CREATE TABLE pgbroker.topic_amqp_bindings (
    pattern text NOT NULL,
    queue_name text NOT NULL,
    compiled_regex text GENERATED ALWAYS AS (pgbroker._topic_regex_amqp(pattern)) STORED,
    PRIMARY KEY (pattern, queue_name),
    CONSTRAINT topic_amqp_bindings_binding_fkey FOREIGN KEY (pattern, queue_name)
        REFERENCES pgmq.topic_bindings (pattern, queue_name) ON DELETE CASCADE ON UPDATE CASCADE
);

-- Every binding with the regex it matches by: pgmq's, or AMQP's for the
-- bindings that opted in.
CREATE VIEW pgbroker.topic_routes AS
    SELECT b.pattern, b.queue_name, b.bound_at, coalesce(a.compiled_regex, b.compiled_regex) AS compiled_regex,
           a.pattern IS NOT NULL AS amqp
    FROM pgmq.topic_bindings b
    LEFT JOIN pgbroker.topic_amqp_bindings a ON a.pattern = b.pattern AND a.queue_name = b.queue_name;

-- Bindings made so far had AMQP's '#': those with a '#' word keep it.
INSERT INTO pgbroker.topic_amqp_bindings (pattern, queue_name)
SELECT b.pattern, b.queue_name FROM pgmq.topic_bindings b
WHERE b.pattern ~ '(^|\.)#(\.|$)';
-- compiled_regex is stored: compute it again with pgmq's compilation.
UPDATE pgmq.topic_bindings SET pattern = pattern;

-- Its rows now carry the regex each binding matches by.
DROP FUNCTION pgbroker._topic_matches(text);
CREATE FUNCTION pgbroker._topic_matches(routing_key text)
RETURNS SETOF pgbroker.topic_routes LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    RETURN QUERY SELECT * FROM pgbroker.topic_routes b WHERE routing_key ~ b.compiled_regex;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.bind_topic(pattern text, queue_name text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmq.validate_topic_pattern(pattern);
    PERFORM pgbroker._pgmq_check(queue_name IS NOT NULL AND queue_name <> '',
        'queue_name cannot be NULL or empty', 'Name the queue the pattern routes to.', 'PB001');
    IF pgbroker._stored_name(queue_name) IS NULL THEN
        PERFORM pgbroker._pgmq_raise(
            format('Queue "%s" does not exist. Create the queue first using pgmq.create()', queue_name), 'PB002',
            format('Create it first: SELECT pgmq.create(%L);', queue_name));
    END IF;
    -- Store the queue's own spelling: names are found in any case, and the
    -- foreign key (for the cascade on drop) compares exactly.
    INSERT INTO pgmq.topic_bindings (pattern, queue_name)
    SELECT bind_topic.pattern, m.queue_name FROM pgmq.meta m
    WHERE lower(m.queue_name) = lower(bind_topic.queue_name)
    ON CONFLICT ON CONSTRAINT topic_bindings_pattern_queue_name_key DO NOTHING;
END;
$$;

CREATE FUNCTION pgbroker.bind_topic_amqp(pattern text, queue_name text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmq.bind_topic(pattern, queue_name);
    INSERT INTO pgbroker.topic_amqp_bindings (pattern, queue_name)
    SELECT bind_topic_amqp.pattern, pgbroker._stored_name(bind_topic_amqp.queue_name)
    ON CONFLICT DO NOTHING;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.unbind_topic(pattern text, queue_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._pgmq_check(pattern IS NOT NULL AND pattern <> '', 'pattern cannot be NULL or empty',
        'Give the pattern as it was bound (pgmq.list_topic_bindings).');
    PERFORM pgbroker._pgmq_check(queue_name IS NOT NULL AND queue_name <> '', 'queue_name cannot be NULL or empty',
        'Name the queue the pattern is bound to.', 'PB001');
    DELETE FROM pgmq.topic_bindings b
    WHERE b.pattern = unbind_topic.pattern AND lower(b.queue_name) = lower(unbind_topic.queue_name);
    RETURN FOUND;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.list_topic_bindings()
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE AS $$
    SELECT b.pattern, b.queue_name, b.bound_at, b.compiled_regex
    FROM pgbroker.topic_routes b
    ORDER BY b.bound_at DESC, b.pattern, b.queue_name;
$$;

CREATE OR REPLACE FUNCTION pgmq.list_topic_bindings(queue_name text)
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE AS $$
    SELECT b.pattern, b.queue_name, b.bound_at, b.compiled_regex
    FROM pgbroker.topic_routes b
    WHERE lower(b.queue_name) = lower(list_topic_bindings.queue_name)
    ORDER BY b.bound_at DESC, b.pattern;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, headers jsonb, delay integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    reached integer;
BEGIN
    -- Checked in pgmq's order, and before any binding is looked at: a bad
    -- call fails whether or not a queue is bound yet.
    PERFORM pgmq.validate_routing_key(routing_key);
    PERFORM pgbroker._pgmq_check(msg IS NOT NULL, 'msg cannot be NULL',
        'Send a JSON value; ''null''::jsonb is one.');
    PERFORM pgbroker._pgmq_check(coalesce(delay >= 0, true), format('delay cannot be negative, got: %s', delay),
        'delay is how long a sent message stays invisible.');
    SELECT count(*) INTO reached
    FROM pgbroker._send_topic(routing_key, ARRAY[msg], ARRAY[headers], pgbroker._delay_to_time(delay));
    RETURN reached;
END;
$$;

CREATE FUNCTION pgbroker._notify_trigger_exists(qtable text)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = format('pgmq.%I', qtable)::regclass AND tgname = 'pgbroker_notify_insert');
$$;

CREATE FUNCTION pgbroker._pgmq_no_trigger_notice(qtable text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE NOTICE 'trigger "trigger_notify_queue_insert_listeners" for relation "pgmq.%" does not exist, skipping',
        qtable;
END;
$$;

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
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.queue:' || lower(queue_name)));
    stored := pgbroker._stored_name(queue_name);
    IF stored IS NULL THEN
        PERFORM pgbroker._pgmq_raise(
            format('Queue "%s" does not exist. Create it first using pgmq.create()', queue_name), 'PB002',
            format('Create it first: SELECT pgmq.create(%L);', queue_name));
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
            'FOR EACH STATEMENT EXECUTE FUNCTION pgbroker._notify_insert(%L, %L)',
            qtable, stored, pgbroker.notify_channel(stored));
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.disable_notify_insert(queue_name text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    stored text;
BEGIN
    PERFORM pgbroker._pgmq_check_characters(queue_name);
    IF queue_name IS NULL THEN
        PERFORM pgbroker._pgmq_no_queue(queue_name);
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.queue:' || lower(queue_name)));
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
            format('Create it first: SELECT pgmq.create(%L);', queue_name));
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

CREATE FUNCTION pgbroker._pgmq_partman_missing(message text, sqlstate text)
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    explanation text := 'pg_partman is not created in this database';
    hint text;
BEGIN
    BEGIN
        PERFORM pgbroker._partman();
    EXCEPTION WHEN SQLSTATE 'PB008' THEN
        GET STACKED DIAGNOSTICS explanation = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT;
    END;
    PERFORM pgbroker._pgmq_raise(message, 'PB008', hint, explanation, sqlstate);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.create_partitioned(
    queue_name TEXT,
    partition_interval TEXT DEFAULT '10000',
    retention_interval TEXT DEFAULT '100000',
    premake INTEGER DEFAULT 4
)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    qtable text := lower('q_' || queue_name);
    atable text := lower('a_' || queue_name);
    spec record;
    pm pgbroker.partman;
    qcol text;
    acol text;
    existing pgmq.meta;
BEGIN
    -- pgmq's checks in pgmq's order (the name's characters and length,
    -- pg_partman, premake, then a NULL name cannot be formatted), with its
    -- errors (0015); then pgbroker's own.
    PERFORM pgbroker._pgmq_check_characters(queue_name);
    PERFORM pgbroker._pgmq_check_length(queue_name);
    IF NOT EXISTS (SELECT 1 FROM pg_extension e WHERE e.extname = 'pg_partman') THEN
        PERFORM pgbroker._pgmq_partman_missing('pg_partman is required for partitioned queues', 'P0001');
    END IF;
    PERFORM pgbroker._pgmq_check(premake >= 1,
        format('premake must be at least 1, got %s', coalesce(premake::text, '<NULL>')),
        'premake is how many partitions are kept ready ahead of the current one.');
    PERFORM pgbroker._check_new_name(queue_name);
    IF position('.' IN queue_name) > 0 THEN
        RAISE EXCEPTION 'queue name contains a period, which pg_partman does not support (got %)',
            quote_literal(queue_name)
            USING ERRCODE = 'PB001',
                  HINT = 'Partitioned queue names may use letters, digits, _ and - only.';
    END IF;
    spec := pgbroker._partition_spec(partition_interval, retention_interval);
    pm := pgbroker._partman();

    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.queue:' || lower(queue_name)));
    SELECT * INTO existing FROM pgmq.meta m WHERE lower(m.queue_name) = lower(create_partitioned.queue_name);
    IF FOUND THEN
        IF existing.queue_name <> queue_name THEN
            RAISE EXCEPTION 'queue "%" conflicts with existing queue "%": names differing only in case share tables',
                queue_name, existing.queue_name
                USING ERRCODE = 'PB004',
                      HINT = format('Use the existing name %L.', existing.queue_name);
        END IF;
        IF NOT existing.is_partitioned THEN
            RAISE EXCEPTION 'queue "%" already exists and is not partitioned', queue_name
                USING ERRCODE = 'PB007',
                      HINT = 'Drop it first (pgmq.drop_queue) or use another name; '
                             'pgmq.convert_archive_partitioned partitions only its archive.';
        END IF;
        RETURN;  -- idempotent, like create
    END IF;

    qcol := CASE WHEN spec.by_id THEN 'msg_id' ELSE 'enqueued_at' END;
    acol := CASE WHEN spec.by_id THEN 'msg_id' ELSE 'archived_at' END;

    EXECUTE format(
        $Q$
        CREATE TABLE pgmq.%1$I (
            msg_id BIGINT GENERATED BY DEFAULT AS IDENTITY,
            read_ct INT DEFAULT 0 NOT NULL,
            enqueued_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
            last_read_at TIMESTAMP WITH TIME ZONE,
            vt TIMESTAMP WITH TIME ZONE NOT NULL,
            message JSONB,
            headers JSONB,
            PRIMARY KEY (%2$s)
        ) PARTITION BY RANGE (%3$I)
        $Q$, qtable, CASE WHEN spec.by_id THEN 'msg_id' ELSE 'msg_id, enqueued_at' END, qcol);
    EXECUTE format(
        'CREATE INDEX %I ON pgmq.%I (msg_id) WHERE read_ct = 0 AND vt <= enqueued_at',
        qtable || '_ready_idx', qtable);
    EXECUTE format(
        'CREATE INDEX %I ON pgmq.%I (vt) WHERE NOT (read_ct = 0 AND vt <= enqueued_at)',
        qtable || '_vt_idx', qtable);

    EXECUTE format(
        $Q$
        CREATE TABLE pgmq.%1$I (
            msg_id BIGINT NOT NULL,
            read_ct INT DEFAULT 0 NOT NULL,
            enqueued_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
            last_read_at TIMESTAMP WITH TIME ZONE,
            archived_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
            vt TIMESTAMP WITH TIME ZONE NOT NULL,
            message JSONB,
            headers JSONB,
            PRIMARY KEY (%2$s)
        ) PARTITION BY RANGE (%3$I)
        $Q$, atable, CASE WHEN spec.by_id THEN 'msg_id' ELSE 'msg_id, archived_at' END, acol);
    EXECUTE format('CREATE INDEX %I ON pgmq.%I (archived_at)', 'archived_at_idx_' || lower(queue_name), atable);

    PERFORM pgbroker._partman_create_parent(pm, 'pgmq.' || qtable, qcol, spec.part_interval, premake);
    PERFORM pgbroker._partman_create_parent(pm, 'pgmq.' || atable, acol, spec.part_interval, premake);
    -- pg_partman only creates queue partitions (no retention: see the header).
    -- infinite_time_partitions: keep making time partitions while the table is empty.
    EXECUTE format(
        $Q$
        UPDATE %I.part_config
        SET retention = CASE WHEN parent_table = $2 THEN $3 END,
            retention_keep_table = false,
            retention_keep_index = false,
            infinite_time_partitions = true,
            automatic_maintenance = 'on'
        WHERE parent_table IN ($1, $2)
        $Q$, pm.schema_name)
    USING 'pgmq.' || qtable, 'pgmq.' || atable, spec.retention;

    INSERT INTO pgmq.meta (queue_name, is_partitioned, is_unlogged)
    VALUES (queue_name, true, false);
    INSERT INTO pgbroker.partition_retention (queue_name, retention)
    VALUES (queue_name, spec.retention);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.convert_archive_partitioned(
    table_name TEXT,
    partition_interval TEXT DEFAULT '10000',
    retention_interval TEXT DEFAULT '100000',
    leading_partition INT DEFAULT 10
)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    qtable text;
    atable text;
    old_table text;
    stored text;
    spec record;
    pm pgbroker.partman;
    col text;
    kind "char";
    idx record;
    left_over boolean;
    last_id bigint;
    first_id bigint;
    old_index text;
BEGIN
    -- pgmq's checks, notices and errors first, in its order (0015). Its
    -- notices print the table name followed by a stray 's'.
    PERFORM pgbroker._pgmq_check_characters(table_name);
    IF table_name IS NULL THEN
        PERFORM pgbroker._pgmq_raise('null values cannot be formatted as an SQL identifier', 'PB001',
            'Name the queue whose archive to partition.', 'queue name must not be NULL', '22004');
    END IF;
    SELECT m.queue_name INTO stored FROM pgmq.meta m WHERE lower(m.queue_name) = lower(table_name);
    IF NOT FOUND THEN
        RAISE NOTICE 'Table %s does not exists', lower('a_' || table_name);
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.queue:' || lower(stored)));
    qtable := lower('q_' || stored);
    atable := lower('a_' || stored);
    old_table := left(atable, 59) || '_old';
    SELECT c.relkind INTO kind FROM pg_class c WHERE c.oid = to_regclass(format('pgmq.%I', atable));
    IF kind = 'p' THEN
        RAISE NOTICE 'Table %s is already partitioned', atable;
        RETURN;
    END IF;
    PERFORM pgbroker._check_arg(kind = 'r',
        format('queue "%s" has no archive table pgmq.%s to partition', stored, atable));
    -- pgmq renames the archive's index to archived_at_idx_<name>_old, an
    -- unquoted identifier that Postgres truncates to 63 bytes with a notice;
    -- for a name of 47 characters the truncated name is the index's own, and
    -- pgmq fails. pgbroker names its indexes otherwise, and gives the same
    -- notice and the same failure, so that a conversion pgmq refuses is
    -- refused here too.
    old_index := lower('archived_at_idx_' || table_name || '_old');
    IF octet_length(old_index) > 63 THEN
        RAISE NOTICE 'identifier "%" will be truncated to "%"', old_index, old_index::name
            USING ERRCODE = 'name_too_long';
        IF old_index::name = lower('archived_at_idx_' || table_name) THEN
            PERFORM pgbroker._pgmq_raise(format('relation "%s" already exists', old_index::name), 'PB001',
                'Partition the archive of a queue whose name has at most 46 characters.',
                format('pgmq cannot partition the archive of queue "%s": its name has 47 characters', stored),
                '42P07');
        END IF;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_extension e WHERE e.extname = 'pg_partman') THEN
        -- pgmq formats pg_partman's schema, NULL, as an identifier.
        PERFORM pgbroker._pgmq_partman_missing('null values cannot be formatted as an SQL identifier', '22004');
    END IF;
    PERFORM pgbroker._check_arg(leading_partition IS NOT NULL AND leading_partition >= 1,
        format('leading_partition must be at least 1, got %s', coalesce(leading_partition::text, 'NULL')),
        'leading_partition is how many partitions are kept ready ahead of the current one.');
    spec := pgbroker._partition_spec(partition_interval, retention_interval);
    pm := pgbroker._partman();
    PERFORM pgbroker._check_arg(to_regclass(format('pgmq.%I', old_table)) IS NULL,
        format('cannot convert the archive of queue "%s": a table pgmq.%s is in the way', stored, old_table),
        'Rename or drop that table first.');

    col := CASE WHEN spec.by_id THEN 'msg_id' ELSE 'archived_at' END;
    EXECUTE format('LOCK TABLE pgmq.%I IN ACCESS EXCLUSIVE MODE', atable);
    EXECUTE format('ALTER TABLE pgmq.%I RENAME TO %I', atable, old_table);
    -- Free the index names (the primary key's too) for the new table.
    FOR idx IN
        SELECT i.indexrelid::regclass AS name, row_number() OVER (ORDER BY i.indexrelid) AS n
        FROM pg_index i WHERE i.indrelid = format('pgmq.%I', old_table)::regclass
    LOOP
        EXECUTE format('ALTER INDEX %s RENAME TO %I', idx.name, left(old_table, 50) || '_idx' || idx.n);
    END LOOP;
    EXECUTE format(
        'CREATE TABLE pgmq.%I (LIKE pgmq.%I INCLUDING DEFAULTS INCLUDING GENERATED INCLUDING STORAGE '
        'INCLUDING COMMENTS, PRIMARY KEY (%s)) PARTITION BY RANGE (%I)',
        atable, old_table, CASE WHEN spec.by_id THEN 'msg_id' ELSE 'msg_id, archived_at' END, col);
    EXECUTE format('CREATE INDEX %I ON pgmq.%I (archived_at)', 'archived_at_idx_' || lower(stored), atable);

    IF spec.by_id THEN
        last_id := pg_sequence_last_value(pg_get_serial_sequence(format('pgmq.%I', qtable), 'msg_id')::regclass);
        EXECUTE format('SELECT min(msg_id) FROM pgmq.%I', old_table) INTO first_id;
        PERFORM pgbroker._partman_create_parent(pm, 'pgmq.' || atable, col, spec.part_interval,
            leading_partition, coalesce(least(first_id, last_id), 0)::text);
    ELSE
        PERFORM pgbroker._partman_create_parent(pm, 'pgmq.' || atable, col, spec.part_interval,
            leading_partition);
    END IF;
    EXECUTE format(
        $Q$
        UPDATE %I.part_config
        SET retention = $2, retention_keep_table = false, retention_keep_index = false,
            infinite_time_partitions = true, automatic_maintenance = 'on'
        WHERE parent_table = $1
        $Q$, pm.schema_name)
    USING 'pgmq.' || atable, spec.retention;

    -- pg_partman moves the rows range by range, creating each range's partition.
    PERFORM pgbroker._partman_move_rows(pm, 'pgmq.' || atable, col, 'pgmq.' || old_table);
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM pgmq.%I)', old_table) INTO left_over;
    IF left_over THEN
        RAISE EXCEPTION 'converting the archive of queue "%" left rows in pgmq.%', stored, old_table;
    END IF;
    EXECUTE format('DROP TABLE pgmq.%I', old_table);
    IF spec.by_id THEN
        PERFORM pgbroker._partman_create_partitions(pm, 'pgmq.' || atable, ids => pgbroker._missing_id_partitions(
            'pgmq.' || atable, last_id, spec.part_interval::bigint, leading_partition));
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.detach_archive(queue_name TEXT)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING 'detach_archive(queue_name) is deprecated and is a no-op. It will be removed in PGMQ v2.0. '
                  'Archive tables are no longer member objects.';
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.metrics(queue_name TEXT)
RETURNS pgmq.metrics_result LANGUAGE plpgsql AS $$
DECLARE
    qtable text := pgbroker._pgmq_table(queue_name);
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

CREATE OR REPLACE FUNCTION pgbroker._write_routes()
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
-- Routes are compiled by the sessions that call them, not here.
SET check_function_bodies = off
SET search_path = pg_catalog, pg_temp AS $W$
DECLARE
    route_limit integer := coalesce(nullif(current_setting('pgbroker.route_limit', true), '')::integer, 128);
    keys text[];
    names text[];
    tables text[];
    max_depths bigint[];
    max_deliveries integer[];
    archives boolean[];
    send_bodies text[] := '{}';
    read_bodies text[] := '{}';
    deliver_bodies text[] := '{}';
    pop_bodies text[] := '{}';
    ack_bodies text[] := '{}';
    read_params constant text[] := ARRAY['p_qty', 'NULL::jsonb', 'r_clock', 'p_vt', 'r_from'];
    pop_params constant text[] := ARRAY['p_qty', 'NULL::jsonb', 'r_clock', 'NULL::integer', 'r_from'];
    ack_params constant text[] := ARRAY['r_held.msg_ids', 'r_held.read_cts', 'r_held.leases'];
    send_params constant text[] := ARRAY['p_msgs', 'p_headers', 'p_delay'];
    qtable text;
    op text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.routes'));
    SELECT coalesce(array_agg(lower(s.queue_name) ORDER BY s.n), '{}'),
           coalesce(array_agg(s.queue_name ORDER BY s.n), '{}'),
           coalesce(array_agg(lower('q_' || s.queue_name) ORDER BY s.n), '{}'),
           coalesce(array_agg(s.max_depth ORDER BY s.n), '{}'),
           coalesce(array_agg(s.max_deliveries ORDER BY s.n), '{}'),
           coalesce(array_agg(coalesce(s.ack_mode, 'archive') = 'archive' ORDER BY s.n), '{}')
    INTO keys, names, tables, max_depths, max_deliveries, archives
    FROM (SELECT m.queue_name, p.max_depth, p.max_deliveries, p.ack_mode,
                 row_number() OVER (ORDER BY m.created_at, m.queue_name) AS n
          FROM pgmq.meta m LEFT JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
          ORDER BY m.created_at, m.queue_name
          LIMIT greatest(route_limit, 0)) s;

    FOREACH qtable IN ARRAY tables LOOP
        send_bodies := send_bodies || format(
            E'IF cardinality(p_msgs) = 1 THEN\nRETURN QUERY %s;\nELSE\nRETURN QUERY %s;\nEND IF;',
            pgbroker._route_statement(pgbroker._send_insert_sql(qtable, true), send_params),
            pgbroker._route_statement(pgbroker._send_insert_sql(qtable, false), send_params));
        read_bodies := read_bodies || format('RETURN QUERY %s;',
            pgbroker._route_statement(pgbroker._statement_query(qtable, 'read'), read_params));
        deliver_bodies := deliver_bodies || format('RETURN QUERY %s;',
            pgbroker._route_statement(pgbroker._statement_query(qtable, 'deliver'), read_params));
        pop_bodies := pop_bodies || format('RETURN QUERY %s;',
            pgbroker._route_statement(pgbroker._statement_query(qtable, 'pop'), pop_params));
        ack_bodies := ack_bodies || format(E'IF r_archive THEN\nRETURN QUERY %s;\nELSE\nRETURN QUERY %s;\nEND IF;',
            pgbroker._route_statement(pgbroker._statement_query(qtable, 'ack_a'), ack_params),
            pgbroker._route_statement(pgbroker._statement_query(qtable, 'ack_d'), ack_params));
    END LOOP;

    -- Sends: as 0012's _send_sql and _send_many (checks in the same order).
    EXECUTE format($R$
CREATE OR REPLACE FUNCTION pgbroker._route_send(p_queue_name text, p_msgs jsonb[], p_headers jsonb[],
                                                p_delay timestamptz)
RETURNS SETOF bigint LANGUAGE plpgsql AS $F$
DECLARE
    r integer := array_position(%1$L::text[], lower(p_queue_name));
    r_queue record;
    r_name text;
    r_max_depth bigint;
    r_size bigint;
BEGIN
    -- The batch first, then the queue: pgmq's order (0015).
    IF p_msgs IS NULL OR cardinality(p_msgs) = 0
       OR (p_headers IS NOT NULL AND cardinality(p_headers) <> cardinality(p_msgs)) THEN
        PERFORM pgbroker._check_batch(p_msgs, p_headers);
    END IF;
    IF r IS NULL THEN
        SELECT * INTO r_queue FROM pgbroker._queue(p_queue_name);
        IF NOT FOUND THEN
            PERFORM pgbroker._pgmq_no_queue(p_queue_name);  -- pgmq's 42P01, pgbroker's code in DETAIL
        END IF;
        r_name := r_queue.stored_name;
        r_max_depth := r_queue.max_depth;
    ELSE
        r_name := (%2$L::text[])[r];
        r_max_depth := (%3$L::bigint[])[r];
    END IF;
    -- A message's size counts its headers too: both are stored in its row.
    IF cardinality(p_msgs) = 1 THEN
        r_size := pg_column_size(p_msgs[1]) + coalesce(pg_column_size(p_headers[1]), 0);
    ELSE
        SELECT max(pg_column_size(m.msg) + coalesce(pg_column_size(m.hdr), 0)) INTO r_size
        FROM unnest(p_msgs, p_headers) AS m(msg, hdr);
    END IF;
    -- Without pgbroker.max_message_bytes the limit is 1 MiB (pgbroker._check_message_size).
    IF r_size > 1048576 OR coalesce(current_setting('pgbroker.max_message_bytes', true), '') <> '' THEN
        PERFORM pgbroker._check_message_size(r_size);
    END IF;
    IF r_max_depth IS NOT NULL THEN
        PERFORM pgbroker._check_depth(r_name, lower('q_' || r_name), cardinality(p_msgs));
    END IF;
    -- The transaction id before the msg_ids: queue_head's advances rely on it.
    PERFORM pg_current_xact_id();
    IF r IS NULL THEN
        RETURN QUERY EXECUTE pgbroker._send_insert_sql(lower('q_' || r_name), cardinality(p_msgs) = 1)
            USING p_msgs, p_headers, p_delay;
        RETURN;
    END IF;
%4$s
END;
$F$
$R$, keys, names, max_depths, pgbroker._route_tree(send_bodies, 1, cardinality(send_bodies)));

    -- pgmq.read (_route_read) and pgbroker.read (_route_deliver), as in 0012.
    -- A conditional read takes the dynamic path; a deliver on a queue with
    -- max_deliveries goes through pgbroker._deliver, which dead-letters the
    -- over-delivered.
    FOREACH op IN ARRAY ARRAY['read', 'deliver'] LOOP
        EXECUTE format($R$
CREATE OR REPLACE FUNCTION pgbroker._route_%1$s(p_queue_name text, p_vt integer, p_qty integer,
                                                p_conditional jsonb)
RETURNS SETOF %2$s LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $F$
DECLARE
    r integer := array_position(%3$L::text[], lower(p_queue_name));
    r_dynamic constant boolean := r IS NULL OR NOT (p_conditional IS NULL OR p_conditional = '{}'::jsonb);
    r_queue record;
    r_name text;
    r_from bigint;
    r_clock timestamptz;
    r_max_deliveries integer;
BEGIN
    IF r_dynamic THEN
        SELECT * INTO r_queue FROM pgbroker._queue(p_queue_name);
        IF NOT FOUND THEN
            PERFORM %8$s(p_queue_name);
        END IF;
    END IF;
    IF p_vt IS NULL OR p_vt < 0 OR p_qty IS NULL OR p_qty < 0 THEN
        PERFORM %9$s(p_vt, p_qty);
    END IF;
    IF r_dynamic THEN
        r_from := r_queue.ready_from;
        r_name := r_queue.stored_name;
        r_max_deliveries := r_queue.max_deliveries;
    ELSE
        r_name := (%4$L::text[])[r];
        r_from := pgbroker._route_ready_from(r_name);
        r_max_deliveries := (%5$L::integer[])[r];
    END IF;
    IF %6$L AND r_max_deliveries IS NOT NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._deliver(r_name, r_from, r_max_deliveries, p_vt, p_qty,
                                                     p_conditional);
        RETURN;
    END IF;
    IF r_dynamic THEN
        RETURN QUERY EXECUTE pgbroker._run_read(r_name, r_from, p_vt, p_qty, p_conditional, %6$L);
        RETURN;
    END IF;
    r_clock := clock_timestamp();
%7$s
END;
$F$
$R$, op, CASE op WHEN 'read' THEN 'pgmq.message_record' ELSE 'pgbroker.delivery' END,
     keys, names, max_deliveries, op = 'deliver',
     CASE op WHEN 'read' THEN pgbroker._route_tree(read_bodies, 1, cardinality(read_bodies))
             ELSE pgbroker._route_tree(deliver_bodies, 1, cardinality(deliver_bodies)) END,
     -- A missing queue: pgmq's failure for pgmq.read, pgbroker's for pgbroker.read (0015).
     CASE op WHEN 'read' THEN 'pgbroker._pgmq_no_queue' ELSE 'pgbroker._table' END,
     CASE op WHEN 'read' THEN 'pgbroker._pgmq_check_read_args' ELSE 'pgbroker._check_read_args' END);
    END LOOP;

    -- pgmq.pop, as in 0012.
    EXECUTE format($R$
CREATE OR REPLACE FUNCTION pgbroker._route_pop(p_queue_name text, p_qty integer)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $F$
DECLARE
    r integer := array_position(%1$L::text[], lower(p_queue_name));
    r_queue record;
    r_name text;
    r_from bigint;
    r_clock timestamptz;
BEGIN
    IF r IS NULL THEN
        SELECT * INTO r_queue FROM pgbroker._queue(p_queue_name);
        IF NOT FOUND THEN
            PERFORM pgbroker._pgmq_no_queue(p_queue_name);
        END IF;
        r_name := r_queue.stored_name;
    ELSE
        r_name := (%2$L::text[])[r];
    END IF;
    IF p_qty IS NULL OR p_qty < 0 THEN
        PERFORM pgbroker._pgmq_check_read_args(0, p_qty);
    END IF;
    r_from := pgbroker._route_ready_from(r_name);
    IF r IS NULL THEN
        RETURN QUERY EXECUTE format('EXECUTE %%I(%%s, NULL, %%L, NULL, %%s)',
                                    pgbroker._prepared(lower('q_' || r_name), 'pop'), p_qty,
                                    clock_timestamp(), r_from);
        RETURN;
    END IF;
    r_clock := clock_timestamp();
%3$s
END;
$F$
$R$, keys, names, pgbroker._route_tree(pop_bodies, 1, cardinality(pop_bodies)));

    -- pgbroker.ack, as in 0012; with p_policy_mode a NULL archive means the
    -- queue policy's ack_mode (pgbroker.consume), otherwise it is an error.
    -- Like the reads, it advances the queue's bounds now and then, before it
    -- writes: only a transaction that has written nothing yet can record their
    -- candidates (0013), and in pgbroker.consume the ack writes first.
    EXECUTE format($R$
CREATE OR REPLACE FUNCTION pgbroker._route_ack(p_queue_name text, p_receipts text[], p_archive boolean,
                                               p_policy_mode boolean)
RETURNS SETOF bigint LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $F$
DECLARE
    r integer := array_position(%1$L::text[], lower(p_queue_name));
    r_queue record;
    r_name text;
    r_held record;
    r_archive boolean := p_archive;
BEGIN
    IF r IS NULL THEN
        SELECT * INTO r_queue FROM pgbroker._queue(p_queue_name);
        IF NOT FOUND THEN
            PERFORM pgbroker._table(p_queue_name);
        END IF;
        r_name := r_queue.stored_name;
    ELSE
        r_name := (%2$L::text[])[r];
    END IF;
    IF random() < 0.0625 THEN
        PERFORM pgbroker._advance_head(r_name, lower('q_' || r_name));
    END IF;
    r_held := pgbroker._held(p_receipts);
    IF r_archive IS NULL THEN
        IF NOT p_policy_mode THEN
            PERFORM pgbroker._check_arg(false, 'archive must be true or false, got NULL');
        END IF;
        IF r IS NULL THEN
            r_archive := coalesce(r_queue.ack_mode, 'archive') = 'archive';
        ELSE
            r_archive := (%3$L::boolean[])[r];
        END IF;
    END IF;
    IF r IS NULL THEN
        RETURN QUERY EXECUTE pgbroker._run_ack(lower('q_' || r_name), r_held.msg_ids, r_held.read_cts,
                                               r_held.leases, r_archive);
        RETURN;
    END IF;
%4$s
END;
$F$
$R$, keys, names, archives, pgbroker._route_tree(ack_bodies, 1, cardinality(ack_bodies)));
END;
$W$;

-- Replaced by pgmq's checks (enable_notify_insert, update_notify_insert).
DROP FUNCTION pgbroker._check_throttle(integer);

-- The routes' fallbacks now fail as pgmq does (pgmq.send, read, pop).
SELECT pgbroker._write_routes();
