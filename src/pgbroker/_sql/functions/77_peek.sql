-- Peek: look at a queue's messages without changing them.
--
-- A peek is a plain SELECT: no read_ct increment, no lease, no row lock (not
-- even FOR SHARE), so it never delays a consumer and a consumer never delays
-- it. It sees what a read would see and more: every message of the queue
-- with the state it is in now, or the queue's dead letters, filtered and
-- paged by msg_id (keyset paging: pass the last msg_id of a page as
-- after_msg_id to get the next one). A page walks the primary key from
-- after_msg_id, so without filters it costs the same however deep it is;
-- a filter that few messages match walks past the others (a peek is for
-- looking, not for a hot path).
--
-- States (of a message of the queue, at the time of the peek):
--   waiting    visible: a read would deliver it (never delivered, or its
--              visibility timeout ran out);
--   delayed    sent with a delay that has not passed yet (read_ct = 0);
--   in_flight  delivered and still invisible: leased by a consumer, or
--              nacked and waiting out its back-off;
--   dead       a dead letter of this queue (65_failures.sql): in its policy's
--              dead-letter queue, or in its archive; msg_ids are those the
--              letters had in the queue, as pgbroker.dead_letters gives them.
-- state NULL returns the queue's messages in every state but dead.

-- Up to qty messages with after_msg_id < msg_id <= before_msg_id (NULL: no
-- upper bound), oldest first, in the given state (NULL: waiting, delayed and
-- in flight), with header header_key (and, when header_value is given, that
-- header's text equal to it), enqueued at or after enqueued_after and before
-- enqueued_before, and whose body contains message_contains (jsonb @>: a
-- search by body field, such as {"sku": "A-001"}).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.peek(
    queue_name text, qty integer DEFAULT 10, after_msg_id bigint DEFAULT 0,
    state text DEFAULT NULL, before_msg_id bigint DEFAULT NULL,
    header_key text DEFAULT NULL, header_value text DEFAULT NULL,
    enqueued_after timestamptz DEFAULT NULL, enqueued_before timestamptz DEFAULT NULL,
    message_contains jsonb DEFAULT NULL)
RETURNS SETOF pgbroker.peeked_message LANGUAGE plpgsql STABLE AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    source text;
    id_of text := 'msg_id';
    state_of text;
    letters_of text;
BEGIN
    PERFORM pgbroker._check_read_args(0, qty);
    PERFORM pgbroker._check_arg(state IS NULL OR state IN ('waiting', 'delayed', 'in_flight', 'dead'),
        format('unknown message state %L', state),
        'States: waiting, delayed, in_flight, dead (or none: every state but dead).');
    PERFORM pgbroker._check_arg(header_value IS NULL OR header_key IS NOT NULL,
        'header_value needs header_key', 'Name the header whose value to match.');
    IF state = 'dead' THEN
        source := pgbroker._dead_letter_table(pgbroker.policy(queue_name));
        state_of := '''dead''';
        id_of := 'pgbroker._letter_id(headers)';
        letters_of := pgbroker._stored_name(queue_name);
    ELSE
        source := pgbroker._table(queue_name);
        state_of := 'CASE WHEN vt <= now() THEN ''waiting'' WHEN read_ct = 0 THEN ''delayed'''
                    ' ELSE ''in_flight'' END';
    END IF;
    -- Static text but for the table, the id and state expressions: each filter
    -- is off when its parameter is NULL, and the scan of a queue follows the
    -- primary key.
    RETURN QUERY EXECUTE format(
        $Q$
        SELECT * FROM (
            SELECT %s AS msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers, %s AS state
            FROM pgmq.%I
            WHERE %1$s > $1 AND ($2::bigint IS NULL OR %1$s <= $2)
              AND ($3::text IS NULL OR headers ? $3)
              AND ($4::text IS NULL OR headers ->> $3 = $4)
              AND ($5::timestamptz IS NULL OR enqueued_at >= $5)
              AND ($6::timestamptz IS NULL OR enqueued_at < $6)
              AND ($8::text IS NULL OR headers -> 'x-pgbroker-dead-letter' ->> 'queue' = $8)
              AND ($10::jsonb IS NULL OR message @> $10)
        ) m
        WHERE $9::text IS NULL OR $9 = 'dead' OR m.state = $9
        ORDER BY msg_id LIMIT $7
        $Q$, id_of, state_of, source)
    USING coalesce(after_msg_id, 0), before_msg_id, header_key, header_value, enqueued_after,
          enqueued_before, qty, letters_of, state, message_contains;
END;
$$;
