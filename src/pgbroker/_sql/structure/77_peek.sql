-- Peek: look at a queue's messages without changing them.
-- The tables and types of this concern, created once; functions/77_peek.sql
-- holds its functions and the header that explains them.

CREATE TYPE pgbroker.peeked_message AS (
    msg_id bigint,
    read_ct integer,
    enqueued_at timestamptz,
    last_read_at timestamptz,
    vt timestamptz,
    message jsonb,
    headers jsonb,
    state text
);
