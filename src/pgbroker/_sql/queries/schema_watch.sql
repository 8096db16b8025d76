-- What the runtime's loops read to tell an upgrade from a bug (_db/schema_watch.py).

-- name: schema_marker
-- The transactions that last wrote pgmq's functions: only `pgbroker install` writes them (its
-- function files, all in its one transaction), and every role may read the catalog. NULL
-- without a schema pgmq.
SELECT string_agg(DISTINCT p.xmin::text, ',' ORDER BY p.xmin::text)
FROM pg_catalog.pg_proc p
WHERE p.pronamespace = pg_catalog.to_regnamespace('pgmq')
