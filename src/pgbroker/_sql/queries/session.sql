-- What a pool of pgbroker's sets on each connection it opens (_db/session.py).

-- name: session_zone_utc
-- A session in UTC under another name (Etc/UTC, ...) named plain UTC: the same zone, which
-- psycopg reads timestamps in on its fast path.
SET TimeZone = 'UTC'
