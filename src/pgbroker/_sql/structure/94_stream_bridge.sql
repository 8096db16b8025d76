-- Stream bridge: what an inbound bridge into a stream (pgbroker bridge in
-- --stream) needs: appending a batch with de-duplication by message id.
-- The tables and types of this concern, created once; functions/94_stream_bridge.sql
-- holds its functions and the header that explains them.

-- Inbound message ids by stream; dropped with the stream.
CREATE TABLE pgbroker.stream_inbound_seen (
    stream_name text NOT NULL REFERENCES pgbroker.stream (stream_name) ON DELETE CASCADE,
    message_id text NOT NULL,
    seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_name, message_id)
);
-- Pruning walks the oldest entries first.
CREATE INDEX stream_inbound_seen_seen_at ON pgbroker.stream_inbound_seen (seen_at);
