-- The LISTEN wake-ups' statements (_db/listen_async.py and its generated twin _db/listen.py).
-- {channel} is composed in Python as an identifier (psycopg's sql.Identifier).

-- name: listen_channel
-- Start receiving a channel's notifications on the listener's connection.
LISTEN {channel}
