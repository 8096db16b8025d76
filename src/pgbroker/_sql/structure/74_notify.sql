-- Notify: NOTIFY on insert, pgmq's enable_notify_insert family.
-- The tables and types of this concern, created once; functions/74_notify.sql
-- holds its functions and the header that explains them.

-- A queue's throttle; its row exists while notify is enabled on the queue.
CREATE TABLE pgmq.notify_insert_throttle (
    queue_name VARCHAR UNIQUE NOT NULL
        CONSTRAINT notify_insert_throttle_meta_queue_name_fk
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE,
    throttle_interval_ms INTEGER NOT NULL DEFAULT 0,
    -- The epoch means "never", as in pgmq, whose clients read a timestamp here.
    last_notified_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT to_timestamp(0)
);
