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

-- Idempotency keys of sends (the HTTP header Idempotency-Key): a request's
-- key, a digest of what it sent, and the msg_ids it got, kept in the send's
-- own transaction until expires_at (functions/34_dedup.sql). A key is the
-- sender's within its scope ('' for none; the HTTP API's is the API key), so
-- one sender's keys never answer or refuse another's.
CREATE TABLE pgbroker.idempotency_keys (
    queue_name varchar NOT NULL
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    scope text NOT NULL DEFAULT '',
    idempotency_key text NOT NULL,
    request_digest bytea NOT NULL,
    ids bigint[] NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue_name, scope, idempotency_key)
);
