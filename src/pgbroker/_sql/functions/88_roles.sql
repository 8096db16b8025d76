-- Roles: least-privilege database roles (`pgbroker install --roles`).
--
-- pgbroker.grant_roles(prefix) makes three NOLOGIN group roles,
-- <prefix>_producer, <prefix>_consumer and <prefix>_monitor, and grants each
-- EXECUTE on exactly the entry points listed for it in pgbroker.role_function,
-- and nothing else: no privilege on any table, sequence or other function.
-- Those entry points become SECURITY DEFINER (they run as their owner, the
-- installer) with a fixed search_path. Why functions and not table grants:
--   * a table grant cannot tell an operation from another: sending needs
--     INSERT on the queue table and reading needs UPDATE, but acking needs
--     DELETE, which would also let a consumer purge the queue; a function is
--     the operation itself;
--   * a queue created later needs nothing: no table is ever granted, so there
--     is no per-queue grant to forget, whoever creates the queue (ALTER DEFAULT
--     PRIVILEGES would only cover queues created by the role it names);
--   * the monitor sees lengths and ages through metrics functions and has no
--     way at all to a message column.
-- EXECUTE is revoked from PUBLIC on those entry points: as SECURITY DEFINER
-- they must not be open to every login. The remaining functions keep PUBLIC
-- EXECUTE, and are harmless to a role without table privileges: they run with
-- the caller's rights and fail on the first table they touch.
-- Re-applying the function files redefines every entry point, which resets
-- it to SECURITY INVOKER without its search_path (safe: the roles then lose
-- the operation, they gain nothing); the installer calls grant_roles again
-- for every prefix in pgbroker.role_sets whose roles exist each time it
-- re-applies them, so the roles keep working, and at every install of an
-- existing database it checks that they hold their grants
-- (pgbroker._check_role_sets, below).
--
-- A SECURITY DEFINER entry point trusts nothing of its caller's session
-- (0025; tests/engine/test_security.py):
--   * search_path: fixed, with pg_temp last; the server never looks up
--     functions or operators in pg_temp, and its tables and types come after
--     the engine's schemas; the engine's statements qualify their tables;
--   * prepared statements: never run (pgbroker._statement_call, 50_reads.sql);
--   * settings: the limits are the database's (pgbroker._limit, 30_sends.sql);
--     what else is read is the caller's own business (transaction_isolation,
--     which only makes a read skip the advance of its queue's bounds);
--   * headers: the reserved ones are refused in sends
--     (pgbroker._check_reserved_headers, 32_priorities.sql);
--   * windows and counts: checked (pgbroker._check_prune_args, 86_bridge.sql).

-- The functions (every overload) listed for a role kind; NULL: for any kind.
CREATE OR REPLACE FUNCTION pgbroker._role_procs(kind text)
RETURNS SETOF oid LANGUAGE sql STABLE AS $$
    SELECT p.oid
    FROM pgbroker.role_function rf
    JOIN pg_namespace n ON n.nspname = rf.function_schema
    JOIN pg_proc p ON p.pronamespace = n.oid AND p.proname = rf.function_name
    WHERE kind IS NULL OR rf.role_kind = kind
    ORDER BY p.oid;
$$;

-- Create (or bring up to date) the roles of a prefix with exactly their
-- grants, and record the prefix; returns the number of functions granted to
-- each role.
-- Since: 0.1.0
CREATE OR REPLACE FUNCTION pgbroker.grant_roles(prefix text DEFAULT 'pgbroker')
RETURNS TABLE (role_name text, functions integer) LANGUAGE plpgsql AS $$
DECLARE
    kind text;
    fn regprocedure;
    granted integer;
BEGIN
    PERFORM pgbroker._check_arg(prefix ~ '^[a-z_][a-z0-9_]{0,40}$',
        format('role prefix %L must be a lower-case identifier of at most 41 characters', prefix),
        'The roles are named <prefix>_producer, <prefix>_consumer and <prefix>_monitor.');
    INSERT INTO pgbroker.role_sets (prefix) VALUES (grant_roles.prefix) ON CONFLICT DO NOTHING;

    FOR fn IN SELECT DISTINCT p.oid::regprocedure FROM pgbroker._role_procs(NULL) p(oid) LOOP
        -- pg_temp last: a caller's temporary objects must never shadow ours.
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, pgmq, pgbroker, pg_temp',
                       fn);
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
    END LOOP;

    FOREACH kind IN ARRAY ARRAY['producer', 'consumer', 'monitor'] LOOP
        role_name := prefix || '_' || kind;
        IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = role_name) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
        END IF;
        -- Exactly the listed functions: whatever was granted before is taken back first.
        EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgmq, pgbroker FROM %I', role_name);
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA pgmq, pgbroker FROM %I', role_name);
        EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgmq, pgbroker FROM %I', role_name);
        EXECUTE format('GRANT USAGE ON SCHEMA pgmq, pgbroker TO %I', role_name);
        granted := 0;
        FOR fn IN SELECT p.oid::regprocedure FROM pgbroker._role_procs(kind) p(oid) LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', fn, role_name);
            granted := granted + 1;
        END LOOP;
        functions := granted;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- What the installer checks at every install into an existing database
-- (pgbroker._db.install), for a database restored from a dump above all:
-- roles belong to the server, not to the database, so a dump restored on
-- another server refers to roles that may not exist there, and one restored
-- without privileges (pg_dump or pg_restore --no-acl, or pg_restore's
-- failed grant to a missing role, which takes the REVOKE from PUBLIC of the
-- same function with it) leaves entry points SECURITY DEFINER that PUBLIC
-- may call, and the roles without their grants (docs/operations.md, "Backup,
-- restore and moving a database").
--   * For each prefix in pgbroker.role_sets whose three roles exist,
--     grant_roles runs again when `regrant` (the function files were just
--     re-applied) or when one of them lacks USAGE on the schemas or
--     EXECUTE on one of its functions, or one of those is not SECURITY
--     DEFINER.
--   * A prefix with a missing role is left as it is: creating roles is
--     `pgbroker install --roles`' (it needs CREATEROLE), never a plain
--     install's.
-- Returns each prefix granted again or missing roles, with the names missing.
CREATE OR REPLACE FUNCTION pgbroker._check_role_sets(regrant boolean)
RETURNS TABLE (prefix text, missing_roles text[], regranted boolean) LANGUAGE plpgsql AS $$
DECLARE
    kinds constant text[] := ARRAY['producer', 'consumer', 'monitor'];
BEGIN
    FOR prefix IN SELECT s.prefix FROM pgbroker.role_sets s ORDER BY s.prefix LOOP
        SELECT coalesce(array_agg(_check_role_sets.prefix || '_' || u.k ORDER BY u.o), '{}') INTO missing_roles
        FROM unnest(kinds) WITH ORDINALITY AS u(k, o)
        WHERE to_regrole(_check_role_sets.prefix || '_' || u.k) IS NULL;
        regranted := missing_roles = '{}' AND (regrant OR EXISTS (
            SELECT 1 FROM unnest(kinds) k
            WHERE NOT has_schema_privilege(_check_role_sets.prefix || '_' || k, 'pgmq', 'USAGE')
               OR NOT has_schema_privilege(_check_role_sets.prefix || '_' || k, 'pgbroker', 'USAGE')
               OR EXISTS (SELECT 1 FROM pgbroker._role_procs(k) r(oid) JOIN pg_proc p ON p.oid = r.oid
                          WHERE NOT p.prosecdef
                             OR NOT has_function_privilege(_check_role_sets.prefix || '_' || k, p.oid,
                                                           'EXECUTE'))));
        IF regranted THEN
            PERFORM pgbroker.grant_roles(_check_role_sets.prefix);
        END IF;
        IF regranted OR missing_roles <> '{}' THEN
            RETURN NEXT;
        END IF;
    END LOOP;
END;
$$;

-- No SECURITY DEFINER function of pgmq or pgbroker may be called by PUBLIC
-- (a restore without privileges leaves them so, above): EXECUTE is revoked
-- from PUBLIC on each one that can be; returns how many.
CREATE OR REPLACE FUNCTION pgbroker._revoke_public_definers()
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    fn regprocedure;
    revoked integer := 0;
BEGIN
    FOR fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace IN ('pgmq'::regnamespace, 'pgbroker'::regnamespace) AND p.prosecdef
          AND has_function_privilege('public', p.oid, 'EXECUTE')
        ORDER BY p.oid
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
        revoked := revoked + 1;
    END LOOP;
    RETURN revoked;
END;
$$;

REVOKE EXECUTE ON FUNCTION pgbroker._check_role_sets(boolean), pgbroker._revoke_public_definers() FROM PUBLIC;
