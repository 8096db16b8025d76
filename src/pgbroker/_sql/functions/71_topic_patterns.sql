-- Topic patterns: validating routing keys and patterns, and the regular
-- expressions a pattern compiles to (72_topics.sql explains topics).
--
-- Apart from 72_topics.sql because structure/72_topics.sql needs them:
-- pgmq.topic_bindings checks its patterns and computes its regexes with these
-- functions, so they exist before the tables are created.
--
-- Validation accepts and rejects exactly what pgmq does, with its messages
-- and SQLSTATE (P0001); pgbroker's code (PB007) and a hint ride in DETAIL
-- and HINT.

-- The rules keys and patterns share; charset is a bracket expression body.
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

-- true for a valid routing key, else pgmq's error.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.validate_routing_key(routing_key text)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    PERFORM pgbroker._check_topic_text('routing_key', routing_key, 'a-zA-Z0-9._-',
        'alphanumeric, dots, hyphens, and underscores');
    RETURN true;
END;
$$;

-- true for a valid pattern, else pgmq's error.
-- Since: 0.1.0
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

-- The regular expression a valid pattern compiles to, as pgmq compiles it:
-- dots literal, '*' one or more characters other than a dot, '#' any
-- characters; matched against the whole routing key. A valid pattern has no
-- other regex metacharacter, so nothing else needs escaping.
CREATE OR REPLACE FUNCTION pgbroker._topic_regex(pattern text)
RETURNS text LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT '^' || replace(replace(replace(pattern, '.', '\.'), '*', '[^.]+'), '#', '.*') || '$';
$$;

-- The regular expression of an AMQP binding (pgbroker.bind_topic_amqp): a
-- '#' word is zero or more words. It takes one of its dots with it, so that
-- it can stand for no word at all: leading '#.' is (word.)*, any later '.#'
-- is (.word)*. A wildcard inside a word ('user-*', 'a#') keeps pgmq's meaning.
CREATE OR REPLACE FUNCTION pgbroker._topic_regex_amqp(pattern text)
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
