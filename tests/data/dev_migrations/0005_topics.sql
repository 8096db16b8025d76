-- pgbroker migration 0005: topic routing (pgmq 1.13 bind_topic, send_topic, ...).
--
-- A queue binds patterns; a message sent with a routing key goes to every
-- queue with at least one pattern matching the key, once per queue. Keys and
-- patterns are dot-separated words; in a pattern a word '*' is exactly one
-- word and a word '#' is zero or more words, as in AMQP topic exchanges:
-- 'orders.#' matches 'orders' and 'orders.eu.created', 'a.#.z' matches 'a.z'.
-- pgmq compiles '#' to '.*' with its dots left literal, so its 'orders.#'
-- needs at least one word after 'orders' and its '#.z' misses 'z'; pgbroker
-- keeps the AMQP meaning its own documentation gives ("zero or more").
-- A wildcard inside a word ('user-*', 'a#') is accepted as pgmq accepts it,
-- with pgmq's meaning: '*' is one or more characters other than a dot, '#'
-- any characters.
--
-- Validation accepts and rejects exactly what pgmq does, with its messages,
-- under SQLSTATE PB007 and with a hint.

-- The rules keys and patterns share; charset is a bracket expression body.
CREATE FUNCTION pgbroker._check_topic_text(what text, value text, charset text, allowed text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    hint text := CASE what
        WHEN 'routing_key' THEN 'A routing key is words joined by dots, for example ''orders.eu.created''.'
        ELSE 'A pattern is words joined by dots; a word may be * (one word) or # (zero or more words), '
             'for example ''orders.*.created'' or ''orders.#''.'
    END;
BEGIN
    PERFORM pgbroker._check_arg(value IS NOT NULL AND value <> '',
        format('%s cannot be NULL or empty', what), hint);
    PERFORM pgbroker._check_arg(length(value) <= 255,
        format('%s length cannot exceed 255 characters, got %s characters', what, length(value)), hint);
    PERFORM pgbroker._check_arg(value ~ ('^[' || charset || ']+$'),
        format('%s contains invalid characters. Only %s are allowed. Got: %s', what, allowed, value), hint);
    PERFORM pgbroker._check_arg(value !~ '^\.',
        format('%s cannot start with a dot. Got: %s', what, value), hint);
    PERFORM pgbroker._check_arg(value !~ '\.$',
        format('%s cannot end with a dot. Got: %s', what, value), hint);
    PERFORM pgbroker._check_arg(value !~ '\.\.',
        format('%s cannot contain consecutive dots. Got: %s', what, value), hint);
END;
$$;

CREATE FUNCTION pgmq.validate_routing_key(routing_key text)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgbroker._check_topic_text('routing_key', routing_key, 'a-zA-Z0-9._-',
        'alphanumeric, dots, hyphens, and underscores');
    RETURN true;
END;
$$;

CREATE FUNCTION pgmq.validate_topic_pattern(pattern text)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    hint text := 'Separate wildcards with dots: ''*.*'' is two words, ''#'' alone already matches any number.';
BEGIN
    PERFORM pgbroker._check_topic_text('pattern', pattern, 'a-zA-Z0-9._*#-',
        'alphanumeric, dots, hyphens, underscores, *, and #');
    PERFORM pgbroker._check_arg(pattern !~ '\*\*',
        format('pattern cannot contain consecutive stars (**). Use # for multi-segment matching. Got: %s', pattern),
        hint);
    PERFORM pgbroker._check_arg(pattern !~ '##',
        format('pattern cannot contain consecutive hashes (##). A single # already matches zero or more segments. Got: %s',
               pattern),
        hint);
    PERFORM pgbroker._check_arg(pattern !~ '\*#|#\*',
        format('pattern cannot contain adjacent wildcards (*# or #*). Separate wildcards with dots. Got: %s', pattern),
        hint);
    RETURN true;
END;
$$;

-- The regular expression a valid pattern compiles to, matched against the
-- whole routing key. A '#' word takes one of its dots with it, so that it can
-- stand for no word at all: leading '#.' is (word.)*, any later '.#' is
-- (.word)*. Only letters, digits, '_' and '-' remain literal, none of them a
-- regex metacharacter, so nothing needs escaping.
CREATE FUNCTION pgbroker._topic_regex(pattern text)
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

CREATE TABLE pgmq.topic_bindings (
    pattern text NOT NULL
        -- Also guards direct inserts: a malformed pattern would compile to a
        -- regex that breaks every send_topic.
        CONSTRAINT topic_bindings_pattern_check CHECK (pgmq.validate_topic_pattern(pattern)),
    queue_name text NOT NULL
        CONSTRAINT topic_bindings_queue_name_fkey REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE,
    bound_at timestamptz NOT NULL DEFAULT now(),
    -- Compiled once here rather than on every send.
    compiled_regex text GENERATED ALWAYS AS (pgbroker._topic_regex(pattern)) STORED,
    CONSTRAINT topic_bindings_pattern_queue_name_key UNIQUE (pattern, queue_name)
);
-- For the cascade when a queue is dropped, and for listing one queue's bindings.
CREATE INDEX topic_bindings_queue_name_idx ON pgmq.topic_bindings (queue_name);

-- The bindings a (validated) routing key matches.
CREATE FUNCTION pgbroker._topic_matches(routing_key text)
RETURNS SETOF pgmq.topic_bindings LANGUAGE plpgsql STABLE AS $$
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    RETURN QUERY SELECT * FROM pgmq.topic_bindings b WHERE routing_key ~ b.compiled_regex;
END;
$$;

CREATE FUNCTION pgmq.bind_topic(pattern text, queue_name text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgmq.validate_topic_pattern(pattern);
    PERFORM pgbroker._table(queue_name);  -- PB001 / PB002 with a hint
    -- Store the queue's own spelling: names are found in any case, and the
    -- foreign key (for the cascade on drop) compares exactly.
    INSERT INTO pgmq.topic_bindings (pattern, queue_name)
    SELECT bind_topic.pattern, m.queue_name FROM pgmq.meta m
    WHERE lower(m.queue_name) = lower(bind_topic.queue_name)
    ON CONFLICT ON CONSTRAINT topic_bindings_pattern_queue_name_key DO NOTHING;
END;
$$;

CREATE FUNCTION pgmq.unbind_topic(pattern text, queue_name text)
RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._check_arg(pattern IS NOT NULL AND pattern <> '', 'pattern cannot be NULL or empty');
    PERFORM pgbroker._check_arg(queue_name IS NOT NULL AND queue_name <> '', 'queue_name cannot be NULL or empty');
    DELETE FROM pgmq.topic_bindings b
    WHERE b.pattern = unbind_topic.pattern AND lower(b.queue_name) = lower(unbind_topic.queue_name);
    RETURN FOUND;
END;
$$;

CREATE FUNCTION pgmq.list_topic_bindings()
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE AS $$
    SELECT b.pattern, b.queue_name, b.bound_at, b.compiled_regex
    FROM pgmq.topic_bindings b
    ORDER BY b.bound_at DESC, b.pattern, b.queue_name;
$$;

CREATE FUNCTION pgmq.list_topic_bindings(queue_name text)
RETURNS TABLE (pattern text, queue_name text, bound_at timestamptz, compiled_regex text)
LANGUAGE sql STABLE AS $$
    SELECT b.pattern, b.queue_name, b.bound_at, b.compiled_regex
    FROM pgmq.topic_bindings b
    WHERE lower(b.queue_name) = lower(list_topic_bindings.queue_name)
    ORDER BY b.bound_at DESC, b.pattern;
$$;

CREATE FUNCTION pgmq.test_routing(routing_key text)
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


CREATE FUNCTION pgbroker._send_topic(routing_key text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE plpgsql AS $$
DECLARE
    target text;
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    PERFORM pgbroker._check_batch(msgs, headers);
    FOR target IN SELECT DISTINCT b.queue_name FROM pgbroker._topic_matches(routing_key) b ORDER BY 1 LOOP
        RETURN QUERY SELECT target, s.id FROM pgbroker._send_many(target, msgs, headers, delay) AS s(id);
    END LOOP;
END;
$$;

CREATE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, headers jsonb, delay integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    reached integer;
BEGIN
    -- Checked in pgmq's order, and before any binding is looked at: a bad
    -- call fails whether or not a queue is bound yet.
    PERFORM pgmq.validate_routing_key(routing_key);
    PERFORM pgbroker._check_arg(msg IS NOT NULL, 'msg cannot be NULL',
        'Send a JSON value; ''null''::jsonb is one.');
    SELECT count(*) INTO reached
    FROM pgbroker._send_topic(routing_key, ARRAY[msg], ARRAY[headers], pgbroker._delay_to_time(delay));
    RETURN reached;
END;
$$;

CREATE FUNCTION pgmq.send_topic(routing_key text, msg jsonb)
RETURNS integer LANGUAGE sql AS $$
    SELECT pgmq.send_topic(routing_key, msg, NULL, 0);
$$;

CREATE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, delay integer)
RETURNS integer LANGUAGE sql AS $$
    SELECT pgmq.send_topic(routing_key, msg, NULL, delay);
$$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $$
    SELECT * FROM pgbroker._send_topic(routing_key, msgs, headers, pgbroker._check_delay_time(delay));
$$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $$
    SELECT * FROM pgbroker._send_topic(routing_key, msgs, NULL, NULL);
$$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[])
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $$
    SELECT * FROM pgbroker._send_topic(routing_key, msgs, headers, NULL);
$$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $$
    SELECT * FROM pgbroker._send_topic(routing_key, msgs, NULL, pgbroker._delay_to_time(delay));
$$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $$
    SELECT * FROM pgbroker._send_topic(routing_key, msgs, NULL, pgbroker._check_delay_time(delay));
$$;

CREATE FUNCTION pgmq.send_batch_topic(routing_key text, msgs jsonb[], headers jsonb[], delay integer)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE sql AS $$
    SELECT * FROM pgbroker._send_topic(routing_key, msgs, headers, pgbroker._delay_to_time(delay));
$$;
