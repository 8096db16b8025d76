-- pgbroker migration 0025: the SECURITY DEFINER paths trust nothing of the
-- caller's session (see sql/schema/, of which these are copies):
--   * the dynamic path of reads, pops and acks uses a session prepared
--     statement only with the session's own rights, and checks its text;
--     through a SECURITY DEFINER entry point it runs the query with its
--     values written in (pgbroker._statement_call, 50_reads.sql);
--   * pgbroker.max_message_bytes and pgbroker.route_limit are the
--     database's settings; a session's value may only make them stricter
--     (pgbroker._limit, 30_sends.sql);
--   * a send cannot carry the reserved x-pgbroker-* headers, except the job
--     headers (pgbroker._check_reserved_headers, 32_priorities.sql);
--   * prune windows are at least a minute, and a prune may name its queue;
--   * queue and stream names with whitespace are refused (PB001), and the
--     route writer no longer parses its statements, so an existing odd name
--     cannot break it;
--   * pg_monitor no longer reads message payloads unless the operator opts in
--     (pgbroker.grant_pg_monitor_payloads, 10_queues.sql).

-- Replaced (a new signature) or no longer used.
DROP FUNCTION pgbroker._send_many(text, jsonb[], jsonb[], timestamptz);
DROP FUNCTION pgbroker._prepared(text, text);
DROP FUNCTION pgbroker.prune_inbound_seen(interval, integer);
-- The route writer defines _route_send with a new argument: the old one goes first.
DROP FUNCTION pgbroker._route_send(text, jsonb[], jsonb[], timestamptz);

-- Let pg_monitor read every queue and archive table, payloads included, as
-- pgmq does (allowed), or take that back (not allowed: the default). Covers
-- the tables there are and, by default privileges, those that the role
-- calling this creates later (run it as the role that creates queues).
CREATE FUNCTION pgbroker.grant_pg_monitor_payloads(allowed boolean)
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
CREATE FUNCTION pgbroker._check_name_characters(name text, kind text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF name ~ '[[:space:][:cntrl:]\u00a0\u1680\u2000-\u200b\u2028\u2029\u202f\u205f\u3000\ufeff]' THEN
        RAISE EXCEPTION '% name contains whitespace or a control character (got %)', kind, quote_literal(name)
            USING ERRCODE = 'PB001',
                  HINT = 'Use letters, digits, _ and - only.';
    END IF;
END;
$$;

-- A limit's value given as text: a whole number, or PB007 naming the setting.
CREATE FUNCTION pgbroker._limit_number(name text, value text)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value !~ '^[0-9]{1,18}$' THEN
        RAISE EXCEPTION '% must be a whole number, got %', name, quote_literal(value)
            USING ERRCODE = 'PB007', HINT = 'Set it for the database: ALTER DATABASE ... SET ' || name || ' = ...';
    END IF;
    RETURN value::bigint;
END;
$$;

-- A limit's value (see above): the database's setting, fallback without one,
-- or the session's value where it is stricter: smaller, and, where 0 means
-- no limit (zero_means_none), positive. Every send asks for
-- max_message_bytes: one catalog probe, and no call for a value not set.
CREATE FUNCTION pgbroker._limit(name text, fallback bigint, zero_means_none boolean)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    database_text text;
    session_text constant text := nullif(current_setting(name, true), '');
    database_value bigint := fallback;
    session_value bigint;
BEGIN
    SELECT substr(c.setting, length(name) + 2) INTO database_text
    FROM pg_catalog.pg_db_role_setting s CROSS JOIN LATERAL pg_catalog.unnest(s.setconfig) AS c(setting)
    WHERE s.setrole = 0
      AND s.setdatabase = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
      AND pg_catalog.starts_with(c.setting, name || '=');
    IF database_text IS NOT NULL THEN
        database_value := pgbroker._limit_number(name, database_text);
    END IF;
    IF session_text IS NULL THEN
        RETURN database_value;
    END IF;
    session_value := pgbroker._limit_number(name, session_text);
    IF zero_means_none AND session_value = 0 THEN
        RETURN database_value;
    ELSIF zero_means_none AND database_value = 0 THEN
        RETURN session_value;
    END IF;
    RETURN least(database_value, session_value);
END;
$$;

-- Refuse a message larger than pgbroker.max_message_bytes (jsonb datum size,
-- bytes; 1 MiB by default, 0 for no limit), a limit as above.
CREATE OR REPLACE FUNCTION pgbroker._check_message_size(size bigint)
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    max_bytes constant bigint := pgbroker._limit('pgbroker.max_message_bytes', 1048576, true);
BEGIN
    IF max_bytes > 0 AND size > max_bytes THEN
        RAISE EXCEPTION 'message is too large: % bytes, the limit is % bytes', size, max_bytes
            USING ERRCODE = 'PB005',
                  HINT = 'Store large payloads elsewhere and send a reference, '
                         'or raise pgbroker.max_message_bytes for the database.';
    END IF;
END;
$$;

-- Send a batch to a queue; what every pgbroker function that sends (topics,
-- dead-letter replay, the bridge, schedules, stream retries) calls.
-- engine_headers: the engine's own sends (replay, schedules, stream retries),
-- which may carry reserved headers (pgbroker._check_reserved_headers).
CREATE FUNCTION pgbroker._send_many(queue_name text, msgs jsonb[], headers jsonb[], delay timestamptz,
                                    engine_headers boolean DEFAULT false)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers, delay, engine_headers);
END;
$$;

-- Headers named x-pgbroker-* are reserved: they carry the engine's state and
-- its record of what happened to a message (x-pgbroker-dead-letter, which
-- dead_letters, replay and purge trust; -schedule, -stream and -published,
-- which consumers key on). A sender may set only the job headers above
-- (priority, dedup key, concurrency key: inputs by design). A send through
-- any door carrying another reserved header is refused (PB007), not
-- stripped: a caller's bad input gets an error and changes nothing, and a
-- message is never stored other than as sent. Only the engine's own sends
-- (pgbroker._send_many with engine_headers: dead-letter replay, schedules,
-- stream retries) carry them. The names compare in any letter case.
CREATE FUNCTION pgbroker._check_reserved_headers(headers jsonb[])
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    reserved text;
BEGIN
    SELECT k INTO reserved
    FROM unnest(headers) h,
         jsonb_object_keys(CASE WHEN jsonb_typeof(h) = 'object' THEN h END) k
    WHERE starts_with(lower(k), 'x-pgbroker-')
      AND lower(k) NOT IN ('x-pgbroker-priority', 'x-pgbroker-dedup-key', 'x-pgbroker-concurrency-key')
    LIMIT 1;
    IF reserved IS NOT NULL THEN
        RAISE EXCEPTION 'header % is reserved for pgbroker itself', quote_ident(reserved)
            USING ERRCODE = 'PB007',
                  HINT = 'Of the x-pgbroker-* headers a sender may set only x-pgbroker-priority, '
                         'x-pgbroker-dedup-key and x-pgbroker-concurrency-key; rename the header.';
    END IF;
END;
$$;

-- The parameter types of op's statement (see above), in their order.
CREATE FUNCTION pgbroker._statement_types(op text)
RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN op IN ('ack_a', 'ack_d') THEN ARRAY['bigint[]', 'integer[]', 'bigint[]']
                ELSE ARRAY['integer', 'jsonb', 'timestamptz', 'integer', 'bigint'] END;
$$;

-- A queue's hot statement for op (see _statement_name), the query alone.
-- Every name in it is schema-qualified or pg_catalog's.
CREATE OR REPLACE FUNCTION pgbroker._statement_query(qtable text, op text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    atable text := 'a' || substr(qtable, 2);
    columns text := 'q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message, q.headers';
    prioritized constant boolean := op IN ('read_p', 'read_pc', 'deliver_p', 'deliver_pc', 'pop_p');
    result_order constant text := CASE WHEN prioritized THEN 'pgbroker._priority(headers) DESC, msg_id'
                                       ELSE 'msg_id' END;
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
                FROM picked WHERE q.msg_id = picked.msg_id
                RETURNING %3$s
            )
            SELECT *%4$s FROM leased ORDER BY %5$s
            $Q$,
            pgbroker._visible_from_sql(qtable, CASE WHEN op LIKE '%c' THEN '{"c": 1}'::jsonb END, prioritized),
            qtable, columns,
            CASE WHEN op LIKE 'deliver%' THEN ', pgbroker.receipt(msg_id, read_ct, vt)' ELSE '' END,
            result_order);
    ELSIF op IN ('pop', 'pop_p') THEN
        RETURN format(
            $Q$
            WITH %1$s,
            popped AS (
                DELETE FROM pgmq.%2$I q USING picked WHERE q.msg_id = picked.msg_id
                RETURNING %3$s
            )
            SELECT * FROM popped ORDER BY %4$s
            $Q$, pgbroker._visible_from_sql(qtable, NULL, prioritized), qtable, columns, result_order);
    ELSIF op IN ('ack_a', 'ack_d') THEN
        RETURN format(
            $Q$
            WITH removed AS (
                DELETE FROM pgmq.%1$I q
                WHERE q.msg_id = ANY($1)
                  AND (q.msg_id, q.read_ct, pgbroker._micros(q.vt)) IN (SELECT * FROM unnest($1, $2, $3))
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
            )$A$, atable) ELSE '' END);
    END IF;
    RAISE EXCEPTION 'pgbroker._statement_query: unknown operation %', quote_literal(op) USING ERRCODE = 'PB007';
END;
$$;

-- A queue's hot statement for op as PREPARE <name> (<types>) AS <query>.
CREATE OR REPLACE FUNCTION pgbroker._statement(qtable text, op text)
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN format('PREPARE %I (%s) AS %s', pgbroker._statement_name(qtable, op),
                  array_to_string(pgbroker._statement_types(op), ', '), pgbroker._statement_query(qtable, op));
END;
$$;

-- A queue's hot statement for op with its parameters bound to args (SQL
-- literals, one per parameter: quote_nullable), as the text to run; the
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
CREATE FUNCTION pgbroker._statement_call(qtable text, op text, VARIADIC args text[])
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
                                    quote_nullable(clock_timestamp()), quote_nullable(vt), quote_nullable(ready_from));
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
                                    quote_nullable(qty), NULL, quote_nullable(clock_timestamp()), NULL,
                                    quote_nullable(ready_from));
END;
$$;

-- Read (or pop) a queue under its limits; the caller has checked the queue
-- and the arguments. Works out how many messages may go now
-- (pgbroker._limit_budget), and reads that many: with a per-key limit through
-- _read_by_key_sql, else with the queue's own statement (50_reads.sql).
CREATE OR REPLACE FUNCTION pgbroker._read_limited(stored_name text, ready_from bigint, vt integer, qty integer,
                                       conditional jsonb, pop boolean)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    qtable constant text := lower('q_' || stored_name);
    p pgbroker.queue_policy := pgbroker.policy(stored_name);
    b record;
    op text;
    got bigint;
BEGIN
    SELECT * INTO b FROM pgbroker._limit_budget(stored_name, qty, pop);
    IF b.budget <= 0 THEN
        RETURN;
    END IF;

    IF NOT pop AND p.max_in_flight_per_key IS NOT NULL THEN
        RETURN QUERY EXECUTE pgbroker._read_by_key_sql(qtable, conditional)
            USING b.budget, conditional, b.clock, vt, p.max_in_flight_per_key, b.per_key, stored_name;
    ELSE
        op := CASE WHEN pop THEN 'pop' ELSE 'read' END
              || CASE WHEN p.priorities THEN '_p' ELSE '' END
              || CASE WHEN NOT pop AND NOT (conditional IS NULL OR conditional = '{}'::jsonb)
                      THEN CASE WHEN p.priorities THEN 'c' ELSE '_c' END ELSE '' END;
        RETURN QUERY EXECUTE pgbroker._statement_call(qtable, op, quote_nullable(b.budget),
            quote_nullable(conditional), quote_nullable(b.clock), quote_nullable(vt), quote_nullable(ready_from));
    END IF;
    GET DIAGNOSTICS got = ROW_COUNT;
    PERFORM pgbroker._limit_charge(stored_name, b.available, b.clock, got);
END;
$$;

-- The ack statement of a queue the routes do not hold, as the text to run
-- (pgbroker._statement_call, 50_reads.sql).
CREATE OR REPLACE FUNCTION pgbroker._run_ack(qtable text, msg_ids bigint[], read_cts integer[], leases bigint[],
                                  archive boolean)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RETURN pgbroker._statement_call(qtable, CASE WHEN archive THEN 'ack_a' ELSE 'ack_d' END,
                                    quote_nullable(msg_ids), quote_nullable(read_cts), quote_nullable(leases));
END;
$$;

-- Send a queue's dead letters back to it as new messages (the
-- x-pgbroker-dead-letter header removed, deliveries counted from 0 again):
-- all of them, or those of msg_ids. A replay is sent anew whatever its dedup
-- key (34_dedup.sql): the key is left out, or its window would swallow the
-- replay and the letter would be lost. The queue's max_depth applies, all or
-- nothing. Returns (dead_letter_id, msg_id): the letter's id where it was,
-- and the new message's id in the queue.
CREATE OR REPLACE FUNCTION pgbroker.replay_dead_letters(queue_name text, msg_ids bigint[] DEFAULT NULL)
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
            RETURNING msg_id, message,
                      nullif(headers - 'x-pgbroker-dead-letter' - 'x-pgbroker-dedup-key', '{}'::jsonb) AS headers
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
                                      ARRAY(SELECT pgbroker._send_many(p.queue_name, messages, letter_headers, NULL, true)));
END;
$$;

-- Send every due tick, as of ``as_of`` (default: now; tests pass a time), and
-- move each schedule to its next tick; returns a row per schedule that was
-- due: the tick, and the msg_id sent or the error that refused it. Schedules
-- another scheduler holds right now are skipped (it is sending them).
CREATE OR REPLACE FUNCTION pgbroker.schedule_tick(as_of timestamptz DEFAULT NULL)
RETURNS TABLE (schedule_name text, tick timestamptz, msg_id bigint, error text) LANGUAGE plpgsql AS $$
DECLARE
    now_ timestamptz := coalesce(as_of, now());
    s pgbroker.schedules;
BEGIN
    FOR s IN
        SELECT * FROM pgbroker.schedules d WHERE NOT d.paused AND d.next_run <= now_
        ORDER BY d.next_run FOR UPDATE SKIP LOCKED
    LOOP
        schedule_name := s.name;
        tick := pgbroker._last_due_tick(s, now_);
        error := NULL;
        BEGIN
            SELECT sent INTO msg_id FROM pgbroker._send_many(s.queue_name, ARRAY[s.message],
                ARRAY[coalesce(s.headers, '{}'::jsonb) || jsonb_build_object('x-pgbroker-schedule',
                    jsonb_build_object('name', s.name,
                                       'tick', to_char(tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')))],
                NULL, true) sent;
        EXCEPTION WHEN OTHERS THEN
            msg_id := NULL;
            error := SQLERRM;
        END;
        UPDATE pgbroker.schedules d
        SET last_run = tick, last_msg_id = msg_id, last_error = error,
            next_run = coalesce(pgbroker.cron_next(d.cron, d.timezone, tick), 'infinity')
        WHERE d.name = s.name;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- A prune's window and batch (PB007 otherwise): the window at least a minute
-- (a negative or tiny one would wipe the memory that stops a redelivery from
-- being sent twice, for every queue, and any producer may prune), the batch
-- from 1 to 100,000 rows (one short transaction).
CREATE FUNCTION pgbroker._check_prune_args(seen_within interval, batch_size integer)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgbroker._check_arg(seen_within >= interval '1 minute',
        format('seen_within must be an interval of at least 1 minute, got %s', coalesce(seen_within::text, 'NULL')),
        'Prune with the window the inbound bridge de-duplicates over (its seen_within).');
    PERFORM pgbroker._check_arg(batch_size BETWEEN 1 AND 100000,
        format('batch_size must be from 1 to 100000, got %s', coalesce(batch_size::text, 'NULL')));
END;
$$;

-- Forget inbound message ids seen longer than seen_within ago, of one queue
-- or (queue_name NULL) of all, at most batch_size per call (a short
-- transaction); returns how many went. Callers repeat until 0.
CREATE FUNCTION pgbroker.prune_inbound_seen(seen_within interval, batch_size integer DEFAULT 10000,
                                            queue_name text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    stored varchar;
    pruned bigint;
BEGIN
    PERFORM pgbroker._check_prune_args(seen_within, batch_size);
    IF queue_name IS NOT NULL THEN
        PERFORM pgbroker._table(queue_name);
        stored := pgbroker._stored_name(queue_name);
    END IF;
    DELETE FROM pgbroker.inbound_seen WHERE (inbound_seen.queue_name, message_id) IN (
        SELECT s.queue_name, s.message_id FROM pgbroker.inbound_seen s
        WHERE s.seen_at < now() - seen_within AND (stored IS NULL OR s.queue_name = stored)
        ORDER BY s.seen_at LIMIT batch_size);
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$$;

-- A query with its $n parameters replaced by the given expressions (variables
-- of the route, or literals: pgbroker._statement_call), in one pass, so that
-- no replacement is ever read again for marks ($1 in a literal stays as it
-- is, and $1 never eats $10's start).
CREATE OR REPLACE FUNCTION pgbroker._route_statement(statement text, params text[])
RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    parts constant text[] := regexp_split_to_array(statement, '\$[0-9]+');
    marks constant integer[] := ARRAY(SELECT m[1]::integer FROM regexp_matches(statement, '\$([0-9]+)', 'g') m);
    routed text := parts[1];
BEGIN
    FOR i IN 1..cardinality(marks) LOOP
        routed := routed || params[marks[i]] || parts[i + 1];
    END LOOP;
    RETURN routed;
END;
$$;

-- Rewrite every route from pgmq.meta and the queue policies. SECURITY
-- DEFINER, so that whoever creates a queue or sets a policy can rewrite the
-- routes, which stay the installer's. (Comments in its body refer to the
-- migrations that introduced what each route does.)
CREATE OR REPLACE FUNCTION pgbroker._write_routes()
RETURNS void LANGUAGE plpgsql SECURITY DEFINER
-- Routes are compiled by the sessions that call them, not here.
SET check_function_bodies = off
SET search_path = pg_catalog, pg_temp AS $W$
DECLARE
    route_limit constant bigint := pgbroker._limit('pgbroker.route_limit', 128, false);
    keys text[];
    names text[];
    tables text[];
    max_depths bigint[];
    max_deliveries integer[];
    archives boolean[];
    modes text[];
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
           coalesce(array_agg(coalesce(s.ack_mode, 'archive') = 'archive' ORDER BY s.n), '{}'),
           coalesce(array_agg(s.read_mode ORDER BY s.n), '{}')
    INTO keys, names, tables, max_depths, max_deliveries, archives, modes
    FROM (SELECT m.queue_name, p.max_depth, p.max_deliveries, p.ack_mode, pgbroker._read_mode(p) AS read_mode,
                 row_number() OVER (ORDER BY m.created_at, m.queue_name) AS n
          FROM pgmq.meta m LEFT JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
          ORDER BY m.created_at, m.queue_name
          LIMIT greatest(route_limit, 0)) s;

    FOR i IN 1..cardinality(tables) LOOP
        qtable := tables[i];
        send_bodies := send_bodies || format(
            E'IF cardinality(p_msgs) = 1 THEN\nRETURN QUERY %s;\nELSE\nRETURN QUERY %s;\nEND IF;',
            pgbroker._route_statement(pgbroker._send_insert_sql(qtable, true), send_params),
            pgbroker._route_statement(pgbroker._send_insert_sql(qtable, false), send_params));
        read_bodies := read_bodies || pgbroker._route_read_body(qtable, modes[i], 'read', read_params);
        deliver_bodies := deliver_bodies || pgbroker._route_read_body(qtable, modes[i], 'deliver', read_params);
        pop_bodies := pop_bodies || pgbroker._route_read_body(qtable, modes[i], 'pop', pop_params);
        ack_bodies := ack_bodies || format(E'IF r_archive THEN\nRETURN QUERY %s;\nELSE\nRETURN QUERY %s;\nEND IF;',
            pgbroker._route_statement(pgbroker._statement_query(qtable, 'ack_a'), ack_params),
            pgbroker._route_statement(pgbroker._statement_query(qtable, 'ack_d'), ack_params));
    END LOOP;

    -- Sends: as 0012's _send_sql and _send_many (checks in the same order).
    EXECUTE format($R$
CREATE OR REPLACE FUNCTION pgbroker._route_send(p_queue_name text, p_msgs jsonb[], p_headers jsonb[],
                                                p_delay timestamptz, p_engine_headers boolean DEFAULT false)
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
    -- The limit is the database's, never only the session's (0025).
    PERFORM pgbroker._check_message_size(r_size);
    IF r_max_depth IS NOT NULL THEN
        PERFORM pgbroker._check_depth(r_name, lower('q_' || r_name), cardinality(p_msgs));
    END IF;
    -- The transaction id before the msg_ids: queue_head's advances rely on it.
    PERFORM pg_current_xact_id();
    -- Job headers (32_priorities.sql): checked, and a batch with dedup keys
    -- is sent by pgbroker._send_deduplicated; the rest take the INSERT below.
    IF p_headers IS NOT NULL THEN
        -- Reserved headers (0025): only the engine's own sends carry them.
        IF NOT p_engine_headers THEN
            PERFORM pgbroker._check_reserved_headers(p_headers);
        END IF;
        IF pgbroker._has_job_headers(p_headers) THEN
            IF pgbroker._prepare_job_headers(r_name, p_headers) THEN
                RETURN QUERY SELECT * FROM pgbroker._send_deduplicated(r_name, p_msgs, p_headers, p_delay);
                RETURN;
            END IF;
        END IF;
    END IF;
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
    r_mode text;
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
        r_mode := r_queue.read_mode;
    ELSE
        r_name := (%4$L::text[])[r];
        r_from := pgbroker._route_ready_from(r_name);
        r_max_deliveries := (%5$L::integer[])[r];
        r_mode := (%10$L::text[])[r];
    END IF;
    IF %6$L AND r_max_deliveries IS NOT NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._deliver(r_name, r_from, r_max_deliveries, p_vt, p_qty,
                                                     p_conditional, r_mode);
        RETURN;
    END IF;
    IF r_dynamic THEN
        RETURN QUERY EXECUTE pgbroker._run_read(r_name, r_from, p_vt, p_qty, p_conditional, %6$L, r_mode);
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
     CASE op WHEN 'read' THEN 'pgbroker._pgmq_check_read_args' ELSE 'pgbroker._check_read_args' END,
     modes);
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
        RETURN QUERY EXECUTE pgbroker._run_pop(r_name, r_from, p_qty, r_queue.read_mode);
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

-- Make a stream. segment_rows ids per segment, segments child tables in the
-- ring: retention frees a child at a time, so the log keeps at least one
-- segment and at most about segments x segment_rows rows while every group
-- keeps up. Idempotent for the same settings.
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

    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.stream:' || stored));
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
    INSERT INTO pgbroker.stream_watermark (stream_name, safe_id) VALUES (stored, 0);
    EXECUTE pgbroker._stream_send_function(s);
    EXECUTE pgbroker._stream_read_function(s);
    PERFORM pgbroker._stream_send_router_refresh();
    RETURN s;
END;
$$;

-- Send a batch; returns the ids in the order of the messages. headers and
-- keys, when given, pair with messages by position.
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
        PERFORM pgbroker._check_reserved_headers(headers);
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

-- Acknowledge batches: for each (partition, epoch, last id) the consumer
-- was handed, the group's cursor moves up to last id, unless the partition
-- changed hands since (epoch): then nothing changes and that partition's row
-- says acked = false. failed_ids (with errors by position, or one error for
-- all) are messages of the acknowledged ranges that failed: they go to the
-- group's retry queue (see the header).
CREATE OR REPLACE FUNCTION pgbroker.stream_ack(stream_name text, group_name text, consumer text, partitions integer[],
                                    epochs bigint[], last_ids bigint[], failed_ids bigint[] DEFAULT NULL,
                                    errors text[] DEFAULT NULL)
RETURNS TABLE (partition integer, acked boolean) LANGUAGE plpgsql AS $$
DECLARE
    g pgbroker.stream_group := pgbroker._stream_group_row(stream_name, group_name);
    acked_ranges record;
    p pgbroker.queue_policy;
    retried bigint[];
BEGIN
    PERFORM pgbroker._check_arg(
        cardinality(partitions) = cardinality(epochs) AND cardinality(partitions) = cardinality(last_ids),
        'partitions, epochs and last_ids must have one entry per acknowledged partition');
    PERFORM pgbroker._check_arg(errors IS NULL OR cardinality(errors) IN (1, cardinality(failed_ids)),
        'errors must have one entry per failed id, or a single one for all');

    RETURN QUERY
    WITH wanted AS (
        SELECT w.partition, w.epoch, w.last_id FROM unnest(partitions, epochs, last_ids) AS w(partition, epoch, last_id)
    ), done AS (
        UPDATE pgbroker.stream_cursor t
        SET acked_id = greatest(t.acked_id, least(w.last_id, t.delivered_id)), acked_at = now()
        FROM wanted w
        WHERE t.stream_name = g.stream_name AND t.group_name = g.group_name AND t.partition = w.partition
          AND t.epoch = w.epoch AND t.owner = stream_ack.consumer
        RETURNING t.partition
    )
    SELECT w.partition, EXISTS (SELECT 1 FROM done d WHERE d.partition = w.partition)
    FROM wanted w ORDER BY w.partition;

    IF coalesce(cardinality(failed_ids), 0) = 0 THEN
        RETURN;
    END IF;
    -- The failed messages of the ranges acknowledged just now, copied to the
    -- retry queue with their place in the stream and the error.
    p := pgbroker.policy(g.retry_queue);
    EXECUTE format(
        $Q$
        SELECT array_agg(l.message ORDER BY l.id) AS msgs,
               array_agg(coalesce(l.headers, '{}'::jsonb) || jsonb_build_object('x-pgbroker-stream',
                   jsonb_build_object('stream', $5::text, 'group', $6::text, 'partition', l.partition,
                                      'id', l.id, 'key', l.key, 'enqueued_at', l.enqueued_at,
                                      'error', left(coalesce(f.error, 'failed (no error given)'), 2000)))
                         ORDER BY l.id) AS hdrs
        FROM unnest($1::bigint[], CASE WHEN cardinality($2::text[]) = 1
                                       THEN array_fill(($2::text[])[1], ARRAY[cardinality($1::bigint[])])
                                       ELSE $2::text[] END) AS f(id, error)
        JOIN pgbroker.%I l ON l.id = f.id
        JOIN unnest($3::integer[], $4::bigint[]) AS a(partition, last_id)
          ON a.partition = l.partition AND l.id <= a.last_id
        WHERE EXISTS (SELECT 1 FROM pgbroker.stream_cursor t
                      WHERE t.stream_name = $5 AND t.group_name = $6 AND t.partition = l.partition
                        AND t.owner = $7)
        $Q$, 's_' || g.stream_name)
        INTO acked_ranges USING failed_ids, errors, partitions, last_ids, g.stream_name, g.group_name, consumer;
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

-- Forget stream inbound message ids seen longer than seen_within ago, at most
-- batch_size per call; returns how many went. Callers repeat until 0.
CREATE OR REPLACE FUNCTION pgbroker.prune_stream_inbound_seen(seen_within interval, batch_size integer DEFAULT 10000)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    pruned bigint;
BEGIN
    PERFORM pgbroker._check_prune_args(seen_within, batch_size);
    DELETE FROM pgbroker.stream_inbound_seen WHERE (stream_name, message_id) IN (
        SELECT seen.stream_name, seen.message_id FROM pgbroker.stream_inbound_seen seen
        WHERE seen.seen_at < now() - seen_within ORDER BY seen.seen_at LIMIT batch_size);
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$$;

-- The routes, with the new send route.
SELECT pgbroker._write_routes();

-- pg_monitor's grants as a new database has them: no payloads.
SELECT pgbroker.grant_pg_monitor_payloads(false);
