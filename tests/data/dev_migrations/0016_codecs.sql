-- pgbroker migration 0016: codecs (docs/codecs.md).
--
-- A queue's policy gets a codec, the one the clients' sends encode with when
-- not told another: json (the default: bodies stored as they always were),
-- msgpack, protobuf:<message type> or avro:<schema full name>. A binary body
-- is stored in pgmq's message column inside a JSON envelope
-- {"$pgbroker": {"codec", "content_type", "data" (base64)}}, so nothing in
-- the queue tables changes. pgbroker.queue_codec(queue) gives the setting to
-- producers (granted to the producer role).

ALTER TABLE pgbroker.queue_policy
    ADD COLUMN codec text NOT NULL DEFAULT 'json' CHECK (codec ~ '^(json|msgpack|(protobuf|avro):[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)$');
ALTER TABLE pgbroker.queue_policy ALTER COLUMN codec DROP DEFAULT;

CREATE OR REPLACE FUNCTION pgbroker.policy(queue_name text)
RETURNS pgbroker.queue_policy LANGUAGE plpgsql STABLE AS $$
DECLARE
    hit record;
    found_policy pgbroker.queue_policy;
BEGIN
    SELECT m.queue_name AS stored, p AS row INTO hit
    FROM pgmq.meta m LEFT JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
    WHERE lower(m.queue_name) = lower(policy.queue_name);
    IF NOT FOUND THEN
        PERFORM pgbroker._table(queue_name);  -- PB001/PB002, naming the problem
    END IF;
    found_policy := hit.row;
    IF found_policy.queue_name IS NULL THEN
        found_policy.queue_name := hit.stored;
        found_policy.backoff := 'exponential';
        found_policy.backoff_base_seconds := 1;
        found_policy.backoff_max_seconds := 300;
        found_policy.backoff_jitter := true;
        found_policy.ack_mode := 'archive';
        found_policy.updated_at := now();
        found_policy.codec := 'json';
        -- max_deliveries, dead_letter_queue, max_depth and the retention stay NULL: off.
    END IF;
    RETURN found_policy;
END;
$$;

DROP FUNCTION pgbroker.set_policy(text, integer, text, integer, integer, boolean, text, text, bigint, bigint,
                                  bigint);

CREATE FUNCTION pgbroker.set_policy(
    queue_name text,
    max_deliveries integer DEFAULT NULL,
    backoff text DEFAULT NULL,
    backoff_base_seconds integer DEFAULT NULL,
    backoff_max_seconds integer DEFAULT NULL,
    backoff_jitter boolean DEFAULT NULL,
    dead_letter_queue text DEFAULT NULL,
    ack_mode text DEFAULT NULL,
    max_depth bigint DEFAULT NULL,
    archive_retention_seconds bigint DEFAULT NULL,
    archive_max_rows bigint DEFAULT NULL,
    codec text DEFAULT NULL
)
RETURNS pgbroker.queue_policy LANGUAGE plpgsql AS $$
DECLARE
    p pgbroker.queue_policy;
    dlq varchar;
BEGIN
    PERFORM pgbroker._table(queue_name);
    PERFORM pgbroker._check_arg(max_deliveries IS NULL OR max_deliveries >= 0,
        format('max_deliveries must be >= 0 (0: unlimited), got %s', max_deliveries));
    PERFORM pgbroker._check_arg(backoff IS NULL OR backoff IN ('fixed', 'exponential'),
        format('backoff must be ''fixed'' or ''exponential'', got %L', backoff));
    PERFORM pgbroker._check_arg(backoff_base_seconds IS NULL OR backoff_base_seconds >= 0,
        format('backoff_base_seconds must be >= 0, got %s', backoff_base_seconds));
    PERFORM pgbroker._check_arg(backoff_max_seconds IS NULL OR backoff_max_seconds >= 0,
        format('backoff_max_seconds must be >= 0, got %s', backoff_max_seconds));
    PERFORM pgbroker._check_arg(ack_mode IS NULL OR ack_mode IN ('archive', 'delete'),
        format('ack_mode must be ''archive'' or ''delete'', got %L', ack_mode));
    PERFORM pgbroker._check_arg(max_depth IS NULL OR max_depth >= 0,
        format('max_depth must be >= 0 (0: unbounded), got %s', max_depth));
    PERFORM pgbroker._check_arg(archive_retention_seconds IS NULL OR archive_retention_seconds >= 0,
        format('archive_retention_seconds must be >= 0 (0: forever), got %s', archive_retention_seconds));
    PERFORM pgbroker._check_arg(archive_max_rows IS NULL OR archive_max_rows >= 0,
        format('archive_max_rows must be >= 0 (0: unbounded), got %s', archive_max_rows));
    PERFORM pgbroker._check_arg(codec IS NULL
            OR codec ~ '^(json|msgpack|(protobuf|avro):[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)$',
        format('codec must be json, msgpack, protobuf:<message type> or avro:<schema full name>, got %L',
               codec),
        'For example ''msgpack'' or ''avro:shop.Order'' (see docs/codecs.md).');
    IF dead_letter_queue <> '' THEN
        PERFORM pgbroker._table(dead_letter_queue);
        dlq := pgbroker._stored_name(dead_letter_queue);
        PERFORM pgbroker._check_arg(dlq <> pgbroker._stored_name(queue_name),
            'a queue cannot be its own dead-letter queue',
            'Create a separate queue, e.g. ''' || queue_name || '_dlq''.');
    END IF;

    -- Changes of one queue's policy take turns (as its create and drop do), so
    -- that two callers changing different settings both keep theirs; the read
    -- below is a new statement, so it sees the previous caller's commit.
    PERFORM pg_advisory_xact_lock(hashtext('pgbroker.queue:' || lower(queue_name)));
    p := pgbroker.policy(queue_name);
    p.max_deliveries := CASE WHEN max_deliveries = 0 THEN NULL
                             ELSE coalesce(max_deliveries, p.max_deliveries) END;
    p.backoff := coalesce(backoff, p.backoff);
    p.backoff_base_seconds := coalesce(backoff_base_seconds, p.backoff_base_seconds);
    p.backoff_max_seconds := coalesce(backoff_max_seconds, p.backoff_max_seconds);
    p.backoff_jitter := coalesce(backoff_jitter, p.backoff_jitter);
    p.dead_letter_queue := CASE WHEN dead_letter_queue = '' THEN NULL
                                ELSE coalesce(dlq, p.dead_letter_queue) END;
    p.ack_mode := coalesce(ack_mode, p.ack_mode);
    p.max_depth := CASE WHEN max_depth = 0 THEN NULL ELSE coalesce(max_depth, p.max_depth) END;
    p.archive_retention_seconds := CASE WHEN archive_retention_seconds = 0 THEN NULL
                                        ELSE coalesce(archive_retention_seconds, p.archive_retention_seconds) END;
    p.archive_max_rows := CASE WHEN archive_max_rows = 0 THEN NULL
                               ELSE coalesce(archive_max_rows, p.archive_max_rows) END;
    p.codec := coalesce(codec, p.codec);
    PERFORM pgbroker._check_arg(p.backoff_max_seconds >= p.backoff_base_seconds,
        format('backoff_max_seconds (%s) must be >= backoff_base_seconds (%s)',
               p.backoff_max_seconds, p.backoff_base_seconds),
        'Exponential back-off doubles from the base up to the max; fixed back-off uses the base.');
    p.updated_at := now();

    INSERT INTO pgbroker.queue_policy VALUES (p.*)
    ON CONFLICT ON CONSTRAINT queue_policy_pkey DO UPDATE SET
        max_deliveries = EXCLUDED.max_deliveries,
        backoff = EXCLUDED.backoff,
        backoff_base_seconds = EXCLUDED.backoff_base_seconds,
        backoff_max_seconds = EXCLUDED.backoff_max_seconds,
        backoff_jitter = EXCLUDED.backoff_jitter,
        dead_letter_queue = EXCLUDED.dead_letter_queue,
        ack_mode = EXCLUDED.ack_mode,
        max_depth = EXCLUDED.max_depth,
        archive_retention_seconds = EXCLUDED.archive_retention_seconds,
        archive_max_rows = EXCLUDED.archive_max_rows,
        updated_at = EXCLUDED.updated_at,
        codec = EXCLUDED.codec;
    RETURN p;
END;
$$;

CREATE FUNCTION pgbroker.queue_codec(queue_name text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT p.codec FROM pgbroker.queue_policy p
                     WHERE lower(p.queue_name) = lower(queue_codec.queue_name)), 'json');
$$;

INSERT INTO pgbroker.role_function (role_kind, function_schema, function_name)
VALUES ('producer', 'pgbroker', 'queue_codec');
