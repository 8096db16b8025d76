-- Queue scopes: database roles granted a role kind on some queues only.
--
-- The broad roles of 88_roles.sql (<prefix>_producer, _consumer, _monitor)
-- act on every queue. A queue grant gives a role one kind on the queues whose
-- names match a glob (* any characters, ? one), compared case-insensitively
-- as queue names are (pgmq folds names to lower case):
--     SELECT pgbroker.grant_queue_access('consumer', 'app_reader', 'orders*');
-- The grants are rows of pgbroker.queue_grant (owner-only). A granted role
-- gets EXECUTE on the kind's entry points that take a queue
-- (pgbroker.queue_scoped_function), and each of those entry points starts
-- with pgbroker._authorize(kind, queue), which refuses a queue outside the
-- caller's grants with 42501 (insufficient_privilege).
--
-- Who the caller is: the entry points are SECURITY DEFINER once the roles are
-- installed, so current_user inside them is their owner and says nothing of
-- the caller; session_user is the login, and the caller acts as it or as any
-- role it is a member of (SET ROLE), so those are the roles whose grants
-- count. Nothing of the caller's session is read (no setting, no temporary
-- object): a login's rights are its memberships and the grants' rows.
--   * No privilege switch (current_user = session_user: the owner's own
--     call, or a database without the roles, where table privileges decide):
--     allowed at once, one comparison of two names.
--   * A login that is (a member of) the owner, a superuser, or a member of a
--     broad role of the kind: allowed, as before queue grants existed.
--   * Otherwise: allowed only if a grant of the kind to one of its roles
--     matches the queue.
--
-- What a scoped role does not get:
--   * entry points without a queue (pgmq.metrics_all, pgmq.list_queues,
--     pgbroker.queue_stats, pgbroker.prune_inbound_seen) are not granted to
--     it: they cover every queue, so Postgres refuses them (42501). A scoped
--     monitor asks pgmq.metrics(queue) of each queue of its grants;
--   * streams (92_streams.sql) are not queues: their entry points stay with
--     the broad roles;
--   * purge, create, drop and policies stay with the owner, as for the broad
--     roles.
-- A topic send (72_topics.sql) is checked for every queue the routing key
-- reaches: one queue outside the producer's grants refuses the whole send
-- (nothing is sent anywhere), rather than skipping that queue, because a
-- message that silently misses some of its queues depending on who sent it
-- is a lost message nobody sees; the error names the queue to grant or to
-- unbind.
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

-- The broad role (<prefix>_<kind> of a prefix in pgbroker.role_sets) through
-- which member holds kind on every queue; NULL if none. A NULL kind: any.
-- (Roles by name through to_regrole, a catalog cache lookup: a join with the
-- pg_roles view doubled the cost of a broad role member's check.)
CREATE OR REPLACE FUNCTION pgbroker._broad_role(member name, kind text)
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
CREATE OR REPLACE FUNCTION pgbroker._authorize(kind text, queue_name text)
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
    -- A NULL queue: an operation on every queue (pgbroker.prune_inbound_seen's), which no grant covers.
    RAISE EXCEPTION 'permission denied: role "%" has no %access to %',
                    session_user, coalesce(kind || ' ', ''), coalesce('queue "' || queue_name || '"', 'every queue')
        USING ERRCODE = 'insufficient_privilege',
              HINT = CASE WHEN queue_name IS NULL
                     THEN format('Every queue is the broad role''s: GRANT <prefix>_%s TO %I '
                                 '(roles of pgbroker install --roles).', coalesce(kind, 'consumer'), session_user)
                     ELSE format('The schema owner grants it: SELECT pgbroker.grant_queue_access(%L, %L, %L); '
                                 'or: pgbroker grant %s %s --queue %s',
                                 coalesce(kind, 'consumer'), session_user, lower(queue_name),
                                 coalesce(kind, 'consumer'), session_user, lower(queue_name)) END;
END;
$$;

-- The role a grant names, checked: the kind is one of the three, the role
-- exists, pgbroker's roles are installed (without them the entry points run
-- with the caller's own rights and a grant would give nothing), and the role
-- does not already hold the kind on every queue.
CREATE OR REPLACE FUNCTION pgbroker._queue_grantee(kind text, role_name text)
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
CREATE OR REPLACE FUNCTION pgbroker._sync_queue_grantee(grantee regrole)
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
CREATE OR REPLACE FUNCTION pgbroker._forget_dropped_grantees()
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM pgbroker.queue_grant g WHERE NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = g.grantee);
END;
$$;

-- Grant role kind on the queues matching pattern (now and created later);
-- true if the grant is new. Idempotent: granting again repairs the role's
-- privileges.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.grant_queue_access(kind text, role_name text, pattern text)
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
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.revoke_queue_access(kind text, role_name text, pattern text DEFAULT NULL)
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
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.list_queue_grants()
RETURNS TABLE (role_name text, role_kind text, pattern text, granted_at timestamptz)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY SELECT g.grantee::text, g.role_kind, g.pattern, g.granted_at
                 FROM pgbroker.queue_grant g
                 ORDER BY 1, 2, 3;
END;
$$;

-- Grant every scoped role its privileges again, and forget the grants of
-- dropped roles; the installer calls it at every install into an existing
-- database, since an upgrade that drops and creates an entry point again
-- drops its grants.
CREATE OR REPLACE FUNCTION pgbroker._sync_queue_grants()
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
