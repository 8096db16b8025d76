-- The HTTP API's keys (pgbroker.api_keys): the key commands of _db/api_keys.py and the
-- server's authentication (http/auth.py). A key's hash is stored, never its token.

-- name: key_next_id
-- Take the next key id first: it is part of the token, whose hash the row stores.
SELECT nextval(pg_get_serial_sequence('pgbroker.api_keys', 'id'))

-- name: key_insert
-- Store a new key under the id taken before, with its token's hash.
INSERT INTO pgbroker.api_keys (id, name, hash, queues, groups, scopes, rate_per_second)
OVERRIDING SYSTEM VALUE VALUES (%s, %s, %s, %s, %s, %s, %s)
RETURNING id, name, queues, groups, scopes, rate_per_second, created_at, revoked_at

-- name: key_list
-- Every key, the revoked ones too when asked.
SELECT id, name, queues, groups, scopes, rate_per_second, created_at, revoked_at
FROM pgbroker.api_keys
WHERE %s OR revoked_at IS NULL
ORDER BY id

-- name: key_revoke
-- Revoke a key that is not revoked yet.
UPDATE pgbroker.api_keys SET revoked_at = now() WHERE id = %s AND revoked_at IS NULL

-- name: key_for_authentication
-- A key by id with its hash, for the server to check a token against; and what the database's
-- lower() makes of A-Z, as it does of queue names (not a-z under every collation: a Turkish one
-- folds I to a dotless i), which the key's patterns must fold alike.
SELECT hash, id, name, queues, groups, scopes, rate_per_second, created_at, revoked_at,
       lower('ABCDEFGHIJKLMNOPQRSTUVWXYZ')
FROM pgbroker.api_keys
WHERE id = %s
