-- Deduplication: a send whose x-pgbroker-dedup-key was seen is not stored again.
-- The tables and types of this concern, created once; functions/34_dedup.sql
-- holds its functions and the header that explains them.

CREATE TABLE pgbroker.dedup_keys (
    queue_name varchar NOT NULL
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    dedup_key text NOT NULL,
    msg_id bigint,                   -- NULL only inside the transaction that claims it
    sent_at timestamptz NOT NULL,
    PRIMARY KEY (queue_name, dedup_key)
);
