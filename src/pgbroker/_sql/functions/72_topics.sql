-- Topics: sends by routing key to bound queues (pgmq 1.13 bind_topic, ...).
--
-- A queue binds patterns; a message sent with a routing key goes to every
-- queue with at least one pattern matching the key, once per queue. Keys and
-- patterns are dot-separated words. A binding matches as pgmq's does: its
-- pattern is compiled to a regular expression with '*' as one or more
-- characters other than a dot (one word) and '#' as any characters, the
-- dots kept literal. So pgmq's 'orders.#' needs at least one word after
-- 'orders' (it is '^orders\..*$') and '#.audit' misses 'audit'.
--
-- AMQP topic exchanges read a '#' word as zero or more words ('orders.#'
-- matches 'orders', 'a.#.z' matches 'a.z'). That meaning is an opt-in per
-- binding: pgbroker.bind_topic_amqp(pattern, queue_name) (0015). Bindings
-- made before 0015 had it, and kept it (see docs/compatibility.md).
--
-- Keys and patterns are validated, and patterns compiled to regular
-- expressions, in 71_topic_patterns.sql.

-- Every binding with the regex it matches by: pgmq's, or AMQP's for the
-- bindings that opted in.
CREATE OR REPLACE VIEW pgbroker.topic_routes AS
    SELECT b.pattern, b.queue_name, b.bound_at, coalesce(a.compiled_regex, b.compiled_regex) AS compiled_regex,
           a.pattern IS NOT NULL AS amqp
    FROM pgmq.topic_bindings b
    LEFT JOIN pgbroker.topic_amqp_bindings a ON a.pattern = b.pattern AND a.queue_name = b.queue_name;

-- The bindings a (validated) routing key matches.
CREATE OR REPLACE FUNCTION pgbroker._topic_matches(routing_key text)
RETURNS SETOF pgbroker.topic_routes LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    RETURN QUERY SELECT * FROM pgbroker.topic_routes b WHERE routing_key ~ b.compiled_regex;
END;
$$;

-- Bind a pattern to a queue; binding it again changes nothing. Checks and
-- errors are pgmq's, in its order; the queue is found in any case (0015).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.bind_topic(pattern text, queue_name text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmq.validate_topic_pattern(pattern);
    PERFORM pgbroker._pgmq_check(queue_name IS NOT NULL AND queue_name <> '',
        'queue_name cannot be NULL or empty', 'Name the queue the pattern routes to.', 'PB001');
    IF pgbroker._stored_name(queue_name) IS NULL THEN
        PERFORM pgbroker._pgmq_raise(
            format('Queue "%s" does not exist. Create the queue first using pgmq.create()', queue_name), 'PB002',
            pgbroker._no_queue_hint(queue_name));
    END IF;
    -- Store the queue's own spelling: names are found in any case, and the
    -- foreign key (for the cascade on drop) compares exactly.
    INSERT INTO pgmq.topic_bindings (pattern, queue_name)
    SELECT bind_topic.pattern, m.queue_name FROM pgmq.meta m
    WHERE lower(m.queue_name) = lower(bind_topic.queue_name)
    ON CONFLICT ON CONSTRAINT topic_bindings_pattern_queue_name_key DO NOTHING;
END;
$$;

-- Bind a pattern whose '#' words match zero or more words, as in AMQP topic
-- exchanges, where pgmq.bind_topic's need at least one ('orders.#' then also
-- matches 'orders'). Binding an existing pattern this way switches it to
-- AMQP's meaning; pgmq.unbind_topic removes it either way.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.bind_topic_amqp(pattern text, queue_name text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmq.bind_topic(pattern, queue_name);
    INSERT INTO pgbroker.topic_amqp_bindings (pattern, queue_name)
    SELECT bind_topic_amqp.pattern, pgbroker._stored_name(bind_topic_amqp.queue_name)
    ON CONFLICT DO NOTHING;
END;
$$;

-- Unbind a pattern from a queue; false when it was not bound.
-- Since: 0.1.0
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

-- Every binding, newest first; or one queue's. compiled_regex is the regex
-- the binding matches by (AMQP's for pgbroker.bind_topic_amqp's).
-- Since: 0.1.0
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

-- The bindings a routing key would reach, without sending.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.test_routing(routing_key text)
RETURNS TABLE (pattern text, queue_name text, compiled_regex text)
LANGUAGE sql STABLE AS $$
    SELECT b.pattern, b.queue_name, b.compiled_regex
    FROM pgbroker._topic_matches(routing_key) b
    ORDER BY b.pattern, b.queue_name;
$$;

------------------------------------------------------------------------------
-- Sending. One insert per reached queue through pgbroker._send_many, in queue
-- name order; any failure rolls the whole send back. The delay is turned into
-- a time once, so every copy becomes visible at the same moment.
------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgbroker._send_topic(routing_key text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE plpgsql AS $$
DECLARE
    target text;
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    PERFORM pgbroker._check_batch(msgs, headers);
    FOR target IN SELECT DISTINCT b.queue_name FROM pgbroker._topic_matches(routing_key) b ORDER BY 1 LOOP
        PERFORM pgbroker._authorize('producer', target);
        RETURN QUERY SELECT target, s.id FROM pgbroker._send_many(target, msgs, headers, delay) AS s(id);
    END LOOP;
END;
$$;

-- Send one message to every queue the key reaches; returns how many queues.
-- Since: 0.1.0
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

CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb)
RETURNS integer LANGUAGE sql AS $$
    SELECT pgmq.send_topic(routing_key, msg, NULL, 0);
$$;

CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, delay integer)
RETURNS integer LANGUAGE sql AS $$
    SELECT pgmq.send_topic(routing_key, msg, NULL, delay);
$$;

-- Send a batch to every queue the key reaches; returns (queue_name, msg_id)
-- for every message sent.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $$
    SELECT * FROM pgbroker._send_topic(routing_key, msgs, headers, pgbroker._check_delay_time(delay));
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $$
    SELECT * FROM pgbroker._send_topic(routing_key, msgs, NULL, NULL);
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $$
    SELECT * FROM pgbroker._send_topic(routing_key, msgs, headers, NULL);
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $$
    SELECT * FROM pgbroker._send_topic(routing_key, msgs, NULL, pgbroker._delay_to_time(delay));
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $$
    SELECT * FROM pgbroker._send_topic(routing_key, msgs, NULL, pgbroker._check_delay_time(delay));
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $$
    SELECT * FROM pgbroker._send_topic(routing_key, msgs, headers, pgbroker._delay_to_time(delay));
$$;
