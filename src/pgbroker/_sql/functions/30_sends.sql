-- Sends: pgmq.send and pgmq.send_batch in every form.
--
-- Every form lands in the send route, pgbroker._route_send (90_routes.sql),
-- which checks the batch, the message size and the queue's max_depth, in
-- that order, then runs the queue's INSERT as static SQL with the table name
-- written in. A queue the route does not hold takes the same checks and runs
-- pgbroker._send_insert_sql's statement dynamically. A message without delay
-- gets vt = enqueued_at, which is what puts it in the ready index.
--
-- A send takes its transaction id before its msg_ids: queue_head's bounds
-- (50_reads.sql) rely on it.

-- The shape of a batch, checked before anything is sent (send_batch_topic
-- checks it once even when no queue matches).
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

-- A batch as the clients pass it: one JSON array whose elements are the
-- messages (or their headers), returned as the jsonb[] the sends take, in
-- order. One parameter: psycopg writes a list parameter element by element
-- in Python, 6 us a message of a batch of 500 (its array literal escapes
-- every quote), a string at once. A NULL array is NULL; with
-- null_is_missing, a JSON null element is NULL (headers: none for that
-- message), else it is the JSON null it is (a body may be null).
CREATE OR REPLACE FUNCTION pgbroker._jsonb_array(elements jsonb, null_is_missing boolean DEFAULT false)
RETURNS jsonb[] LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN elements IS NOT NULL THEN
        ARRAY(SELECT CASE WHEN null_is_missing AND t.e = 'null'::jsonb THEN NULL ELSE t.e END
              FROM jsonb_array_elements(elements) WITH ORDINALITY AS t(e, n) ORDER BY t.n)
    END;
$$;

-- The limits an operator sets (pgbroker.max_message_bytes, and
-- pgbroker.route_limit: 90_routes.sql) protect the server from its callers,
-- so a caller's session cannot lift them: under a privilege switch (a
-- SECURITY DEFINER entry point of the roles, session_user <> current_user)
-- a limit is the database's setting (ALTER DATABASE ... SET name = ..., read
-- from the catalog: setrole = 0), or the session's own value only where
-- that is stricter. A session value alone (SET, or ALTER ROLE ... SET, which
-- a role may do for itself) would let any caller of such an entry point
-- choose the limit.

-- A limit's value given as text: a whole number, or PB007 naming the setting.
CREATE OR REPLACE FUNCTION pgbroker._limit_number(name text, value text)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF value !~ '^[0-9]{1,18}$' THEN
        RAISE EXCEPTION '% must be a whole number, got %', name, quote_literal(value)
            USING ERRCODE = 'PB007', HINT = 'Set it for the database: ALTER DATABASE ... SET ' || name || ' = ...';
    END IF;
    RETURN value::bigint;
END;
$$;

-- A limit's value in the session (SET, ALTER ROLE/DATABASE ... SET, options
-- at connection); NULL when it has none.
CREATE OR REPLACE FUNCTION pgbroker._session_limit(name text)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    session_text constant text := nullif(current_setting(name, true), '');
BEGIN
    IF session_text IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN pgbroker._limit_number(name, session_text);
END;
$$;

-- A limit's value for the database (ALTER DATABASE ... SET, read from the
-- catalog), fallback without one; nothing of the session.
CREATE OR REPLACE FUNCTION pgbroker._database_limit(name text, fallback bigint)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    database_text text;
BEGIN
    SELECT substr(c.setting, length(name) + 2) INTO database_text
    FROM pg_catalog.pg_db_role_setting s CROSS JOIN LATERAL pg_catalog.unnest(s.setconfig) AS c(setting)
    WHERE s.setrole = 0
      AND s.setdatabase = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database())
      AND pg_catalog.starts_with(c.setting, name || '=');
    IF database_text IS NULL THEN
        RETURN fallback;
    END IF;
    RETURN pgbroker._limit_number(name, database_text);
END;
$$;

-- A limit's value (see above): the database's setting, fallback without one,
-- or the session's value where it is stricter: smaller, and, where 0 means
-- no limit (zero_means_none), positive.
CREATE OR REPLACE FUNCTION pgbroker._limit(name text, fallback bigint, zero_means_none boolean)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    database_value constant bigint := pgbroker._database_limit(name, fallback);
    session_value bigint;
BEGIN
    session_value := pgbroker._session_limit(name);
    IF session_value IS NULL THEN
        RETURN database_value;
    END IF;
    IF zero_means_none AND session_value = 0 THEN
        RETURN database_value;
    ELSIF zero_means_none AND database_value = 0 THEN
        RETURN session_value;
    END IF;
    RETURN least(database_value, session_value);
END;
$$;

-- pgbroker.max_message_bytes where nothing sets it: 1 MiB.
CREATE OR REPLACE FUNCTION pgbroker._default_max_message_bytes()
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT 1048576::bigint
$$;

-- Refuse a message larger than pgbroker.max_message_bytes (jsonb datum size,
-- bytes; 1 MiB by default, 0 for no limit), a limit as above under a
-- privilege switch. A send with the session's own rights takes the session's
-- value (which a new session takes from ALTER DATABASE ... SET): its INSERT
-- runs as the caller, who could write the queue table directly, so the
-- catalog would guard nothing. The catalog probe was the costly part of a
-- send: its two catalogs are shared, and a shared relation's lock takes the
-- lock manager's partitions, never the backend's fast path (measured, one
-- client inside a transaction: 17 -> 12 us of function time a send).
CREATE OR REPLACE FUNCTION pgbroker._check_message_size(size bigint)
RETURNS void LANGUAGE plpgsql STABLE AS $$
DECLARE
    name constant text := 'pgbroker.max_message_bytes';
    fallback constant bigint := pgbroker._default_max_message_bytes();
    max_bytes constant bigint := CASE WHEN session_user <> current_user THEN pgbroker._limit(name, fallback, true)
                                      ELSE coalesce(pgbroker._session_limit(name), fallback) END;
BEGIN
    IF max_bytes > 0 AND size > max_bytes THEN
        RAISE EXCEPTION 'message is too large: % bytes, the limit is % bytes', size, max_bytes
            USING ERRCODE = 'PB005',
                  HINT = 'Store large payloads elsewhere and send a reference, '
                         'or raise pgbroker.max_message_bytes for the database.';
    END IF;
END;
$$;

-- Whether a message of size bytes is within its limit, known without
-- looking the limit up: the caller's own rights, no pgbroker.max_message_bytes
-- in the session (nor for the database, which a session takes at its start),
-- and a size within the default. An SQL expression, inlined where it is
-- used, so that the common send makes no call for its limit (a nested
-- PL/pgSQL call costs a one-message send about a tenth of its rate); false
-- only means that pgbroker._check_message_size must decide.
CREATE OR REPLACE FUNCTION pgbroker._within_default_size(size bigint)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT size <= pgbroker._default_max_message_bytes()
       AND session_user = current_user
       AND coalesce(current_setting('pgbroker.max_message_bytes', true), '') = ''
$$;

-- A delay in seconds as the time the message becomes visible; NULL for no
-- delay (ready at once, in the ready index).
CREATE OR REPLACE FUNCTION pgbroker._delay_to_time(delay integer)
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

-- A delay given as a time, which must not be NULL.
CREATE OR REPLACE FUNCTION pgbroker._check_delay_time(delay timestamptz)
RETURNS timestamptz LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgbroker._check_arg(delay IS NOT NULL,
        'delay must be a timestamp, got NULL', 'Omit delay to send without one.');
    RETURN delay;
END;
$$;

-- pgmq's integer delay as a visibility time (its sends take what they are
-- given, 0018): none for 0 (ready at once, as pgbroker._delay_to_time), a time
-- in the past for a negative delay (visible at once), NULL for NULL (which the
-- callers send through pgbroker._pgmq_send_without_vt first).
CREATE OR REPLACE FUNCTION pgbroker._pgmq_delay_to_time(delay integer)
RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF delay = 0 THEN
        RETURN NULL;
    END IF;
    RETURN clock_timestamp() + make_interval(secs => delay);
END;
$$;

-- A send of schema pgmq given a NULL delay (0018): it fails as pgmq's INSERT
-- fails, with the NOT NULL violation of column vt (23502), once the batch and
-- the queue have passed pgmq's checks. (The send route's NULL means "no
-- delay".) pgbroker's own functions and clients refuse it (PB007).
CREATE OR REPLACE FUNCTION pgbroker._pgmq_send_without_vt(queue_name text, msgs jsonb[], headers jsonb[])
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._check_batch(msgs, headers);
    RETURN QUERY EXECUTE format(
        'INSERT INTO pgmq.%I (vt, message, headers)'
        ' SELECT NULL, m.msg, m.hdr FROM unnest($1, $2) AS m(msg, hdr) RETURNING msg_id',
        pgbroker._pgmq_table(queue_name))
    USING msgs, headers;
END;
$$;

-- The INSERT of a send, with $1 the messages, $2 their headers (or NULL),
-- $3 the delay (NULL: visible at once). One message takes a one-row INSERT.
CREATE OR REPLACE FUNCTION pgbroker._send_insert_sql(qtable text, single boolean)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN single THEN format(
        'INSERT INTO pgmq.%I (vt, message, headers) VALUES (coalesce($3, now()), $1[1], $2[1])'
        ' RETURNING msg_id', qtable)
    ELSE format(
        $Q$
        INSERT INTO pgmq.%I (vt, message, headers)
        SELECT coalesce($3, now()), m.msg, m.hdr
        FROM unnest($1, $2) WITH ORDINALITY AS m(msg, hdr, n)
        ORDER BY m.n
        RETURNING msg_id
        $Q$, qtable) END;
$$;

-- Send a batch to a queue; what every pgbroker function that sends (topics,
-- dead-letter replay, the bridge, schedules, stream retries) calls.
-- engine_headers: the engine's own sends (replay, schedules, stream retries),
-- which may carry reserved headers (pgbroker._check_reserved_headers).
CREATE OR REPLACE FUNCTION pgbroker._send_many(queue_name text, msgs jsonb[], headers jsonb[], delay timestamptz,
                                    engine_headers boolean DEFAULT false)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers, delay, engine_headers);
END;
$$;

------------------------------------------------------------------------------
-- The entry points. PL/pgSQL rather than SQL: a SQL function that is not
-- inlined is planned again on every call. The delay is worked out before the
-- route is called.
------------------------------------------------------------------------------

-- Send one message, with optional headers and a delay (seconds, or the instant it
-- becomes visible); pgmq's six overloads.
-- Returns: the new msg_id.
-- Errors: pgmq's on a missing queue (PB002); PB006 when the queue's max_depth is
--   reached.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB, delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, ARRAY[msg], ARRAY[headers]);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], ARRAY[headers], delay);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], NULL, NULL);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], ARRAY[headers], NULL);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, ARRAY[msg], NULL);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], NULL,
                                                    pgbroker._pgmq_delay_to_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, ARRAY[msg], NULL);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], NULL, delay);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB, delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, ARRAY[msg], ARRAY[headers]);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], ARRAY[headers],
                                                    pgbroker._pgmq_delay_to_time(delay));
END;
$$;

-- Send several messages at once, in order, with optional headers (one per message)
-- and a delay shared by all; pgmq's overloads.
-- Returns: their msg_ids, in the order given.
-- Errors: pgmq's on a missing queue (PB002); PB006 when the queue's max_depth is
--   reached.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[],
                                delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, msgs, headers);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers, delay);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, NULL, NULL);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers, NULL);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, msgs, NULL);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, NULL,
                                                    pgbroker._pgmq_delay_to_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, msgs, NULL);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, NULL, delay);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[], delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, msgs, headers);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers,
                                                    pgbroker._pgmq_delay_to_time(delay));
END;
$$;
