-- pgbroker's engine, written once (PgQ's layout).
--
-- structure/NN_<concern>.sql  schemas, tables, types, indexes, seed rows: run
--                             once, when pgbroker is installed into a new
--                             database.
-- functions/NN_<concern>.sql  every function, procedure, view and trigger
--                             (CREATE OR REPLACE), with the REVOKEs and the
--                             calls that regenerate the route functions: run
--                             at that install, and again by every install or
--                             upgrade that finds them changed (a checksum of
--                             these files is kept in pgbroker.schema_functions).
-- upgrades/<from>-to-<to>.sql what a release changes in tables and types, and
--                             the DROP of each function it removes or
--                             re-signatures; never a function body.
--
-- A new database runs the files in the order of their prefixes, structure/NN
-- before functions/NN; so a table may use the functions of an earlier file
-- (71_topic_patterns.sql exists for structure/72_topics.sql). To change what
-- a function does, edit it here: nothing else. A change to a table or type
-- also needs its upgrade (read src/pgbroker/sql/__init__.py); the migration
-- test proves that an upgraded database equals a new one, catalog and
-- function bodies included, and docs/reference/schema.sql (make schema-dump)
-- shows the whole result in review.
--
-- The installer's own bookkeeping, pgbroker.schema_version and
-- pgbroker.schema_functions, is created by install.py before these files run.
--
-- Concerns: 10 queues, 14 scope patterns, 15 scopes (queue grants),
-- 20 policies, 30 sends, 32 priorities, 34 dedup, 40 receipts, 50 reads,
-- 56 limits, 60 acks, 65 failures (dead letters), 70 FIFO groups, 71 topic
-- patterns, 72 topics, 74 notify, 76 partitions, 77 peek, 78 schedules,
-- 80 stats, 82 spark, 84 keys, 86 bridge, 88 roles, 90 routes, 92 streams,
-- 94 stream bridge and stream spark.
--
-- Queues: the tables and types behind pgmq's SQL contract; functions/10_queues.sql
-- explains them.

CREATE SCHEMA pgmq;
-- install.py creates it first, for its bookkeeping.
CREATE SCHEMA IF NOT EXISTS pgbroker;

CREATE TABLE pgmq.meta (
    queue_name VARCHAR UNIQUE NOT NULL,
    is_partitioned BOOLEAN NOT NULL,
    is_unlogged BOOLEAN NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL
);
-- pgmq maps 'Orders' and 'orders' to the same tables; pgbroker refuses the
-- second name instead (and finds the queue whatever case a caller uses).
CREATE UNIQUE INDEX meta_queue_name_lower_key ON pgmq.meta (lower(queue_name));

-- pg_monitor sees which queues exist and their sequences (how many messages
-- each was sent), but not the queue and archive tables: pgmq grants it
-- SELECT on every table of the schema, which lets every member of
-- pg_monitor (a role given to monitoring agents) read every payload.
-- pgbroker makes that an operator's choice, off by default
-- (pgbroker.grant_pg_monitor_payloads, functions/10_queues.sql). Lengths and
-- ages need no payload: they come from the monitor role's functions
-- (88_roles.sql; GRANT pgbroker_monitor TO pg_monitor gives them to
-- pg_monitor's members).
GRANT USAGE ON SCHEMA pgmq TO pg_monitor;
GRANT SELECT ON pgmq.meta TO pg_monitor;
GRANT SELECT ON ALL SEQUENCES IN SCHEMA pgmq TO pg_monitor;
ALTER DEFAULT PRIVILEGES IN SCHEMA pgmq GRANT SELECT ON SEQUENCES TO pg_monitor;

-- The field order of these types is part of the contract.
CREATE TYPE pgmq.message_record AS (
    msg_id BIGINT,
    read_ct INTEGER,
    enqueued_at TIMESTAMP WITH TIME ZONE,
    last_read_at TIMESTAMP WITH TIME ZONE,
    vt TIMESTAMP WITH TIME ZONE,
    message JSONB,
    headers JSONB
);

CREATE TYPE pgmq.queue_record AS (
    queue_name VARCHAR,
    is_partitioned BOOLEAN,
    is_unlogged BOOLEAN,
    created_at TIMESTAMP WITH TIME ZONE
);

CREATE TYPE pgmq.metrics_result AS (
    queue_name text,
    queue_length bigint,
    newest_msg_age_sec int,
    oldest_msg_age_sec int,
    total_messages bigint,
    scrape_time timestamp with time zone,
    queue_visible_length bigint,
    default_partition_length bigint
);
