-- From 0.1.0 to 0.2.0: what this release changes in tables and types, and a
-- DROP for each function it removes or re-signatures. Each change is its own
-- block, with the reason; the installer then re-applies the function files.

-- Idempotent sends (issue 23, item 4): the HTTP header Idempotency-Key,
-- pgbroker.send_idempotent and pgbroker.stream_send_idempotent keep each
-- key's request digest and ids (structure/34_dedup.sql, 92_streams.sql); a
-- producer may call them (structure/88_roles.sql, 92_streams.sql).
CREATE TABLE pgbroker.idempotency_keys (
    queue_name varchar NOT NULL
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    idempotency_key text NOT NULL,
    request_digest bytea NOT NULL,
    ids bigint[] NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue_name, idempotency_key)
);
CREATE TABLE pgbroker.stream_idempotency_keys (
    stream_name text NOT NULL REFERENCES pgbroker.stream ON DELETE CASCADE,
    idempotency_key text NOT NULL,
    request_digest bytea NOT NULL,
    ids bigint[] NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (stream_name, idempotency_key)
);
INSERT INTO pgbroker.role_function (role_kind, function_schema, function_name)
VALUES ('producer', 'pgbroker', 'send_idempotent'), ('producer', 'pgbroker', 'stream_send_idempotent');
