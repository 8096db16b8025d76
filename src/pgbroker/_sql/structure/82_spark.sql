-- Spark: what the PySpark connector (pgbroker.spark) keeps in the database.
-- The tables and types of this concern, created once; functions/82_spark.sql
-- holds its functions and the header that explains them.

------------------------------------------------------------------------------
-- Claim mode
------------------------------------------------------------------------------

-- A claim-mode reader: one per streaming query, named by the query's owner
-- and bound to one queue. released_seq is the last claim acknowledged: a new
-- checkpoint starts after it.
CREATE TABLE pgbroker.spark_consumers (
    consumer text PRIMARY KEY,
    queue_name varchar NOT NULL
        CONSTRAINT spark_consumers_meta_queue_name_fk
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    released_seq bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- One micro-batch of a consumer. msg_ids (ascending) never change: they are
-- what a replay of the batch reads, and what the batch's partitions are cut
-- from. receipts[i] is the current lease on msg_ids[i], NULL once it was lost
-- (it ran out and another consumer took the message): a lost message is no
-- longer part of the batch.
CREATE TABLE pgbroker.spark_claims (
    consumer text NOT NULL
        REFERENCES pgbroker.spark_consumers (consumer) ON DELETE CASCADE,
    seq bigint NOT NULL,
    msg_ids bigint[] NOT NULL,
    receipts text[] NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    renewed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, seq),
    CHECK (cardinality(msg_ids) = cardinality(receipts))
);

------------------------------------------------------------------------------
-- Exactly-once sink
------------------------------------------------------------------------------

-- One row per written partition of a micro-batch (or of a batch write, whose
-- query_id is 'batch:<uuid>' and batch_id 0), inserted in the transaction
-- that sends the partition's messages.
CREATE TABLE pgbroker.spark_sink_commits (
    query_id text NOT NULL,
    batch_id bigint NOT NULL,
    partition_id integer NOT NULL,
    queue_name text NOT NULL,
    messages bigint NOT NULL DEFAULT 0,
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (query_id, batch_id, partition_id)
);
