-- pgbroker migration 0026: database roles scoped to queues. pgbroker.queue_grant
-- gives a role one kind (producer, consumer, monitor) on the queues matching a
-- glob, and every queue-scoped entry point starts with pgbroker._authorize
-- (see sql/schema/15_scopes.sql, of which these are copies).
--
-- Decision: the consumer kind keeps pgmq's unfenced pgmq.delete, pgmq.archive
-- and pgmq.set_vt by msg_id, on the queues of its grants only. Why: every
-- pgmq client's consume loop is read, then delete or archive by msg_id, and a
-- scoped consumer must be able to run it unchanged. The risk: within its
-- queues, a consumer can delete, archive or hide (set_vt far ahead) any
-- message, including ones leased by another consumer, and
-- pgmq.delete(q, ARRAY[1..N]) empties the queue much as a purge would. A
-- consumer that must not do that is given a queue of its own, or uses only
-- pgbroker's fenced calls (ack, nack, extend by receipt) in a deployment that
-- accepts the limit; pgmq.purge_queue itself stays with the owner.

-- The queue grants. pattern is the glob in lower case; like_pattern the same
-- as a LIKE pattern (_ and % taken literally).
CREATE FUNCTION pgbroker._glob_like(pattern text)
RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT replace(replace(replace(replace(replace(lower(pattern),
        '\', '\\'), '%', '\%'), '_', '\_'), '*', '%'), '?', '_');
$$;

CREATE TABLE pgbroker.queue_grant (
    grantee      regrole NOT NULL,
    role_kind    text NOT NULL CHECK (role_kind IN ('producer', 'consumer', 'monitor')),
    pattern      text NOT NULL CHECK (pattern = lower(pattern)),
    like_pattern text NOT NULL GENERATED ALWAYS AS (pgbroker._glob_like(pattern)) STORED,
    granted_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (grantee, role_kind, pattern)
);
REVOKE ALL ON pgbroker.queue_grant FROM PUBLIC;

-- The entry points a queue grant of a kind gives: each of them takes a queue
-- and checks it with pgbroker._authorize (a subset of pgbroker.role_function;
-- tests/integration/test_queue_scopes.py holds them to both). An entry point
-- added to role_function is not granted to scoped roles until it is listed
-- here too.
CREATE TABLE pgbroker.queue_scoped_function (
    role_kind       text NOT NULL CHECK (role_kind IN ('producer', 'consumer', 'monitor')),
    function_schema text NOT NULL,
    function_name   text NOT NULL,
    PRIMARY KEY (role_kind, function_schema, function_name)
);

INSERT INTO pgbroker.queue_scoped_function (role_kind, function_schema, function_name)
SELECT 'producer', 'pgmq', f FROM unnest(ARRAY['send', 'send_batch', 'send_topic', 'send_batch_topic']) f
UNION ALL
SELECT 'producer', 'pgbroker', f FROM unnest(ARRAY['receive_many', 'queue_codec']) f
UNION ALL
SELECT 'consumer', 'pgmq', f FROM unnest(ARRAY[
    'read', 'read_with_poll', 'read_grouped', 'read_grouped_with_poll', 'read_grouped_head',
    'read_grouped_head_with_poll', 'read_grouped_rr', 'read_grouped_rr_with_poll',
    'pop', 'delete', 'archive', 'set_vt']) f
UNION ALL
SELECT 'consumer', 'pgbroker', f FROM unnest(ARRAY[
    'read', 'read_with_poll', 'peek', 'ack', 'nack', 'extend', 'stale_reason', 'complete', 'fail',
    'policy', 'notify_channel', 'consume', 'ack_published']) f
UNION ALL
SELECT 'monitor', 'pgmq', 'metrics'
UNION ALL
SELECT 'monitor', 'pgbroker', f FROM unnest(ARRAY['messages_consumed', 'is_paused']) f;

-- The broad role (<prefix>_<kind> of a prefix in pgbroker.role_sets) through
-- which member holds kind on every queue; NULL if none. A NULL kind: any.
-- (Roles by name through to_regrole, a catalog cache lookup: a join with the
-- pg_roles view doubled the cost of a broad role member's check.)
CREATE FUNCTION pgbroker._broad_role(member name, kind text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF kind IS NULL THEN
        RETURN coalesce(pgbroker._broad_role(member, 'producer'), pgbroker._broad_role(member, 'consumer'),
                        pgbroker._broad_role(member, 'monitor'));
    END IF;
    RETURN (SELECT s.prefix || '_' || kind
            FROM pgbroker.role_sets s
            WHERE pg_has_role(member, to_regrole(quote_ident(s.prefix || '_' || kind)), 'MEMBER')
            LIMIT 1);
END;
$$;

-- Refuse the call unless the caller may act as kind (NULL: any kind) on the
-- queue; true otherwise. The first thing every queue-scoped entry point does:
-- the first PERFORM of its body, or the first declaration of its DECLARE
-- section (so that it runs before any initializer looks at the queue, and a
-- refused caller learns nothing, not even whether the queue exists).
CREATE FUNCTION pgbroker._authorize(kind text, queue_name text)
RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF session_user = current_user THEN
        RETURN true;  -- no privilege switch: the caller's own rights decide
    END IF;
    -- The broad roles before the grants: their members skip the grants' scan.
    IF pg_has_role(session_user, current_user, 'MEMBER')
       OR pgbroker._broad_role(session_user, kind) IS NOT NULL
       OR EXISTS (SELECT 1 FROM pgbroker.queue_grant g
                  WHERE (_authorize.kind IS NULL OR g.role_kind = _authorize.kind)
                    AND lower(_authorize.queue_name) LIKE g.like_pattern
                    AND pg_has_role(session_user, g.grantee, 'MEMBER')) THEN
        RETURN true;
    END IF;
    RAISE EXCEPTION 'permission denied: role "%" has no %access to queue "%"',
                    session_user, coalesce(kind || ' ', ''), queue_name
        USING ERRCODE = 'insufficient_privilege',
              HINT = format('The schema owner grants it: SELECT pgbroker.grant_queue_access(%L, %L, %L); '
                            'or: pgbroker grant %s %s --queue %s',
                            coalesce(kind, 'consumer'), session_user, lower(queue_name),
                            coalesce(kind, 'consumer'), session_user, lower(queue_name));
END;
$$;

-- The role a grant names, checked: the kind is one of the three, the role
-- exists, pgbroker's roles are installed (without them the entry points run
-- with the caller's own rights and a grant would give nothing), and the role
-- does not already hold the kind on every queue.
CREATE FUNCTION pgbroker._queue_grantee(kind text, role_name text)
RETURNS regrole LANGUAGE plpgsql STABLE AS $$
DECLARE
    schema_owner oid := (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgbroker');
    role_oid oid;
    broad text;
BEGIN
    PERFORM pgbroker._check_arg(kind IN ('producer', 'consumer', 'monitor'),
        format('unknown role kind %L', kind), 'Kinds: producer, consumer, monitor.');
    SELECT r.oid INTO role_oid FROM pg_roles r WHERE r.rolname = role_name;
    PERFORM pgbroker._check_arg(role_oid IS NOT NULL, format('role %L does not exist', role_name),
        format('Create it first (CREATE ROLE %I LOGIN PASSWORD ...), then grant it queues.', role_name));
    PERFORM pgbroker._check_arg(EXISTS (SELECT 1 FROM pgbroker.role_sets),
        'queue grants need pgbroker''s roles, which are not installed in this database',
        'Install them first: pgbroker install --roles (or SELECT pgbroker.grant_roles();).');
    PERFORM pgbroker._check_arg(NOT pg_has_role(role_oid, schema_owner, 'MEMBER'),
        format('role %L is a superuser or (a member of) the schema owner %L: it has every access already',
               role_name, schema_owner::regrole),
        'Grant queues to a role without those rights.');
    broad := pgbroker._broad_role(role_name, kind);
    IF broad IS NOT NULL THEN
        PERFORM pgbroker._check_arg(false,
            format('role %L is (a member of) %L, which has %s access to every queue: a queue grant would not limit it',
                   role_name, broad, kind),
            format('Take that membership back first: REVOKE %I FROM %I;', broad, role_name));
    END IF;
    RETURN role_oid::regrole;
END;
$$;

-- Give role the EXECUTE privileges its grants need, and take back those they
-- no longer need: the scoped entry points of the kinds it holds (schema
-- USAGE stays: it gives nothing on its own).
CREATE FUNCTION pgbroker._sync_queue_grantee(grantee regrole)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    fn regprocedure;
    wanted boolean;
BEGIN
    FOR fn, wanted IN
        SELECT p.oid::regprocedure,
               bool_or(EXISTS (SELECT 1 FROM pgbroker.queue_grant g
                               WHERE g.grantee = _sync_queue_grantee.grantee AND g.role_kind = f.role_kind))
        FROM pgbroker.queue_scoped_function f
        JOIN pg_namespace n ON n.nspname = f.function_schema
        JOIN pg_proc p ON p.pronamespace = n.oid AND p.proname = f.function_name
        GROUP BY p.oid
        ORDER BY p.oid
    LOOP
        IF wanted THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', fn, grantee);
        ELSE
            EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM %s', fn, grantee);
        END IF;
    END LOOP;
    EXECUTE format('GRANT USAGE ON SCHEMA pgmq, pgbroker TO %s', grantee);
END;
$$;

-- Delete the grants of roles that were dropped (DROP OWNED took their
-- privileges, so DROP ROLE could go on): a role made later could be given
-- the same oid, and must not inherit them. Run by every change of the grants.
CREATE FUNCTION pgbroker._forget_dropped_grantees()
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM pgbroker.queue_grant g WHERE NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = g.grantee);
END;
$$;

-- Grant role kind on the queues matching pattern (now and created later);
-- true if the grant is new. Idempotent: granting again repairs the role's
-- privileges.
CREATE FUNCTION pgbroker.grant_queue_access(kind text, role_name text, pattern text)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    role_oid regrole := pgbroker._queue_grantee(kind, role_name);
    added boolean;
BEGIN
    PERFORM pgbroker._check_arg(pattern ~ '^[^[:space:][:cntrl:]]{1,100}$',
        format('queue pattern %L must be 1 to 100 characters without spaces or control characters', pattern),
        'A queue name, or a glob: * matches any characters, ? one (orders*, eu-?).');
    PERFORM pgbroker._forget_dropped_grantees();
    INSERT INTO pgbroker.queue_grant (grantee, role_kind, pattern) VALUES (role_oid, kind, lower(pattern))
    ON CONFLICT DO NOTHING;
    added := FOUND;
    PERFORM pgbroker._sync_queue_grantee(role_oid);
    RETURN added;
END;
$$;

-- Take back role's grants of kind: the one of pattern, or all of them when
-- pattern is NULL; returns how many went.
CREATE FUNCTION pgbroker.revoke_queue_access(kind text, role_name text, pattern text DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    role_oid oid;
    removed integer;
BEGIN
    PERFORM pgbroker._check_arg(kind IN ('producer', 'consumer', 'monitor'),
        format('unknown role kind %L', kind), 'Kinds: producer, consumer, monitor.');
    SELECT r.oid INTO role_oid FROM pg_roles r WHERE r.rolname = role_name;
    PERFORM pgbroker._check_arg(role_oid IS NOT NULL, format('role %L does not exist', role_name),
        'List the grants: SELECT * FROM pgbroker.list_queue_grants();');
    PERFORM pgbroker._forget_dropped_grantees();
    DELETE FROM pgbroker.queue_grant g
    WHERE g.grantee = role_oid AND g.role_kind = kind
      AND (revoke_queue_access.pattern IS NULL OR g.pattern = lower(revoke_queue_access.pattern));
    GET DIAGNOSTICS removed = ROW_COUNT;
    PERFORM pgbroker._sync_queue_grantee(role_oid::regrole);
    RETURN removed;
END;
$$;

-- Every queue grant, by role, kind and pattern.
CREATE FUNCTION pgbroker.list_queue_grants()
RETURNS TABLE (role_name text, role_kind text, pattern text, granted_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY SELECT g.grantee::text, g.role_kind, g.pattern, g.granted_at
                 FROM pgbroker.queue_grant g
                 ORDER BY 1, 2, 3;
END;
$$;

-- Grant every scoped role its privileges again; the installer calls it after
-- an upgrade, since a migration that recreates an entry point drops its
-- grants.
CREATE FUNCTION pgbroker._sync_queue_grants()
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    role_oid regrole;
BEGIN
    PERFORM pgbroker._forget_dropped_grantees();
    FOR role_oid IN SELECT DISTINCT g.grantee FROM pgbroker.queue_grant g ORDER BY 1 LOOP
        PERFORM pgbroker._sync_queue_grantee(role_oid);
    END LOOP;
END;
$$;

-- The owner's: they change and show who may do what.
REVOKE EXECUTE ON FUNCTION pgbroker.grant_queue_access(text, text, text),
                           pgbroker.revoke_queue_access(text, text, text),
                           pgbroker.list_queue_grants(),
                           pgbroker._sync_queue_grantee(regrole),
                           pgbroker._forget_dropped_grantees(),
                           pgbroker._sync_queue_grants() FROM PUBLIC;

-- The entry points, each with its authorization first.

CREATE OR REPLACE FUNCTION pgbroker.policy(queue_name text)
RETURNS pgbroker.queue_policy LANGUAGE plpgsql STABLE AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize(NULL, queue_name);
    hit record;
    found_policy pgbroker.queue_policy;
BEGIN
    SELECT m.queue_name AS stored, p AS row INTO hit
    FROM pgmq.meta m LEFT JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
    WHERE lower(m.queue_name) = lower(policy.queue_name);
    IF NOT FOUND THEN
        PERFORM pgbroker._table(queue_name);  -- PB001/PB002, naming the problem
    END IF;
    found_policy := hit.row;
    IF found_policy.queue_name IS NULL THEN
        found_policy.queue_name := hit.stored;
        found_policy.backoff := 'exponential';
        found_policy.backoff_base_seconds := 1;
        found_policy.backoff_max_seconds := 300;
        found_policy.backoff_jitter := true;
        found_policy.ack_mode := 'archive';
        found_policy.updated_at := now();
        found_policy.codec := 'json';
        found_policy.priorities := false;
        found_policy.dedup_window_seconds := 300;  -- SQS FIFO's five minutes
        found_policy.dedup_mode := 'window';
        found_policy.paused := false;
        -- max_deliveries, dead_letter_queue, max_depth, the retention and the
        -- in-flight and rate limits stay NULL: off.
    END IF;
    RETURN found_policy;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.queue_codec(queue_name text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT pgbroker._authorize('producer', queue_name);
    SELECT coalesce((SELECT p.codec FROM pgbroker.queue_policy p
                     WHERE lower(p.queue_name) = lower(queue_codec.queue_name)), 'json');
$$;

CREATE OR REPLACE FUNCTION pgbroker.is_paused(queue_name text)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT pgbroker._authorize('monitor', queue_name);
    SELECT coalesce((SELECT p.paused FROM pgmq.meta m JOIN pgbroker.queue_policy p ON p.queue_name = m.queue_name
                     WHERE lower(m.queue_name) = lower($1)), false);
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB, delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, ARRAY[msg], ARRAY[headers]);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], ARRAY[headers], delay);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], NULL, NULL);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], ARRAY[headers], NULL);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, ARRAY[msg], NULL);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], NULL,
                                                    pgbroker._pgmq_delay_to_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, ARRAY[msg], NULL);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], NULL, delay);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send(queue_name TEXT, msg JSONB, headers JSONB, delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, ARRAY[msg], ARRAY[headers]);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, ARRAY[msg], ARRAY[headers],
                                                    pgbroker._pgmq_delay_to_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[],
                                delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, msgs, headers);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers, delay);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, NULL, NULL);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers, NULL);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, msgs, NULL);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, NULL,
                                                    pgbroker._pgmq_delay_to_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], delay TIMESTAMP WITH TIME ZONE)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, msgs, NULL);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, NULL, delay);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.send_batch(queue_name TEXT, msgs JSONB[], headers JSONB[], delay INTEGER)
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('producer', queue_name);
    IF delay IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_send_without_vt(queue_name, msgs, headers);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_send(queue_name, msgs, headers,
                                                    pgbroker._pgmq_delay_to_time(delay));
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.stale_reason(queue_name text, receipt text)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    qtable text := pgbroker._table(queue_name);
    r record := pgbroker._parse_receipt(receipt);
    cur record;
BEGIN
    EXECUTE format('SELECT read_ct, vt, clock_timestamp() AS now FROM pgmq.%I WHERE msg_id = $1', qtable)
        INTO cur USING r.msg_id;
    IF cur IS NULL THEN
        RETURN 'it is no longer in the queue (acknowledged, deleted, archived or popped)';
    ELSIF cur.read_ct <> r.read_ct THEN
        RETURN format('it was delivered again (delivery %s; the receipt is for delivery %s)',
                      cur.read_ct, r.read_ct);
    ELSIF pgbroker._micros(cur.vt) <> r.lease THEN
        RETURN 'its lease was changed by a nack, extend or set_vt after this receipt was issued';
    ELSIF cur.vt <= cur.now THEN
        RETURN format('its lease expired at %s', cur.vt);
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.read(queue_name TEXT, vt INTEGER, qty INTEGER, conditional JSONB DEFAULT '{}')
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    IF (vt IS NULL OR vt < 0 OR qty IS NULL) AND coalesce(qty >= 0, true) THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_read_as_given(queue_name, vt, qty, conditional);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_read(queue_name, vt, qty, conditional);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.read_with_poll(
    queue_name TEXT,
    vt INTEGER,
    qty INTEGER,
    max_poll_seconds INTEGER DEFAULT 5,
    poll_interval_ms INTEGER DEFAULT 100,
    conditional JSONB DEFAULT '{}'
)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._pgmq_poll(
        format('SELECT * FROM pgmq.read(%L, %s, %s, %L)', queue_name, coalesce(vt::text, 'NULL'),
               coalesce(qty::text, 'NULL'), conditional),
        max_poll_seconds, poll_interval_ms);
$$;

CREATE OR REPLACE FUNCTION pgmq.pop(queue_name TEXT, qty INTEGER DEFAULT 1)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    IF qty IS NULL THEN
        RETURN QUERY SELECT * FROM pgbroker._pgmq_pop_all(queue_name);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_pop(queue_name, qty);
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.read(queue_name text, vt integer, qty integer, conditional jsonb DEFAULT '{}')
RETURNS SETOF pgbroker.delivery LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_deliver(queue_name, vt, qty, conditional);
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.read_with_poll(
    queue_name text, vt integer, qty integer,
    max_poll_seconds integer DEFAULT 5, poll_interval_ms integer DEFAULT 100,
    conditional jsonb DEFAULT '{}')
RETURNS SETOF pgbroker.delivery LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT m.*, pgbroker.receipt(m.msg_id, m.read_ct, m.vt)
    FROM pgbroker._poll(
        format('SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers'
               ' FROM pgbroker.read(%L, %s, %s, %L)',
               queue_name, coalesce(vt::text, 'NULL'), coalesce(qty::text, 'NULL'), conditional),
        max_poll_seconds, poll_interval_ms) m;
$$;

CREATE OR REPLACE FUNCTION pgmq.delete(queue_name TEXT, msg_ids BIGINT[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    qtable text := pgbroker._pgmq_table(queue_name);
BEGIN
    RETURN QUERY EXECUTE format(
        'DELETE FROM pgmq.%I WHERE msg_id = ANY($1) RETURNING msg_id', qtable)
    USING msg_ids;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.delete(queue_name TEXT, msg_id BIGINT)
RETURNS BOOLEAN LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT EXISTS (SELECT 1 FROM pgmq.delete(queue_name, ARRAY[msg_id]));
$$;

CREATE OR REPLACE FUNCTION pgmq.archive(queue_name TEXT, msg_ids BIGINT[])
RETURNS SETOF BIGINT LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    qtable text := pgbroker._pgmq_table(queue_name);
BEGIN
    RETURN QUERY EXECUTE format(
        $Q$
        WITH moved AS (
            DELETE FROM pgmq.%1$I WHERE msg_id = ANY($1)
            RETURNING msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers
        )
        INSERT INTO pgmq.%2$I (msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers)
        SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers FROM moved
        RETURNING msg_id
        $Q$, qtable, 'a' || substr(qtable, 2))
    USING msg_ids;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.archive(queue_name TEXT, msg_id BIGINT)
RETURNS BOOLEAN LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT EXISTS (SELECT 1 FROM pgmq.archive(queue_name, ARRAY[msg_id]));
$$;

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name TEXT, msg_ids BIGINT[], vt TIMESTAMP WITH TIME ZONE)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    qtable text := pgbroker._pgmq_table(queue_name);
    changed pgmq.message_record[];
    lowest bigint;
    stored text;
BEGIN
    -- Any vt, as pgmq: NULL fails on a message found (23502), not on none.
    EXECUTE format(
        $Q$
        WITH changed AS (
            UPDATE pgmq.%I SET vt = $2 WHERE msg_id = ANY($1)
            RETURNING msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers
        )
        SELECT coalesce(array_agg(c ORDER BY c.msg_id), '{}') FROM changed c
        $Q$, qtable)
    INTO changed USING msg_ids, vt;
    stored := pgbroker._stored_name(set_vt.queue_name);
    SELECT min(c.msg_id) INTO lowest FROM unnest(changed) c WHERE c.read_ct = 0 AND c.vt <= c.enqueued_at;
    IF lowest IS NOT NULL THEN
        UPDATE pgbroker.queue_head h SET ready_from = lowest
        WHERE h.queue_name = stored AND h.ready_from > lowest;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(changed) c WHERE NOT (c.read_ct = 0 AND c.vt <= c.enqueued_at)) THEN
        PERFORM pgbroker._lower_timed_from(stored, vt);
    END IF;
    RETURN QUERY SELECT * FROM unnest(changed);
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name TEXT, msg_ids BIGINT[], vt INTEGER)
RETURNS SETOF pgmq.message_record LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    RETURN QUERY SELECT * FROM pgmq.set_vt(queue_name, msg_ids, clock_timestamp() + make_interval(secs => vt));
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name TEXT, msg_id BIGINT, vt TIMESTAMP WITH TIME ZONE)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgmq.set_vt(queue_name, ARRAY[msg_id], vt);
$$;

CREATE OR REPLACE FUNCTION pgmq.set_vt(queue_name TEXT, msg_id BIGINT, vt INTEGER)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgmq.set_vt(queue_name, ARRAY[msg_id], vt);
$$;

CREATE OR REPLACE FUNCTION pgbroker.ack(queue_name text, receipts text[], archive boolean DEFAULT true)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    RETURN QUERY SELECT * FROM pgbroker._route_ack(queue_name, receipts, archive, false);
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.ack(queue_name text, receipt text, archive boolean DEFAULT true)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    acked bigint;
BEGIN
    SELECT a INTO acked FROM pgbroker.ack(queue_name, ARRAY[receipt], archive) a;
    IF acked IS NULL THEN
        PERFORM pgbroker._raise_stale(queue_name, receipt);
    END IF;
    RETURN acked;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.nack(queue_name text, receipts text[], delay integer DEFAULT 0)
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    qtable text := pgbroker._table(queue_name);
    held record := pgbroker._held(receipts);
BEGIN
    PERFORM pgbroker._check_arg(delay IS NOT NULL AND delay >= 0,
        format('delay must be a number of seconds >= 0, got %s', coalesce(delay::text, 'NULL')));
    RETURN QUERY EXECUTE format(
        $Q$
        WITH released AS (
            UPDATE pgmq.%I q SET vt = clock_timestamp() + make_interval(secs => $4)
            WHERE q.msg_id = ANY($1)
              AND (q.msg_id, q.read_ct, pgbroker._micros(q.vt)) IN (SELECT * FROM unnest($1, $2, $3))
              AND q.vt > clock_timestamp()
            RETURNING q.msg_id
        )
        SELECT msg_id FROM released ORDER BY msg_id
        $Q$, qtable)
    USING held.msg_ids, held.read_cts, held.leases, delay;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.nack(queue_name text, receipt text, delay integer DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    released bigint;
BEGIN
    SELECT n INTO released FROM pgbroker.nack(queue_name, ARRAY[receipt], delay) n;
    IF released IS NULL THEN
        PERFORM pgbroker._raise_stale(queue_name, receipt);
    END IF;
    RETURN released;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.extend(queue_name text, receipts text[], vt integer)
RETURNS TABLE (msg_id bigint, receipt text) LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    qtable text := pgbroker._table(queue_name);
    held record := pgbroker._held(receipts);
BEGIN
    PERFORM pgbroker._check_arg(vt IS NOT NULL AND vt >= 0,
        format('vt must be a number of seconds >= 0, got %s', coalesce(vt::text, 'NULL')));
    RETURN QUERY EXECUTE format(
        $Q$
        WITH extended AS (
            UPDATE pgmq.%I q SET vt = clock_timestamp() + make_interval(secs => $4)
            WHERE q.msg_id = ANY($1)
              AND (q.msg_id, q.read_ct, pgbroker._micros(q.vt)) IN (SELECT * FROM unnest($1, $2, $3))
              AND q.vt > clock_timestamp()
            RETURNING q.msg_id, q.read_ct, q.vt
        )
        SELECT msg_id, pgbroker.receipt(msg_id, read_ct, vt) FROM extended ORDER BY msg_id
        $Q$, qtable)
    USING held.msg_ids, held.read_cts, held.leases, vt;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.extend(queue_name text, receipt text, vt integer)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    renewed text;
BEGIN
    SELECT e.receipt INTO renewed FROM pgbroker.extend(queue_name, ARRAY[receipt], vt) e;
    IF renewed IS NULL THEN
        PERFORM pgbroker._raise_stale(queue_name, receipt);
    END IF;
    RETURN renewed;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.consume(queue_name text, vt integer, qty integer,
                                 receipts text[] DEFAULT NULL, archive boolean DEFAULT NULL)
RETURNS SETOF pgbroker.delivery LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgbroker._authorize('consumer', queue_name);
    IF vt IS NULL OR vt < 0 OR qty IS NULL OR qty < 0 THEN
        PERFORM pgbroker._table(queue_name);
        PERFORM pgbroker._check_read_args(vt, qty);
    END IF;
    IF cardinality(receipts) > 0 THEN
        PERFORM pgbroker._route_ack(queue_name, receipts, archive, true);
    END IF;
    RETURN QUERY SELECT * FROM pgbroker._route_deliver(queue_name, vt, qty, '{}');
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.complete(queue_name text, receipts text[])
RETURNS SETOF bigint LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT pgbroker.ack(queue_name, receipts, (pgbroker.policy(queue_name)).ack_mode = 'archive');
$$;

CREATE OR REPLACE FUNCTION pgbroker.fail(queue_name text, receipts text[], error text DEFAULT NULL)
RETURNS TABLE (msg_id bigint, outcome text) LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    p pgbroker.queue_policy := pgbroker.policy(queue_name);
    one text;
    held record;
BEGIN
    FOREACH one IN ARRAY coalesce(receipts, '{}') LOOP
        held := pgbroker._parse_receipt(one);
        IF p.max_deliveries IS NOT NULL AND held.read_ct >= p.max_deliveries THEN
            -- Lock the row and check the receipt first, so that a stale one moves nothing.
            CONTINUE WHEN NOT EXISTS (SELECT 1 FROM pgbroker.extend(queue_name, ARRAY[one], 0));
            PERFORM pgbroker._dead_letter(queue_name, ARRAY[held.msg_id],
                                          coalesce(error, 'failed (no error given)'), 0);
            outcome := 'dead_lettered';
        ELSE
            CONTINUE WHEN NOT EXISTS (
                SELECT 1 FROM pgbroker.nack(queue_name, ARRAY[one], pgbroker.retry_delay(p, held.read_ct)));
            outcome := 'retry';
        END IF;
        msg_id := held.msg_id;
        RETURN NEXT;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.fail(queue_name text, receipt text, error text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    result text;
BEGIN
    SELECT f.outcome INTO result FROM pgbroker.fail(queue_name, ARRAY[receipt], error) f;
    IF result IS NULL THEN
        PERFORM pgbroker._raise_stale(queue_name, receipt);
    END IF;
    RETURN result;
END;
$$;

CREATE OR REPLACE FUNCTION pgmq.read_grouped(queue_name TEXT, vt INTEGER, qty INTEGER)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._read_grouped(queue_name, vt, qty, 'fill');
$$;

CREATE OR REPLACE FUNCTION pgmq.read_grouped_rr(queue_name TEXT, vt INTEGER, qty INTEGER)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._read_grouped(queue_name, vt, qty, 'rr');
$$;

CREATE OR REPLACE FUNCTION pgmq.read_grouped_head(queue_name TEXT, vt INTEGER, qty INTEGER)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._read_grouped(queue_name, vt, qty, 'head');
$$;

CREATE OR REPLACE FUNCTION pgmq.read_grouped_with_poll(
    queue_name TEXT, vt INTEGER, qty INTEGER,
    max_poll_seconds INTEGER DEFAULT 5, poll_interval_ms INTEGER DEFAULT 100)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._read_grouped_with_poll(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, 'fill');
$$;

CREATE OR REPLACE FUNCTION pgmq.read_grouped_rr_with_poll(
    queue_name TEXT, vt INTEGER, qty INTEGER,
    max_poll_seconds INTEGER DEFAULT 5, poll_interval_ms INTEGER DEFAULT 100)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._read_grouped_with_poll(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, 'rr');
$$;

CREATE OR REPLACE FUNCTION pgmq.read_grouped_head_with_poll(
    queue_name TEXT, vt INTEGER, qty INTEGER,
    max_poll_seconds INTEGER DEFAULT 5, poll_interval_ms INTEGER DEFAULT 100)
RETURNS SETOF pgmq.message_record LANGUAGE sql AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT * FROM pgbroker._read_grouped_with_poll(queue_name, vt, qty, max_poll_seconds, poll_interval_ms, 'head');
$$;

CREATE OR REPLACE FUNCTION pgbroker._send_topic(routing_key text, msgs jsonb[], headers jsonb[], delay timestamptz)
RETURNS TABLE (queue_name text, msg_id bigint) LANGUAGE plpgsql AS $$
DECLARE
    target text;
BEGIN
    PERFORM pgmq.validate_routing_key(routing_key);
    PERFORM pgbroker._check_batch(msgs, headers);
    FOR target IN SELECT DISTINCT b.queue_name FROM pgbroker._topic_matches(routing_key) b ORDER BY 1 LOOP
        PERFORM pgbroker._authorize('producer', target);
        RETURN QUERY SELECT target, s.id FROM pgbroker._send_many(target, msgs, headers, delay) AS s(id);
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.notify_channel(queue_name text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT pgbroker._authorize('consumer', queue_name);
    SELECT 'pgmq.' || pgbroker._table(queue_name) || '.INSERT';
$$;

CREATE OR REPLACE FUNCTION pgbroker.peek(
    queue_name text, qty integer DEFAULT 10, after_msg_id bigint DEFAULT 0,
    state text DEFAULT NULL, before_msg_id bigint DEFAULT NULL,
    header_key text DEFAULT NULL, header_value text DEFAULT NULL,
    enqueued_after timestamptz DEFAULT NULL, enqueued_before timestamptz DEFAULT NULL)
RETURNS SETOF pgbroker.peeked_message LANGUAGE plpgsql STABLE AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    source text;
    state_of text;
    letters_of text;
BEGIN
    PERFORM pgbroker._check_read_args(0, qty);
    PERFORM pgbroker._check_arg(state IS NULL OR state IN ('waiting', 'delayed', 'in_flight', 'dead'),
        format('unknown message state %L', state),
        'States: waiting, delayed, in_flight, dead (or none: every state but dead).');
    PERFORM pgbroker._check_arg(header_value IS NULL OR header_key IS NOT NULL,
        'header_value needs header_key', 'Name the header whose value to match.');
    IF state = 'dead' THEN
        source := pgbroker._dead_letter_table(pgbroker.policy(queue_name));
        state_of := '''dead''';
        letters_of := pgbroker._stored_name(queue_name);
    ELSE
        source := pgbroker._table(queue_name);
        state_of := 'CASE WHEN vt <= now() THEN ''waiting'' WHEN read_ct = 0 THEN ''delayed'''
                    ' ELSE ''in_flight'' END';
    END IF;
    -- Static text but for the table and the state expression: each filter is
    -- off when its parameter is NULL, and the scan follows the primary key.
    RETURN QUERY EXECUTE format(
        $Q$
        SELECT * FROM (
            SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers, %s AS state
            FROM pgmq.%I
            WHERE msg_id > $1 AND ($2::bigint IS NULL OR msg_id <= $2)
              AND ($3::text IS NULL OR headers ? $3)
              AND ($4::text IS NULL OR headers ->> $3 = $4)
              AND ($5::timestamptz IS NULL OR enqueued_at >= $5)
              AND ($6::timestamptz IS NULL OR enqueued_at < $6)
              AND ($8::text IS NULL OR headers -> 'x-pgbroker-dead-letter' ->> 'queue' = $8)
        ) m
        WHERE $9::text IS NULL OR $9 = 'dead' OR m.state = $9
        ORDER BY msg_id LIMIT $7
        $Q$, state_of, source)
    USING coalesce(after_msg_id, 0), before_msg_id, header_key, header_value, enqueued_after,
          enqueued_before, qty, letters_of, state;
END;
$$;

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

CREATE OR REPLACE FUNCTION pgbroker.ack_published(queue_name text, receipts text[], published jsonb[])
RETURNS SETOF bigint LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('consumer', queue_name);
    qtable text := pgbroker._table(queue_name);
    held record := pgbroker._held(receipts);
BEGIN
    PERFORM pgbroker._check_arg(cardinality(receipts) = cardinality(published),
        format('published has %s entries for %s receipts',
               coalesce(cardinality(published), 0), coalesce(cardinality(receipts), 0)),
        'Give one publish record per receipt.');
    IF (pgbroker.policy(queue_name)).ack_mode = 'delete' THEN
        RETURN QUERY SELECT pgbroker.ack(queue_name, receipts, false);
        RETURN;
    END IF;
    RETURN QUERY EXECUTE format(
        $Q$
        WITH removed AS (
            DELETE FROM pgmq.%1$I q
            USING unnest($1, $2, $3, $4) AS r(msg_id, read_ct, lease, record)
            WHERE q.msg_id = ANY($1)
              AND (q.msg_id, q.read_ct, pgbroker._micros(q.vt)) = (r.msg_id, r.read_ct, r.lease)
              AND q.vt > clock_timestamp()
            RETURNING q.msg_id, q.read_ct, q.enqueued_at, q.last_read_at, q.vt, q.message,
                      coalesce(q.headers, '{}'::jsonb)
                          || jsonb_build_object('x-pgbroker-published', r.record) AS headers
        ),
        archived AS (
            INSERT INTO pgmq.%2$I (msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers)
            SELECT msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers FROM removed
        )
        SELECT msg_id FROM removed ORDER BY msg_id
        $Q$, qtable, 'a' || substr(qtable, 2))
    USING held.msg_ids, held.read_cts, held.leases, published;
END;
$$;

CREATE OR REPLACE FUNCTION pgbroker.receive_many(
    queue_name text, message_ids text[], messages jsonb[], headers jsonb[], seen_within interval)
RETURNS TABLE (message_id text, msg_id bigint) LANGUAGE plpgsql AS $$
DECLARE
    authorized constant boolean := pgbroker._authorize('producer', queue_name);
    stored varchar;
    fresh_ids text[];
    fresh_messages jsonb[];
    fresh_headers jsonb[];
BEGIN
    PERFORM pgbroker._table(queue_name);
    stored := pgbroker._stored_name(queue_name);
    PERFORM pgbroker._check_arg(cardinality(message_ids) = cardinality(messages)
                                AND cardinality(headers) = cardinality(messages),
        'message_ids, messages and headers must have one entry per message');
    PERFORM pgbroker._check_arg(seen_within IS NOT NULL AND seen_within >= interval '0',
        format('seen_within must be an interval >= 0, got %s', coalesce(seen_within::text, 'NULL')));

    WITH batch AS (
        SELECT b.id, b.msg, b.hdr, b.n FROM unnest(message_ids, messages, headers) WITH ORDINALITY AS b(id, msg, hdr, n)
    ),
    -- The first of equal ids in one batch stands for all of them.
    firsts AS (
        SELECT DISTINCT ON (id) id, n FROM batch WHERE id IS NOT NULL ORDER BY id, n
    ),
    claimed AS (
        INSERT INTO pgbroker.inbound_seen AS s (queue_name, message_id, seen_at)
        SELECT stored, id, now() FROM firsts ORDER BY id
        ON CONFLICT ON CONSTRAINT inbound_seen_pkey DO UPDATE SET seen_at = EXCLUDED.seen_at
            WHERE s.seen_at < now() - seen_within
        RETURNING s.message_id
    ),
    fresh AS (
        SELECT f.n FROM firsts f JOIN claimed c ON c.message_id = f.id
    )
    SELECT array_agg(b.id ORDER BY b.n), array_agg(b.msg ORDER BY b.n), array_agg(b.hdr ORDER BY b.n)
    INTO fresh_ids, fresh_messages, fresh_headers
    FROM batch b
    WHERE b.id IS NULL OR b.n IN (SELECT fresh.n FROM fresh);
    IF fresh_ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM unnest(fresh_ids,
                                      ARRAY(SELECT pgbroker._send_many(queue_name, fresh_messages, fresh_headers, NULL)));
END;
$$;
