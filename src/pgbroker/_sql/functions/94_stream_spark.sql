-- Spark reading a stream by offsets (pgbroker.spark.stream_source).
--
-- A Spark streaming query is a consumer group of its own. It does not read
-- through stream_read (whose delivered_id and leases serve consumers that
-- keep no state): Spark keeps its offsets, one id per partition, in its
-- checkpoint, and a micro-batch is every row with start < id <= end in each
-- partition. Ends never pass the stream's safe id (92_streams.sql), so every
-- row of a range is settled when the range is planned, and a replay after a
-- crash reads the same rows. Once Spark has committed a batch, its ends
-- become the group's acked_id (spark_stream_commit): lag, and retention's
-- "every group has passed", see the query like any consumer, and never
-- before its output is committed.

-- Refuse a group that live consumers (stream_read callers) share: their
-- leases and Spark's offsets would move the same cursors.
CREATE OR REPLACE FUNCTION pgbroker._spark_stream_alone(g pgbroker.stream_group)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    others text;
BEGIN
    SELECT string_agg(c.consumer, ', ' ORDER BY c.consumer) INTO others FROM pgbroker.stream_consumer c
    WHERE c.stream_name = g.stream_name AND c.group_name = g.group_name AND c.expires_at > now();
    PERFORM pgbroker._check_arg(others IS NULL,
        format('group "%s" of stream "%s" has live consumers (%s): a Spark query needs a group of its own',
               g.group_name, g.stream_name, others),
        'Name another group in option group (it is made at the query''s first start).');
END;
$$;

-- Where a Spark query reading the group starts: the group's acked_id per
-- partition. The group is made when missing, from the start of the stream
-- or its end (start_from as in create_stream_group).
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_stream_start(stream_name text, group_name text, start_from text DEFAULT 'start')
RETURNS TABLE (partition integer, acked_id bigint) LANGUAGE plpgsql AS $$
DECLARE
    g pgbroker.stream_group := pgbroker.create_stream_group(stream_name, group_name, start_from);
BEGIN
    PERFORM pgbroker._spark_stream_alone(g);
    RETURN QUERY SELECT c.partition, p.acked_id FROM pgbroker.stream_cursor c
    CROSS JOIN LATERAL pgbroker._stream_positions(c.stream_name, c.group_name, ARRAY[c.partition]) p
    WHERE c.stream_name = g.stream_name AND c.group_name = g.group_name ORDER BY c.partition;
END;
$$;

-- The stream's safe id, advanced one step if it can be (see _stream_safe_id),
-- and the candidate still waiting for its writers to end (NULL: none). A
-- caller that wants the newest bound calls again until safe_id reaches the
-- candidate it first saw.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_stream_bound(stream_name text)
RETURNS TABLE (safe_id bigint, candidate_id bigint) LANGUAGE plpgsql AS $$
DECLARE
    s pgbroker.stream := pgbroker._stream_row(stream_name);
BEGIN
    -- The ring first, as every reader of the watermark (92_streams.sql).
    LOCK TABLE pgbroker.stream_position, pgbroker.stream_watermark IN ACCESS SHARE MODE;
    safe_id := pgbroker._stream_safe_id(s.stream_name);
    SELECT w.candidate_id INTO candidate_id FROM pgbroker._stream_watermark(s.stream_name) w;
    RETURN NEXT;
END;
$$;

-- Spark committed the batch ending at ids (one per partition): the group's
-- cursors move there. Cumulative and idempotent (greatest), because Spark may
-- skip a commit call or repeat one. Returns how many cursors moved.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.spark_stream_commit(stream_name text, group_name text, partitions integer[], ids bigint[])
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    g pgbroker.stream_group := pgbroker._stream_group_row(stream_name, group_name);
    held integer[];
    moved integer[];
    acked bigint[];
    delivered bigint[];
BEGIN
    PERFORM pgbroker._check_arg(cardinality(partitions) = cardinality(ids),
        'partitions and ids must have one entry per partition');
    PERFORM pgbroker._spark_stream_alone(g);
    -- The ring, then the cursor rows locked, then the positions read and appended
    -- (92_streams.sql, "Positions").
    LOCK TABLE pgbroker.stream_position IN ACCESS SHARE MODE;
    SELECT array_agg(x.partition) INTO held
    FROM (SELECT t.partition FROM pgbroker.stream_cursor t
          WHERE t.stream_name = g.stream_name AND t.group_name = g.group_name AND t.partition = ANY (partitions)
          ORDER BY t.partition FOR UPDATE) x;
    SELECT array_agg(w.partition ORDER BY w.partition), array_agg(w.id ORDER BY w.partition),
           array_agg(greatest(p.delivered_id, w.id) ORDER BY w.partition)
    INTO moved, acked, delivered
    FROM unnest(partitions, ids) AS w(partition, id)
    JOIN pgbroker._stream_positions(g.stream_name, g.group_name, held) p ON p.partition = w.partition
    WHERE p.acked_id < w.id;
    IF moved IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM pgbroker._stream_positions_append(g.stream_name, g.group_name, moved, acked, delivered,
                                              array_fill(now(), ARRAY[cardinality(moved)]));
    RETURN cardinality(moved);
END;
$$;
