-- Stream bridge: what an inbound bridge into a stream (pgbroker bridge in
-- --stream) needs: appending a batch with de-duplication by message id.
--
-- As pgbroker.receive_many does for a queue (86_bridge.sql): the messages
-- whose message id the stream has not seen within the window are appended
-- (stream_send_many, with their keys), and their ids recorded, in one
-- transaction; so a broker's redelivery after a crash between the Postgres
-- commit and the broker's ack is recognised and appended nothing. The ids of
-- a stream are kept apart from those of queues (a stream is not in
-- pgmq.meta) and go with the stream. An outbound bridge needs nothing new: it
-- reads through a consumer group and acks after the broker's confirm.

-- Append the messages whose message_id (messages[n] has message_ids[n], and
-- headers[n], keys[n]) the stream has not seen within seen_within; record
-- them as seen. Returns (message_id, id) for each appended message, in order;
-- the others were duplicates. A NULL message_id is always appended. Two
-- transactions receiving the same id take turns on its row, so a redelivery
-- racing the first delivery is still appended once.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.stream_receive_many(
    stream_name text, message_ids text[], messages jsonb[], headers jsonb[], keys text[],
    seen_within interval)
RETURNS TABLE (message_id text, id bigint) LANGUAGE plpgsql AS $$
DECLARE
    s pgbroker.stream := pgbroker._stream_row(stream_name);
    fresh_ids text[];
    fresh_messages jsonb[];
    fresh_headers jsonb[];
    fresh_keys text[];
BEGIN
    PERFORM pgbroker._check_arg(cardinality(message_ids) = cardinality(messages)
                                AND cardinality(headers) = cardinality(messages)
                                AND cardinality(keys) = cardinality(messages),
        'message_ids, messages, headers and keys must have one entry per message');
    PERFORM pgbroker._check_arg(seen_within IS NOT NULL AND seen_within >= interval '0',
        format('seen_within must be an interval >= 0, got %s', coalesce(seen_within::text, 'NULL')));

    WITH batch AS (
        SELECT b.mid, b.msg, b.hdr, b.k, b.n
        FROM unnest(message_ids, messages, headers, keys) WITH ORDINALITY AS b(mid, msg, hdr, k, n)
    ),
    -- The first of equal ids in one batch stands for all of them.
    firsts AS (
        SELECT DISTINCT ON (batch.mid) batch.mid, batch.n FROM batch WHERE batch.mid IS NOT NULL
        ORDER BY batch.mid, batch.n
    ),
    claimed AS (
        INSERT INTO pgbroker.stream_inbound_seen AS seen (stream_name, message_id, seen_at)
        SELECT s.stream_name, firsts.mid, now() FROM firsts ORDER BY firsts.mid
        ON CONFLICT ON CONSTRAINT stream_inbound_seen_pkey DO UPDATE SET seen_at = EXCLUDED.seen_at
            WHERE seen.seen_at < now() - seen_within
        RETURNING seen.message_id AS mid
    ),
    fresh AS (
        SELECT f.n FROM firsts f JOIN claimed c ON c.mid = f.mid
    )
    SELECT array_agg(b.mid ORDER BY b.n), array_agg(b.msg ORDER BY b.n), array_agg(b.hdr ORDER BY b.n),
           array_agg(b.k ORDER BY b.n)
    INTO fresh_ids, fresh_messages, fresh_headers, fresh_keys
    FROM batch b
    WHERE b.mid IS NULL OR b.n IN (SELECT fresh.n FROM fresh);
    IF fresh_ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM unnest(fresh_ids, ARRAY(
        SELECT pgbroker.stream_send_many(s.stream_name, fresh_messages, fresh_headers, fresh_keys)));
END;
$$;

-- Forget stream inbound message ids seen longer than seen_within ago, of one
-- stream or (stream_name NULL) of all, at most batch_size per call; returns
-- how many went. Callers repeat until 0. An inbound bridge prunes its own
-- stream's: another's bridge may keep its ids longer.
-- Errors: PB020 for a stream that does not exist.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.prune_stream_inbound_seen(seen_within interval, batch_size integer DEFAULT 10000,
                                                   stream_name text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    stored text;
    pruned bigint;
BEGIN
    PERFORM pgbroker._check_prune_args(seen_within, batch_size);
    IF stream_name IS NOT NULL THEN
        stored := (pgbroker._stream_row(stream_name)).stream_name;
    END IF;
    DELETE FROM pgbroker.stream_inbound_seen WHERE (stream_inbound_seen.stream_name, message_id) IN (
        SELECT seen.stream_name, seen.message_id FROM pgbroker.stream_inbound_seen seen
        WHERE seen.seen_at < now() - seen_within AND (stored IS NULL OR seen.stream_name = stored)
        ORDER BY seen.seen_at LIMIT batch_size);
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$$;
