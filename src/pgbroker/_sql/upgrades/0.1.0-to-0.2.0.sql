-- From 0.1.0 to 0.2.0: what this release changes in tables and types, and a
-- DROP for each function it removes or re-signatures. Each change is its own
-- block, with the reason; the installer then re-applies the function files.

-- Idempotent sends (issue 23, item 4): the HTTP header Idempotency-Key and
-- pgbroker.send_idempotent keep each key's request digest and msg_ids
-- (structure/34_dedup.sql); a producer may call it (structure/88_roles.sql).
CREATE TABLE pgbroker.idempotency_keys (
    queue_name varchar NOT NULL
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    idempotency_key text NOT NULL,
    request_digest bytea NOT NULL,
    msg_ids bigint[] NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue_name, idempotency_key)
);
INSERT INTO pgbroker.role_function (role_kind, function_schema, function_name)
VALUES ('producer', 'pgbroker', 'send_idempotent');
