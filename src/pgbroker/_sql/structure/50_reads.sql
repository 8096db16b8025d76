-- Reads: what a read may take, the hot statements, and where reads start.
-- The tables and types of this concern, created once; functions/50_reads.sql
-- holds its functions and the header that explains them.

-- A queue's read bounds, insert-only: an advance appends a row and removes
-- the one it replaced, and the bounds are the queue's row with the highest
-- seq, found by an index walk backwards (functions/50_reads.sql, "Where reads
-- start", says why: an UPDATE left versions that a held horizon keeps).
CREATE SEQUENCE pgbroker.queue_head_seq;
CREATE TABLE pgbroker.queue_head (
    queue_name varchar NOT NULL
        REFERENCES pgmq.meta (queue_name) ON DELETE CASCADE ON UPDATE CASCADE,
    -- no ready message has a smaller msg_id
    ready_from bigint NOT NULL,
    -- the candidate of the next advance: msg_ids up to next_from were taken by
    -- transactions older than next_xmax
    next_from bigint,
    next_xmax xid8,
    -- no timed message has a smaller vt (NULL: no bound yet)
    timed_from timestamptz,
    -- the candidate of the next advance: timed rows with a vt below timed_next
    -- were written by transactions older than timed_next_xmax
    timed_next timestamptz,
    timed_next_xmax xid8,
    -- when the last sweep below timed_from ran
    timed_swept_at timestamptz,
    -- when the ready candidate was taken, and the queue's writers found since
    -- for each candidate (the step that does not wait for the whole horizon)
    next_at timestamptz,
    next_writers text[],
    timed_next_writers text[],
    seq bigint NOT NULL DEFAULT nextval('pgbroker.queue_head_seq'),
    PRIMARY KEY (queue_name, seq)
);
