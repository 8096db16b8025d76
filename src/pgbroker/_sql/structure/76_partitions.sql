-- Partitions: partitioned queues with pg_partman, and retention that never
-- drops a message nobody has processed.
-- The tables and types of this concern, created once; functions/76_partitions.sql
-- holds its functions and the header that explains them.

-- The queue table's retention ('100000' messages or '7 days'); NULL keeps
-- every partition. Used only by pgbroker.run_maintenance.
CREATE TABLE pgbroker.partition_retention (
    queue_name VARCHAR PRIMARY KEY
        CONSTRAINT partition_retention_meta_queue_name_fk
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    retention TEXT
);

------------------------------------------------------------------------------
-- pg_partman at run time
------------------------------------------------------------------------------

-- Where pg_partman lives and its major version (4 or 5).
CREATE TYPE pgbroker.partman AS (schema_name text, major integer);
