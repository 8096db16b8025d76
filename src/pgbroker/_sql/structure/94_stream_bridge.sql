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

-- An inbound bridge into a stream produces, and prunes what it recorded, as one into a queue
-- (structure/88_roles.sql).
INSERT INTO pgbroker.role_function (role_kind, function_schema, function_name)
SELECT 'producer', 'pgbroker', f FROM unnest(ARRAY['stream_receive_many', 'prune_stream_inbound_seen']) f;
