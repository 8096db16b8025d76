-- Stats: what monitoring reads, cheaply.
--
-- pgmq.metrics and metrics_all are pgmq's, exact (they count whole tables).
-- pgbroker.queue_stats() is what the HTTP API's /metrics scrapes. A scrape
-- must stay cheap however deep a queue grows, so no statement of it scans a
-- whole queue table: counts are exact only up to a bound (a LIMITed
-- subquery), and past it come from the planner's statistics
-- (pg_class.reltuples scaled to the table's current size, as the planner
-- itself does); ages come from the msg_id primary key's two ends, and the
-- total sent from the msg_id sequence. pgbroker.messages_consumed counts
-- removals from the statistics system.

------------------------------------------------------------------------------
-- pgmq's metrics
------------------------------------------------------------------------------

-- Rows in the default partitions of a queue and its archive, or NULL for a
-- queue without any (every plain queue), as pgmq reports. Rows there have no
-- partition of their own: partition maintenance is falling behind
-- (76_partitions.sql).
-- Exact while a default partition is small (8 MB), estimated from the
-- planner's statistics beyond that, so a scrape never scans a large spill.
CREATE OR REPLACE FUNCTION pgbroker._default_partition_length(queue_name text)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    d record;
    n bigint;
    total bigint;  -- NULL for a queue without default partitions, as in pgmq
BEGIN
    FOR d IN
        SELECT c.oid, c.relpages, c.reltuples, pg_relation_size(c.oid) AS bytes
        FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partdefid
        WHERE p.partrelid IN (to_regclass(format('pgmq.%I', lower('q_' || queue_name))),
                              to_regclass(format('pgmq.%I', lower('a_' || queue_name))))
    LOOP
        IF d.bytes = 0 THEN
            n := 0;
        ELSIF d.bytes <= 8388608 OR d.relpages <= 0 OR d.reltuples < 0 THEN
            EXECUTE format('SELECT count(*) FROM %s', d.oid::regclass) INTO n;
        ELSE
            n := (d.reltuples / d.relpages * (d.bytes / current_setting('block_size')::bigint))::bigint;
        END IF;
        total := coalesce(total, 0) + n;
    END LOOP;
    RETURN total;
END;
$$;

-- A queue's length, ages and total sent, counted exactly.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.metrics(queue_name TEXT)
RETURNS pgmq.metrics_result LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('monitor', queue_name);
    qtable text := pgbroker._pgmq_table(queue_name);
    result pgmq.metrics_result;
BEGIN
    EXECUTE format(
        $Q$
        SELECT %1$L::text,
               count(*),
               extract(epoch FROM (now() - max(enqueued_at)))::int,
               extract(epoch FROM (now() - min(enqueued_at)))::int,
               (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pgmq.%3$I),
               now(),
               count(*) FILTER (WHERE vt <= now()),
               pgbroker._default_partition_length(%1$L)
        FROM pgmq.%2$I
        $Q$, queue_name, qtable, qtable || '_msg_id_seq')
    INTO result;
    RETURN result;
END;
$$;

-- pgmq.metrics of every queue, by name.
-- Returns: one pgmq.metrics_result per queue.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgmq.metrics_all()
RETURNS SETOF pgmq.metrics_result LANGUAGE plpgsql AS $$
DECLARE
    name text;
BEGIN
    FOR name IN SELECT m.queue_name FROM pgmq.meta m ORDER BY m.queue_name LOOP
        RETURN NEXT pgmq.metrics(name);
    END LOOP;
END;
$$;

------------------------------------------------------------------------------
-- Bounded statistics
------------------------------------------------------------------------------

-- The planner's row estimate for a table, scaled to its current size in pages
-- (reltuples is only as fresh as the last VACUUM or ANALYZE); NULL when the
-- table was never analysed. A partitioned table sums its partitions.
CREATE OR REPLACE FUNCTION pgbroker._estimated_rows(rel regclass)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN bool_or(c.reltuples < 0) THEN NULL
                ELSE sum(CASE WHEN c.relpages > 0
                              THEN c.reltuples / c.relpages
                                   * (pg_relation_size(c.oid) / current_setting('block_size')::bigint)
                              ELSE c.reltuples END)::bigint END
    FROM pg_class c
    -- pg_partition_tree lists nothing for a plain table: the table itself is added.
    WHERE c.relkind <> 'p' AND c.oid IN (SELECT rel UNION ALL SELECT relid FROM pg_partition_tree(rel) WHERE isleaf);
$$;

-- Rows of a query's result, counted exactly up to bound and no further: the
-- cost of a scrape is bounded by bound, not by the queue's depth.
CREATE OR REPLACE FUNCTION pgbroker._bounded_count(from_where text, bound bigint)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    n bigint;
BEGIN
    EXECUTE format('SELECT count(*) FROM (SELECT 1 FROM %s LIMIT %s) s', from_where, bound + 1) INTO n;
    RETURN n;
END;
$$;

-- One row per queue. *_is_estimate says a count passed exact_below and was
-- estimated. visible_length past the bound is the length minus the messages
-- that are leased or delayed: those are found through the queue's vt index
-- (their vt is past their enqueue time), so counting them is cheap while the
-- in-flight set stays small. Ages are from the oldest and newest msg_id.
-- dead_letter_length counts the queue's dead letters when they go to a
-- dead-letter queue of their own or to a small archive; NULL when finding
-- them would mean scanning a large archive.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.queue_stats(exact_below bigint DEFAULT 10000)
RETURNS TABLE (
    queue_name text,
    queue_length bigint,
    visible_length bigint,
    length_is_estimate boolean,
    oldest_msg_age_sec double precision,
    newest_msg_age_sec double precision,
    total_sent bigint,
    dead_letter_length bigint,
    scrape_time timestamptz
) LANGUAGE plpgsql STABLE AS $$
DECLARE
    m record;
    qtable text;
    dl_table text;
    dl_rows bigint;
    n bigint;
    invisible bigint;
    oldest timestamptz;
    newest timestamptz;
BEGIN
    PERFORM pgbroker._check_arg(exact_below IS NOT NULL AND exact_below >= 0,
        'exact_below must be >= 0', 'Pass the largest count worth computing exactly.');
    FOR m IN SELECT meta.queue_name FROM pgmq.meta meta ORDER BY meta.queue_name LOOP
        queue_name := m.queue_name;
        qtable := pgbroker._table(m.queue_name);
        scrape_time := now();

        n := pgbroker._bounded_count(format('pgmq.%I', qtable), exact_below);
        length_is_estimate := n > exact_below;
        IF length_is_estimate THEN
            n := greatest(coalesce(pgbroker._estimated_rows(format('pgmq.%I', qtable)::regclass), n), n);
        END IF;
        queue_length := n;

        IF length_is_estimate THEN
            invisible := pgbroker._bounded_count(
                format('pgmq.%I WHERE vt > now() AND NOT (read_ct = 0 AND vt <= enqueued_at)', qtable),
                exact_below);
            visible_length := greatest(n - invisible, 0);
        ELSE
            visible_length := pgbroker._bounded_count(format('pgmq.%I WHERE vt <= now()', qtable), exact_below);
        END IF;

        EXECUTE format('SELECT (SELECT enqueued_at FROM pgmq.%1$I ORDER BY msg_id LIMIT 1),
                               (SELECT enqueued_at FROM pgmq.%1$I ORDER BY msg_id DESC LIMIT 1)', qtable)
            INTO oldest, newest;
        oldest_msg_age_sec := extract(epoch FROM now() - oldest);
        newest_msg_age_sec := extract(epoch FROM now() - newest);

        EXECUTE format('SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pgmq.%I',
                       qtable || '_msg_id_seq')
            INTO total_sent;

        -- Dead letters: in the policy's dead-letter queue, else in the archive,
        -- marked by the x-pgbroker-dead-letter header naming their queue.
        SELECT CASE WHEN p.dead_letter_queue IS NULL THEN pgbroker._table(m.queue_name, 'a')
                    ELSE pgbroker._table(p.dead_letter_queue) END
          INTO dl_table
          FROM pgbroker.queue_policy p WHERE p.queue_name = m.queue_name;
        IF dl_table IS NULL THEN
            dl_table := pgbroker._table(m.queue_name, 'a');
        END IF;
        dl_rows := pgbroker._bounded_count(format('pgmq.%I', dl_table), exact_below);
        IF dl_rows > exact_below THEN
            dead_letter_length := NULL;
        ELSE
            EXECUTE format($Q$SELECT count(*) FROM pgmq.%I
                              WHERE headers -> 'x-pgbroker-dead-letter' ->> 'queue' = $1$Q$, dl_table)
                USING m.queue_name INTO dead_letter_length;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- Messages removed from a queue so far (acked, deleted, archived, popped or
-- dead-lettered): the deleted-row count the statistics system keeps for the
-- queue's table (its leaves when partitioned). Reading it costs nothing
-- whatever the queue's size, and nothing is added to the hot path, unlike a
-- counter row every ack would have to update (and lock). It behaves like a
-- Prometheus counter: it falls back to 0 when statistics are reset or the
-- server crashes, and a dropped partition takes its share with it, which
-- rate() reads as a counter reset. Approximate: deletions rolled back count
-- too, and a backend reports its counts at most about once a second.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.messages_consumed(queue_name text)
RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT pgbroker._authorize('monitor', queue_name);
    -- to_regclass: a queue dropped while a scrape runs counts 0, it does not fail the scrape.
    WITH q AS (SELECT to_regclass(format('pgmq.%I', pgbroker._table(queue_name))) AS rel)
    SELECT coalesce(sum(pg_stat_get_tuples_deleted(c.oid)), 0)::bigint
    FROM pg_class c
    -- pg_partition_tree lists nothing for a plain table: the table itself is added.
    WHERE c.relkind <> 'p'
      AND c.oid IN (SELECT rel FROM q UNION ALL SELECT t.relid FROM q, pg_partition_tree(q.rel) t WHERE t.isleaf);
$$;
