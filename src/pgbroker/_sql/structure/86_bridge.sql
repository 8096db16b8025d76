-- Bridge: what the RabbitMQ bridge (pgbroker.bridge) needs, beyond pgmq.
-- The tables and types of this concern, created once; functions/86_bridge.sql
-- holds its functions and the header that explains them.

-- Inbound message ids by queue; dropped with the queue.
CREATE TABLE pgbroker.inbound_seen (
    queue_name varchar NOT NULL REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE,
    message_id text NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_name, message_id)
);
-- Pruning walks the oldest entries first.
CREATE INDEX inbound_seen_seen_at ON pgbroker.inbound_seen (seen_at);
