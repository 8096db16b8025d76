-- The statements of the sessions view (pgbroker._db.sessions): what holds the engine up.

-- name: blocking_sessions
-- The sessions whose transaction, open longer than %s seconds, holds the engine's tables or the xmin horizon.
SELECT pid, role_name, application_name, client_addr::text, state, transaction_age_sec, state_age_sec, tables,
       holds_horizon, query
FROM pgbroker.blocking_sessions(make_interval(secs => %s))
