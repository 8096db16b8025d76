-- pgbroker migration 0024: a stream's send runs the stream's INSERT through a
-- router written by create_stream and drop_stream (static SQL, planned once
-- per session) instead of a dynamic EXECUTE planned on every send; and a read
-- by a consumer well within its lease no longer locks its consumer row (see
-- sql/schema/92_streams.sql, of which these are copies).

-- The INSERT of a stream's sends (a statement of PL/pgSQL returning the ids,
-- over the variables messages, headers and keys), with the table, the
-- sequence and the stream's constants written in, for a plan cached per
-- session. The sequence is called in the FROM list, one row at a time in the
-- messages' order; the INSERT takes the log's lock before it runs (see the
-- safe id, above).
CREATE FUNCTION pgbroker._stream_send_insert(s pgbroker.stream)
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
        CREATE FUNCTION pgbroker.%1$I(messages jsonb[], headers jsonb[], keys text[])
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
CREATE FUNCTION pgbroker._stream_send_router_sql()
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
CREATE FUNCTION pgbroker._stream_send_router_refresh()
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.stream_send_router'));
    EXECUTE pgbroker._stream_send_router_sql();
END;
$$;

SELECT pgbroker._stream_send_router_refresh();

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

CREATE OR REPLACE FUNCTION pgbroker.drop_stream(stream_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    stored text := lower(drop_stream.stream_name);
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.stream:' || stored));
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

-- Renew the consumer's heartbeat (at most every half lease), and when it was
-- renewed, or the consumer owns nothing, give up partitions beyond its share
-- and take free ones up to it. Returns nothing; the caller reads what it owns.
CREATE OR REPLACE FUNCTION pgbroker._stream_balance(s pgbroker.stream, group_name text, consumer text, lease_seconds integer)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    renewed boolean;
    live text[];
    rank integer;
    share integer;
    owned integer;
BEGIN
    SELECT count(*) INTO owned FROM pgbroker.stream_cursor t
    WHERE t.stream_name = s.stream_name AND t.group_name = _stream_balance.group_name
      AND t.owner = _stream_balance.consumer;
    -- The common case, a consumer that owns partitions reading again well
    -- within its lease: nothing to renew, nothing to balance. Looked at with a
    -- plain read first, because the upsert below locks the consumer's row (a
    -- WAL record and a dirtied page on every read) even when its WHERE leaves
    -- the row as it is.
    IF owned > 0 AND EXISTS (
        SELECT 1 FROM pgbroker.stream_consumer c
        WHERE c.stream_name = s.stream_name AND c.group_name = _stream_balance.group_name
          AND c.consumer = _stream_balance.consumer
          AND c.renewed_at >= now() - make_interval(secs => lease_seconds / 2.0)
          AND c.expires_at >= now() + make_interval(secs => lease_seconds / 2.0)) THEN
        RETURN;
    END IF;
    INSERT INTO pgbroker.stream_consumer AS c (stream_name, group_name, consumer, expires_at, renewed_at)
    VALUES (s.stream_name, group_name, consumer, now() + make_interval(secs => lease_seconds), now())
    ON CONFLICT ON CONSTRAINT stream_consumer_pkey DO UPDATE
        SET expires_at = EXCLUDED.expires_at, renewed_at = EXCLUDED.renewed_at
        WHERE c.renewed_at < now() - make_interval(secs => lease_seconds / 2.0)
           OR c.expires_at < now() + make_interval(secs => lease_seconds / 2.0)
    RETURNING true INTO renewed;
    IF renewed IS NOT TRUE AND owned > 0 THEN
        RETURN;
    END IF;

    live := ARRAY(SELECT c.consumer FROM pgbroker.stream_consumer c
                  WHERE c.stream_name = s.stream_name AND c.group_name = _stream_balance.group_name
                    AND (c.expires_at > now() OR c.consumer = _stream_balance.consumer)
                  ORDER BY c.consumer);
    rank := array_position(live, consumer) - 1;
    share := s.partitions / cardinality(live) + CASE WHEN rank < s.partitions % cardinality(live) THEN 1 ELSE 0 END;

    IF owned > share THEN
        -- Give back the highest partitions that have nothing in flight.
        UPDATE pgbroker.stream_cursor t SET owner = NULL
        WHERE (t.stream_name, t.group_name, t.partition) IN (
            SELECT x.stream_name, x.group_name, x.partition FROM pgbroker.stream_cursor x
            WHERE x.stream_name = s.stream_name AND x.group_name = _stream_balance.group_name
              AND x.owner = _stream_balance.consumer AND x.delivered_id = x.acked_id
            ORDER BY x.partition DESC LIMIT owned - share);
    ELSIF owned < share THEN
        -- Take free partitions: unowned, or their owner's heartbeat expired.
        -- The new epoch fences the former owner's acks; delivered_id goes back
        -- to acked_id, so what it held unacknowledged is delivered again.
        UPDATE pgbroker.stream_cursor t
        SET owner = _stream_balance.consumer, epoch = t.epoch + 1, delivered_id = t.acked_id
        WHERE (t.stream_name, t.group_name, t.partition) IN (
            SELECT x.stream_name, x.group_name, x.partition FROM pgbroker.stream_cursor x
            WHERE x.stream_name = s.stream_name AND x.group_name = _stream_balance.group_name
              AND (x.owner IS NULL OR NOT x.owner = ANY (live))
            ORDER BY x.partition LIMIT share - owned
            FOR UPDATE SKIP LOCKED);
    END IF;
    -- Forget consumers long gone (a lease and a minute past expiry).
    DELETE FROM pgbroker.stream_consumer c
    WHERE c.stream_name = s.stream_name AND c.group_name = _stream_balance.group_name
      AND c.expires_at < now() - make_interval(secs => lease_seconds + 60);
END;
$$;
