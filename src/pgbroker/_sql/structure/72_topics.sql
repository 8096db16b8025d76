-- Topics: sends by routing key to bound queues (pgmq 1.13 bind_topic, ...).
-- The tables and types of this concern, created once; functions/72_topics.sql
-- holds its functions and the header that explains them.

------------------------------------------------------------------------------
-- Bindings
------------------------------------------------------------------------------

CREATE TABLE pgmq.topic_bindings (
    pattern text NOT NULL
        -- Also guards direct inserts: a malformed pattern would compile to a
        -- regex that breaks every send_topic.
        CONSTRAINT topic_bindings_pattern_check CHECK (pgmq.validate_topic_pattern(pattern)),
    queue_name text NOT NULL
        CONSTRAINT topic_bindings_queue_name_fkey REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE,
    bound_at timestamptz NOT NULL DEFAULT now(),
    -- Compiled once here rather than on every send.
    compiled_regex text GENERATED ALWAYS AS (pgbroker._topic_regex(pattern)) STORED,
    CONSTRAINT topic_bindings_pattern_queue_name_key UNIQUE (pattern, queue_name)
);
-- For the cascade when a queue is dropped, and for listing one queue's bindings.
CREATE INDEX topic_bindings_queue_name_idx ON pgmq.topic_bindings (queue_name);

-- The bindings whose '#' is AMQP's (zero or more words), with the regex they
-- match by instead of pgmq's. Unbinding or dropping the queue removes the row.
CREATE TABLE pgbroker.topic_amqp_bindings (
    pattern text NOT NULL,
    queue_name text NOT NULL,
    compiled_regex text GENERATED ALWAYS AS (pgbroker._topic_regex_amqp(pattern)) STORED,
    PRIMARY KEY (pattern, queue_name),
    CONSTRAINT topic_amqp_bindings_binding_fkey FOREIGN KEY (pattern, queue_name)
        REFERENCES pgmq.topic_bindings (pattern, queue_name) ON DELETE CASCADE ON UPDATE CASCADE
);
