-- Receipts: what fences acknowledgement, beyond pgmq.
-- The tables and types of this concern, created once; functions/40_receipts.sql
-- holds its functions and the header that explains them.

-- A delivered message: pgmq.message_record's fields and the receipt.
CREATE TYPE pgbroker.delivery AS (
    msg_id BIGINT,
    read_ct INTEGER,
    enqueued_at TIMESTAMP WITH TIME ZONE,
    last_read_at TIMESTAMP WITH TIME ZONE,
    vt TIMESTAMP WITH TIME ZONE,
    message JSONB,
    headers JSONB,
    receipt TEXT
);
