-- Keys: API keys for the HTTP API (pgbroker serve).
--
-- pgbroker.api_keys holds only the SHA-256 of each key's token: the token
-- itself is shown once, by `pgbroker keys create`, and a stolen table grants
-- nothing. A key is scoped to queues (and streams) by glob patterns (fnmatch
-- syntax, matched in the application), to the consumer groups of its streams
-- by glob patterns too, and to operations by scopes. The application reads
-- and writes this table directly; the engine has no function for it.

CREATE TABLE pgbroker.api_keys (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL CHECK (name <> ''),
    hash        bytea NOT NULL UNIQUE CHECK (octet_length(hash) = 32),
    queues      text[] NOT NULL DEFAULT '{*}',
    scopes      text[] NOT NULL
        CHECK (cardinality(scopes) > 0 AND scopes <@ ARRAY['send', 'read', 'admin']),
    rate_per_second real CHECK (rate_per_second IS NULL OR rate_per_second > 0),  -- NULL: the server's default
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    -- Last, as the upgrade that added it (0.2.0) put it; '{*}': every group, as before it existed.
    groups      text[] NOT NULL DEFAULT '{*}'
);
