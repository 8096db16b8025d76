-- The demo's checks (demo/): counted straight from the tables, not through pgbroker's functions,
-- so a check trusts nothing it checks. {archive}, {queue} and {table} are composed in Python as
-- identifiers.

-- name: demo_orders_balance
-- How many of the sent ids are archived, and how many messages are still queued.
SELECT (SELECT count(*) FROM pgmq.{archive} WHERE msg_id = ANY(%s)),
       (SELECT count(*) FROM pgmq.{queue})

-- name: demo_stream_stored
-- How many events a stream's table holds.
SELECT count(*) FROM pgbroker.{table}

-- name: demo_queue_stored
-- How many messages a queue's table holds.
SELECT count(*) FROM pgmq.{queue}
